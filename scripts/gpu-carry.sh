#!/usr/bin/env bash
# Run HERE, before a GPU check: builds the CUDA parts of ptdp for Hopper (sm_90) in build-gpu/ and
# gathers what the lent GPU machine needs to run them into .gpu-carry/ (git-ignored), so that
# scripts/gpu-check.sh spends the lease measuring, not compiling:
#
#   .gpu-carry/build/   ptdp, lib/ptdp/libptdp_cuda.so, share/ptdp (configs, data), the GPU test
#                       binaries, gemm_bench and comm_bench, and a stand-in CMakeCache.txt (the
#                       tests find their build folder by it: tests/fakes/test_paths.h)
#   .gpu-carry/lib/     the shared libraries they link that a CUDA image may lack (yaml-cpp,
#                       Google Test/Benchmark); not the CUDA libraries, which the machine has
#   .gpu-carry/MANIFEST commit, toolkit, sizes
#
# Then: device run with carry [".gpu-carry"] (and ".gpu-deps" for the build fallback, from
# scripts/gpu-deps.sh) and the command `bash scripts/gpu-check.sh`. Binaries hold no path of this
# checkout (issue 17; tests/cli/standalone_test.cc checks), so they run from the device's copy.
# MPI is left out: the device image has no MPI library for the module to load, and one GPU needs
# none. Built with the same CUDA 13.0 as the device machines (KINDS.md); glibc here (2.36) is
# older than theirs, so the binaries load there; gpu-check.sh builds there when they do not.
set -euo pipefail
cd "$(dirname "$0")/.."
build="build-gpu"
carry=".gpu-carry"
jobs=$(nproc)
targets=(ptdp ptdp_cuda cuda_check_test cuda_backend_test cuda_gpt_test device_world_test
         nccl_world_test cuda_trainer_test calibrate_cuda_test gemm_bench comm_bench)
gen=""; command -v ninja > /dev/null && gen="-G Ninja"
# sm_90 machine code only (90-real: no PTX to JIT-compile): the lent machines are H100s and
# H200s, and the PTX of every kernel in every binary took 6 of the carry's 47 MiB (2026-12-06).
# shellcheck disable=SC2086  # gen is one or two words
cmake -S . -B "$build" $gen -DCMAKE_BUILD_TYPE=Release -DPTDP_CUDA=ON -DPTDP_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target "${targets[@]}" ptdp_share

rm -rf "$carry"
mkdir -p "$carry/build/lib/ptdp" "$carry/build/tests" "$carry/build/bench" "$carry/lib"
cp "$build/ptdp" "$carry/build/"
cp "$build/lib/ptdp/libptdp_cuda.so" "$carry/build/lib/ptdp/"
cp -r "$build/share" "$carry/build/"
for t in cuda_check_test cuda_backend_test cuda_gpt_test device_world_test nccl_world_test \
         cuda_trainer_test; do
  cp "$build/tests/runtime/cuda/$t" "$carry/build/tests/"
done
cp "$build/tests/cli/calibrate_cuda_test" "$carry/build/tests/"
cp "$build/bench/gemm_bench" "$build/bench/comm_bench" "$carry/build/bench/"
echo "# stand-in for the build folder's cache: the tests find their build folder by this file" \
  > "$carry/build/CMakeCache.txt"
strip --strip-unneeded "$carry"/build/ptdp "$carry"/build/lib/ptdp/*.so "$carry"/build/tests/* \
  "$carry"/build/bench/* 2> /dev/null || true
# Shared libraries outside glibc, the compiler runtime and CUDA's own (cudart, cuBLAS, NCCL).
for f in "$carry"/build/ptdp "$carry"/build/lib/ptdp/*.so "$carry"/build/tests/* "$carry"/build/bench/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux)[.-]' \
  | grep -vE '/usr/local/cuda|libcu|libnccl|libnvidia' | while read -r lib; do
  cp -L "$lib" "$carry/lib/"
done
{
  echo "commit $(git rev-parse --short HEAD) $(git diff --quiet || echo '(with local changes)')"
  echo "built $(date -u +%FT%TZ) on $(uname -n), $(nvcc --version | tail -1)"
  echo "glibc $(ldd --version | head -1 | awk '{print $NF}')"
  du -sh "$carry/build" "$carry/lib"
  ls "$carry/lib"
} > "$carry/MANIFEST"
cat "$carry/MANIFEST"
total=$(du -sm "$carry" | cut -f1)
if [ "$total" -gt 48 ]; then
  echo "gpu-carry: $carry is $total MiB; the device run carries 64 MiB with the working tree" >&2
  exit 1
fi
