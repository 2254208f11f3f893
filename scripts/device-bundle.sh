#!/usr/bin/env bash
# Builds meshtrain with CUDA here (the GPU machine has no oneDNN, Open MPI, fmt, CLI11, json
# or gtest, and no network) and packs what it needs to run there into .devbundle/:
#
#   .devbundle/meshtrain-bundle.tar.xz   meshtrain, tests/<cuda tests>, lib/<our libraries>,
#                                        mt (runner), env.sh, MANIFEST.txt; all stripped
#   .devbundle/MANIFEST.txt              the same manifest, readable here
#
# Libraries: everything `ldd` resolves that is neither the C/C++ runtime base set (glibc,
# libstdc++, libgcc_s: the device's are newer than Debian 12's) nor a CUDA library (libcuda,
# libcudart, libcublas(Lt), libnccl, ...: those come from the device's CUDA install and
# PyTorch's nvidia-* wheels; env.sh finds them there). Unpack and run on the device with
# scripts/device-run.sh (docs/cuda-device-session.md), or by hand:
#   mkdir -p /tmp/mt && tar xJf .devbundle/meshtrain-bundle.tar.xz -C /tmp/mt
#   /tmp/mt/mt meshtrain --help           (mt sets LD_LIBRARY_PATH, then runs the program)
#
# usage: scripts/device-bundle.sh [--cpu] [--stub-missing] [--no-build] [--build-dir DIR]
#                                 [--out DIR] [TEST...]
#   TEST...      extra test executables to bundle, by name (e.g. gemm_test); the CUDA ones
#                (tests/**/cuda_*_test.cpp, nccl_test, nccl_*_test) are always bundled
#   --cpu        CPU-only build (-DMESHTRAIN_CUDA=OFF, build/bundle-cpu): checks the packing
#                logic on a machine whose CUDA sources do not build yet
#   --stub-missing  when the link fails on mt:: functions that nothing defines yet (kernels
#                still being written), link meshtrain and the tests again (into DIR/stubbed)
#                with a stub for each that prints its name and aborts; MANIFEST.txt and
#                device-run.sh's check list them. The implemented kernels can then be tested.
#   --no-build   pack what the build directory already holds
#   --build-dir  default build/cuda (build/bundle-cpu with --cpu)
#   --out        default .devbundle
# env: MARCH (default x86-64-v3: AVX2 + FMA, no AVX-512; the device's CPU is not this one),
#      CUDA_ARCH (default 90a: H100 / H200), JOBS (default nproc), XZ_LEVEL (default 9)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cpu=0 stub=0 build_flag=1 build_dir="" out=.devbundle extra_tests=()
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=1 ;;
    --no-build) build_flag=0 ;;
    --stub-missing) stub=1 ;;
    --build-dir) build_dir=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "device-bundle: unknown option $1" >&2; exit 2 ;;
    *) extra_tests+=("$1") ;;
  esac
  shift
done
MARCH=${MARCH:-x86-64-v3}
CUDA_ARCH=${CUDA_ARCH:-90a}
JOBS=${JOBS:-$(nproc)}
XZ_LEVEL=${XZ_LEVEL:-9}
if [ -z "$build_dir" ]; then
  if [ "$cpu" = 1 ]; then build_dir=build/bundle-cpu; else build_dir=build/cuda; fi
fi
die() { echo "device-bundle: $*" >&2; exit 1; }

# ---- which executables: meshtrain, the CUDA tests, and the named ones
mapfile -t all_tests < <(find tests -name '*_test.cpp' -printf '%f\n' | sed 's/\.cpp$//' | sort)
tests=()
for t in "${all_tests[@]}"; do
  [[ $t =~ ^(cuda_.*_test|nccl_test|nccl_.*_test)$ ]] && tests+=("$t")
done
for t in "${extra_tests[@]}"; do
  printf '%s\n' "${all_tests[@]}" | grep -qx "$t" ||
    die "no test named $t (tests/**/$t.cpp); known: ${all_tests[*]}"
  printf '%s\n' "${tests[@]}" | grep -qx "$t" || tests+=("$t")
done
echo "device-bundle: meshtrain + ${#tests[@]} test(s): ${tests[*]:-(none yet)}" >&2

