#!/usr/bin/env bash
# Installs every Debian package that building, running, testing and benchmarking meshtrain
# need. Idempotent: when everything is present it only checks and returns in about a second.
# `scripts/setup.sh fuzz` adds clang with its libFuzzer and sanitizer runtimes and OpenMP
# (the fuzz harnesses, docs/fuzzing.md).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev            # oneDNN: GEMM (f32 and bf16) on the CPU
  ocl-icd-opencl-dev     # Debian's dnnl-config.cmake requires OpenCL (only Recommended)
  libopenmpi-dev openmpi-bin
  iproute2               # ip and tc: the namespace hosts of scripts/hosts.sh (multihost tests)
  nlohmann-json3-dev libcli11-dev libfmt-dev
  protobuf-compiler libprotobuf-dev   # protoc + libprotobuf-lite: TensorBoard event records
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-numpy   # PyTorch 1.13 (CPU): reference and benchmark peer
  libopenblas0-pthread   # PyTorch's f32 GEMM; without it Debian's reference BLAS runs at a
                         # few GFLOP/s and the benchmark peer is not at its best
  libopenblas-pthread-dev   # cblas.h and -lopenblas: bench/gemm-vs-openblas's peer
)
if [ "${1:-}" = fuzz ]; then
  # clang 14 with libclang_rt.fuzzer / asan / ubsan (libclang-rt-14-dev) and its OpenMP
  packages+=(clang libclang-rt-14-dev libomp-dev)
fi

# Optional: the report's browser test renders pages in Debian's Chromium (skipped with a
# message without it), and npm fetches a new uPlot version (third_party/uplot/fetch.sh; the
# committed files need no npm). Installed when possible; a failure only warns.
# A failed try is remembered (this file), so that every `make` does not try again: delete it
# to retry.
optional_tried="${XDG_CACHE_HOME:-$HOME/.cache}/meshtrain/setup-optional-failed"
optional=(chromium:chromium fc-list:fonts-dejavu-core npm:npm)  # command:package
optional_missing=()
[ -e "$optional_tried" ] && optional=()
for c in "${optional[@]}"; do
  command -v "${c%%:*}" >/dev/null 2>&1 || optional_missing+=("${c#*:}")
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ] && [ ${#optional_missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#optional_missing[@]} -gt 0 ]; then
  echo "setup: installing ${optional_missing[*]} (optional)" >&2
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${optional_missing[@]}" >/dev/null; then
    echo "setup: could not install ${optional_missing[*]} (optional: without chromium the" \
         "report's browser test is skipped; delete $optional_tried to try again)" >&2
    mkdir -p "$(dirname "$optional_tried")" && touch "$optional_tried"
  fi
fi
