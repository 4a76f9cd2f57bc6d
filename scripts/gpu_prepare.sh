#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh needs on a GPU machine that has CUDA but none of this project's
# packages, into one folder (default .gpu-bin, ignored by git):
#   scripts/gpu_prepare.sh [DIR]
# DIR gets the GPU test binaries and the benchmark (Release, CUDA on, stripped) and portable.tar.xz
# (scripts/pack_portable.sh: headroom, Postgres 15, Redis and their libraries). Then, on the GPU
# machine, in a copy of this checkout with DIR beside it:
#   HEADROOM_PREBUILT=$PWD/DIR HEADROOM_PORTABLE=$PWD/DIR/portable.tar.xz scripts/gpu_check.sh
# The last line says how large DIR is, and DIR.tar.xz (the same, compressed: what to carry).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${1:-.gpu-bin}
case $dir in /*) ;; *) dir=$root/$dir ;; esac
targets=(kernels_device_test cuda_kernels_test cuda_moe_test cuda_sampling_test cuda_backend_test
         cuda_fixture_models_test cuda_collectives_test cuda_peer_collectives_test
         cuda_parallel_test headroom_gpu_bench headroom_allreduce_bench headroom_flex_bench
         headroom_engine_bench headroom_cuda_load_bench)

scripts/setup.sh >/dev/null
# One Release build with CUDA for both: the test binaries and the packed headroom.
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEADROOM_CUDA=ON >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom "${targets[@]}"
mkdir -p "$dir"
for t in "${targets[@]}"; do strip -o "$dir/$t" "build-release/tests/$t"; done
scripts/pack_portable.sh "$dir/portable.tar.xz"
# The folder as one xz file too: the binaries shrink about fourfold, so that all of them fit what a
# device call carries (unpack there with tar -xJf, or Python's tarfile where there is no xz).
tar -C "$(dirname "$dir")" -cJf "$dir.tar.xz" "$(basename "$dir")"
echo "gpu_prepare: $(du -sh "$dir" | cut -f1) in $dir, $(du -sh "$dir.tar.xz" | cut -f1) in $dir.tar.xz"
