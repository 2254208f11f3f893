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
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-numpy   # PyTorch 1.13 (CPU): reference and benchmark peer
  libopenblas0-pthread   # PyTorch's f32 GEMM; without it Debian's reference BLAS runs at a
                         # few GFLOP/s and the benchmark peer is not at its best
)
if [ "${1:-}" = fuzz ]; then
  # clang 14 with libclang_rt.fuzzer / asan / ubsan (libclang-rt-14-dev) and its OpenMP
  packages+=(clang libclang-rt-14-dev libomp-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