# ---- build
if [ "$build_flag" = 1 ]; then
  scripts/setup.sh
  cuda_flags=(-DMESHTRAIN_CUDA=OFF)
  if [ "$cpu" = 0 ]; then
    [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null ||
      die "no nvcc (the CUDA toolkit); use --cpu to check the packing without CUDA"
    cuda_flags=(-DMESHTRAIN_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
  fi
  mkdir -p "$(dirname "$build_dir")"  # a fresh clone has no build/ for the configure log
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DMESHTRAIN_MARCH=$MARCH" \
    "${cuda_flags[@]}" >"$build_dir.configure.log" 2>&1 ||
    { tail -n 30 "$build_dir.configure.log" >&2; die "cmake configure failed ($build_dir.configure.log)"; }
  echo "device-bundle: building in $build_dir (-march=$MARCH$([ "$cpu" = 1 ] || echo ", sm_$CUDA_ARCH"))" >&2
  keep_going=()
  [ "$stub" = 0 ] || keep_going=(-- -k 0)  # every object that compiles, before stubbing
  if ! cmake --build "$build_dir" -j "$JOBS" --target meshtrain "${tests[@]}" "${keep_going[@]}" \
      >"$build_dir.build.log" 2>&1; then
    build_failed=1
  fi
fi
# stub_link: links meshtrain and the tests again into $build_dir/stubbed, each mt:: function
# that their objects use and nothing defines replaced by a stub that names it and aborts.
stubbed_names=""
stub_link() {
  local sdir=$build_dir/stubbed t i=0 s d cmd
  local targets=(meshtrain "${tests[@]}")
  rm -rf "$sdir"
  mkdir -p "$sdir"
  # Each target's objects. A test's objects were not built (a test depends on meshtrain,
  # whose link failed): compile them with ninja's own commands.
  local objs=() o
  mapfile -t objs < <(cd "$build_dir" && ls libmt_*.a && find CMakeFiles/meshtrain.dir -name '*.o')
  for t in "${tests[@]}"; do
    for o in $(ninja -C "$build_dir" -t targets all | sed -n "s@^\(tests/CMakeFiles/$t\.dir/.*\.o\): .*@\1@p"); do
      if [ ! -f "$build_dir/$o" ]; then
        echo "device-bundle: compiling $o" >&2
        (cd "$build_dir" && eval "$(ninja -t commands -s "$o")") >>"$build_dir.build.log" 2>&1 ||
          return 1
      fi
      objs+=("$o")
    done
  done
  local missing
  missing=$(cd "$build_dir" && comm -23 \
    <(nm -u "${objs[@]}" 2>/dev/null | awk '$1 == "U" && $2 ~ /^_ZN2mt/ { print $2 }' | sort -u) \
    <(nm --defined-only "${objs[@]}" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u))
  [ -n "$missing" ] || return 1
  local defs=()
  {
    echo '#include <stdio.h>'
    echo '#include <stdlib.h>'
    echo 'static void fail(const char* s) {'
    # shellcheck disable=SC2028  # the \n is C's
    echo '  fprintf(stderr, "meshtrain: %s is not implemented in this build (a stub of scripts/device-bundle.sh --stub-missing)\n", s);'
    echo '  abort();'
    echo '}'
    for s in $missing; do
      d=$(echo "$s" | c++filt | sed 's/["\\]/\\&/g')
      echo "void mt_stub_$i(void) { fail(\"$d\"); }"
      i=$((i + 1))
    done
  } >"$sdir/stubs.c"
  i=0
  for s in $missing; do defs+=("-Wl,--defsym=$s=mt_stub_$i"); i=$((i + 1)); done
  gcc -c -O1 -o "$sdir/stubs.o" "$sdir/stubs.c" || return 1
  for t in "${targets[@]}"; do
    o=$t
    [ "$t" = meshtrain ] || o=tests/$t
    # the link alone: ": && c++ ... -o OUT ... && :" (a test adds "&& cmake ... gtest discovery")
    cmd=$(ninja -C "$build_dir" -t commands -s "$o" | sed 's/^: && //; s/ && .*$//')
    cmd=$(echo "$cmd" | sed -E "s@ -o [^ ]+ @ -o stubbed/$t $(realpath "$sdir/stubs.o") ${defs[*]} @")
    (cd "$build_dir" && eval "$cmd") >>"$build_dir.build.log" 2>&1 || return 1
  done
  stubbed_names=$(echo "$missing" | c++filt | sed 's/(.*//' | sort -u | tr '\n' ' ')
}
link_only() {  # the build failed on undefined references alone (every object compiled)
  grep -q 'undefined reference' "$build_dir.build.log" &&
    ! grep -v 'ld returned\|undefined reference' "$build_dir.build.log" | grep -q 'error:'
}
if [ "${build_failed:-0}" = 1 ] && [ "$stub" = 1 ] && link_only; then
  stub_link || die "the link with stubs failed too (full log: $build_dir.build.log)"
  echo "device-bundle: linked with $(echo "$stubbed_names" | wc -w) stubs (abort when called): $stubbed_names" >&2
elif [ "${build_failed:-0}" = 1 ]; then
  grep -E 'error' "$build_dir.build.log" | grep -v 'undefined reference' | head -n 25 >&2
  n_undef=$(grep -c 'undefined reference' "$build_dir.build.log")
  if [ "$n_undef" -gt 0 ]; then
    echo "device-bundle: $n_undef undefined references; the symbols:" >&2
    grep -o "undefined reference to .*" "$build_dir.build.log" | sed 's/(.*//' | sort -u |
      head -n 40 | sed 's/^/  /' >&2
    [ "$stub" = 1 ] ||
      echo "device-bundle: --stub-missing packs what is there, with stubs for the rest" >&2
  fi
  die "build failed (full log: $build_dir.build.log); nothing packed"
fi
bins=("$build_dir/meshtrain")
for t in "${tests[@]}"; do bins+=("$build_dir/tests/$t"); done
if [ -n "$stubbed_names" ]; then
  bins=("$build_dir/stubbed/meshtrain")
  for t in "${tests[@]}"; do bins+=("$build_dir/stubbed/$t"); done
fi
for b in "${bins[@]}"; do [ -x "$b" ] || die "missing $b (build it, or drop --no-build)"; done
if [ "$cpu" = 0 ] && ! grep -q 'MESHTRAIN_CUDA:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  die "$build_dir is not a CUDA build (MESHTRAIN_CUDA is not ON in its CMakeCache.txt)"
fi

# ---- stage: build/<dir>.stage (ignored, never carried); only the archive goes to $out
stage=$build_dir.stage
rm -rf "$stage"
mkdir -p "$stage/lib" "$stage/tests"
strip --strip-unneeded -o "$stage/meshtrain" "${bins[0]}"
for b in "${bins[@]:1}"; do strip --strip-unneeded -o "$stage/tests/$(basename "$b")" "$b"; done

# Libraries by soname. Base set: the C and C++ runtime every Linux with Python has (newer
# there than here, and PyTorch's NCCL may need the newer libstdc++: never ship ours).
# CUDA: the device's CUDA 13 install and nvidia-* wheels provide them, matched to its driver.
is_base() {
  [[ $1 =~ ^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libstdc\+\+\.so|libgcc_s\.so) ]]
}
is_cuda() {
  [[ $1 =~ ^lib(cuda|cudart|cublas|cublasLt|nccl|nvidia-|nvrtc|nvJitLink|cudnn|cufft|curand|cusparse|cusolver|cupti|nvToolsExt|nvtx) ]]
}
declare -A shipped=() from_device=() base=()
for b in "${bins[@]}"; do
  # lines: "soname => /path (0x...)", "soname => not found", "/lib64/ld-linux... (0x...)"
  while read -r name arrow path _; do
    [ -n "$name" ] || continue
    if [ "$arrow" != "=>" ]; then base[$(basename "$name")]=1; continue; fi
    if is_cuda "$name"; then from_device[$name]=${path}; continue; fi
    if is_base "$name"; then base[$name]=1; continue; fi
    [ "$path" != not ] || die "$b needs $name, which is not found here"
    shipped[$name]=$path
  done < <(ldd "$b" | sed 's/^[[:space:]]*//')
done
for name in "${!shipped[@]}"; do
  cp -L "${shipped[$name]}" "$stage/lib/$name"
  chmod u+w "$stage/lib/$name"
  strip --strip-unneeded "$stage/lib/$name" 2>/dev/null || true
done

# Every non-base, non-CUDA dependency of every shipped file must resolve inside lib/.
check_closure() {
  local bad=0 f name arrow path
  for f in "$stage/meshtrain" "$stage"/tests/* "$stage"/lib/*; do
    [ -f "$f" ] || continue
    while read -r name arrow path _; do
      [ "$arrow" = "=>" ] || continue
      is_base "$name" && continue
      is_cuda "$name" && continue
      if [ "$path" != "$stage/lib/$name" ]; then
        echo "device-bundle: $(basename "$f") -> $name resolves to $path, not lib/" >&2
        bad=1
      fi
    done < <(env LD_LIBRARY_PATH="$stage/lib" ldd "$f" | sed 's/^[[:space:]]*//')
  done
  return $bad
}
check_closure || die "the bundle's library closure is incomplete"

# The newest glibc / libstdc++ symbol versions the bundle asks for: the device must have them
# (Ubuntu 24.04 there: glibc 2.39, GLIBCXX_3.4.33; Debian 12 here: 2.36, 3.4.30).
need_versions() {
  find "$stage" -type f \( -path '*/tests/*' -o -path '*/lib/*' -o -name meshtrain \) \
    -exec objdump -T {} + 2>/dev/null | grep -o "$1_[0-9.]*" | sort -u -V | tail -n 1 || true
}
glibc_need=$(need_versions GLIBC)
glibcxx_need=$(need_versions GLIBCXX)

cp scripts/device-env.sh "$stage/env.sh"
cat >"$stage/mt" <<'EOF'
#!/bin/sh
# usage: mt PROGRAM [ARGS...]: runs the bundle's PROGRAM (meshtrain, tests/NAME, or any
# command) with the bundle's libraries and the device's CUDA libraries (env.sh).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
[ $# -gt 0 ] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
prog=$1
shift
case $prog in
  */*) [ -x "$prog" ] || prog=$here/$prog ;;
  *) [ ! -x "$here/$prog" ] || prog=$here/$prog ;;
esac
exec "$prog" "$@"
EOF
chmod +x "$stage/mt" "$stage/env.sh"

commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
dirty=""
if git status --porcelain --untracked-files=no 2>/dev/null | grep -q .; then dirty=" (+ uncommitted changes)"; fi
{
  echo "meshtrain device bundle"
  echo "commit: $commit$dirty"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'), $(gcc --version | head -n 1)"
  if [ "$cpu" = 1 ]; then
    echo "cuda: OFF (--cpu packing check: no CUDA code in this bundle)"
  else
    echo "cuda: ON, sm_$CUDA_ARCH, $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'nvcc ?')"
  fi
  echo "march: $MARCH"
  echo "build_dir: $root/$build_dir"
  echo "mt_binary_compiled_in: $root/$build_dir/meshtrain"
  echo "glibc_needed: ${glibc_need:-none}"
  echo "glibcxx_needed: ${glibcxx_need:-none}"
  echo "programs: meshtrain ${tests[*]/#/tests/}"
  echo "stubbed: $stubbed_names"
  echo "shipped_libs: $(printf '%s\n' "${!shipped[@]}" | sort | tr '\n' ' ')"
  echo "from_device: $(printf '%s\n' "${!from_device[@]}" | sort | tr '\n' ' ')"
  echo "base: $(printf '%s\n' "${!base[@]}" | sort | tr '\n' ' ')"
  echo
  echo "sizes (bytes, uncompressed):"
  (cd "$stage" && find . -type f -printf '%s %P\n' | sort -rn)
} >"$stage/MANIFEST.txt"

# ---- compress
mkdir -p "$out"
archive=$out/meshtrain-bundle.tar.xz
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -cf - . |
  xz "-$XZ_LEVEL" -T0 >"$archive.tmp"
mv "$archive.tmp" "$archive"
cp "$stage/MANIFEST.txt" "$out/MANIFEST.txt"
size=$(stat -c %s "$archive")
raw=$(du -sb "$stage" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "device-bundle: $archive: $(mib "$size") MiB ($(mib "$raw") MiB unpacked); libraries:" \
  "$(printf '%s\n' "${!shipped[@]}" | sort | tr '\n' ' ')" >&2
dev_libs=$(printf '%s\n' "${!from_device[@]}" | sort | tr '\n' ' ' | sed 's/^ *//; s/ *$//')
echo "device-bundle: from the device: ${dev_libs:-(none)}; needs glibc ${glibc_need:-?}, ${glibcxx_need:-?}" >&2
if [ "$size" -gt $((40 * 1048576)) ]; then
  echo "device-bundle: WARNING: over the 40 MiB budget (the carry limit is 64 MiB with the tree)" >&2
fi
