# meshtrain: the two commands a new user needs are `make demo` and `make test`.
BUILD ?= build/release
JOBS ?= $(shell nproc)
MESHTRAIN_WERROR ?= OFF
CMAKE_FLAGS ?=
MT := $(BUILD)/meshtrain
FUZZ_SECONDS ?= 20
DEMO_TEXT := $(wildcard /usr/share/common-licenses/*)

.PHONY: all setup configure build test demo bench sanitize fuzz format clean

all: build

setup:
	@scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DMESHTRAIN_WERROR=$(MESHTRAIN_WERROR) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The whole suite through CTest: a test takes 2 of the 2 x JOBS + 1 slots, a multihost test
# (mostly waiting, one at a time) the one left over (tests/CMakeLists.txt).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $$((2 * $(JOBS) + 1)) --timeout 900

# Byte-level text assembled from the licence texts every Debian system ships
# (/usr/share/common-licenses, package base-files): no download needed.
data/demo.bin: | build
	@mkdir -p $(@D)
	$(MT) prepare $(DEMO_TEXT) -o $@

# A larger corpus (about 6 M byte tokens): the text files under /usr/share/doc
# (scripts/doc-corpus.sh; what DiLoCo's quality benchmark trains on).
data/docs.bin: | build
	scripts/doc-corpus.sh $(MT) $@

# Trains the byte-level tiny model, writes its report (docs/report.md) and ends with text the
# model writes (meshtrain sample, from the weights the run exported).
DEMO_OUT := build/demo
demo: build data/demo.bin
	@mkdir -p $(DEMO_OUT)
	$(MT) train --model tiny --data data/demo.bin --steps 300 --lr 2e-3 --eval-every 50 \
	  --metrics $(DEMO_OUT)/metrics.jsonl --export $(DEMO_OUT)/model
	$(MT) report $(DEMO_OUT)/metrics.jsonl --label demo -o $(DEMO_OUT)/report.html
	@echo "--- a sample of the model it trained (temperature 0.8, top-k 40):"
	@$(MT) sample --weights $(DEMO_OUT)/model --prompt "The " --tokens 120 --temperature 0.8 \
	  --top-k 40 --seed 1
	@echo "--- its report: $(abspath $(DEMO_OUT))/report.html"

bench: build
	bench/run-all.sh $(BUILD)

# Address + undefined-behaviour and thread sanitizers, each in its own build tree, of the
# CPU code (the CUDA code has compute-sanitizer on a GPU machine: docs/cuda.md).
sanitize: setup
	cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMESHTRAIN_SANITIZE=address -DMESHTRAIN_CUDA=OFF >/dev/null
	cmake --build build/asan -j $(JOBS)
	# detect_stack_use_after_return: a block freed into a tracker whose stack frame has
	# returned (the world group outlives fn) is found only with it. The mpi and fault tests
	# run mpirun, whose Open MPI leaves allocations at exit that LeakSanitizer cannot name.
	cd build/asan && ASAN_OPTIONS=detect_stack_use_after_return=1 \
	  ctest --output-on-failure -j $$((2 * $(JOBS))) -L unit
	cd build/asan && ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=1 \
	  ctest --output-on-failure -j $$((2 * $(JOBS))) -L "mpi|fault"
	cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMESHTRAIN_SANITIZE=thread -DMESHTRAIN_CUDA=OFF >/dev/null
	cmake --build build/tsan -j $(JOBS)
	# libgomp is not built with TSan: its barriers are invisible and every OpenMP region
	# would report races. One OpenMP thread per task leaves TSan our own threads (ranks,
	# communication, overlap) to check; tests/tsan.supp names the other uninstrumented
	# libraries (Open MPI, oneDNN).
	cd build/tsan && OMP_THREAD_LIMIT=1 TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp history_size=7" \
	  ctest --output-on-failure -j $$((2 * $(JOBS))) -L unit
	# Each reader of outside files under libFuzzer for FUZZ_SECONDS (clang; docs/fuzzing.md).
	scripts/fuzz.sh all $(FUZZ_SECONDS)

# The fuzz harnesses, FUZZ_SECONDS each: make fuzz READER=safetensors FUZZ_SECONDS=600 runs
# one; prints executions per second and coverage (docs/fuzzing.md).
READER ?= all
fuzz:
	scripts/fuzz.sh $(READER) $(FUZZ_SECONDS)

format:
	find src tests bench -name '*.h' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf build
