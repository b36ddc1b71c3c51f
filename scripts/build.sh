#!/usr/bin/env bash
# Configures and builds one variant: `cpu` (build/) or `cuda` (build-cuda/, -DDSCPP_CUDA=ON).
# DSCPP_BUILD_DIR names another folder, DSCPP_BUILD_TYPE the CMake build type (default
# RelWithDebInfo; the tests build Check), DSCPP_JOBS the parallel jobs, DSCPP_CXX the compiler.
# The CUDA variant needs a CUDA toolkit with NCCL (/usr/local/cuda on the project's
# machines); it compiles and links anywhere, and runs only where there is a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:-cpu}
jobs=${DSCPP_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache}
# Paths under the checkout are hashed relative to it, so another clone reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
# The precompiled header (cmake/Precompiled.cmake) and the units that use it are cached too.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
compilers=()
# clang++ compiles LibTorch code about twice as fast as g++ on these machines; DSCPP_CXX=g++
# builds with g++ (the GPU machines' compiler, which warns where clang++ does not).
case "${DSCPP_CXX:-}" in
  g++) compilers=(-DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc) ;;
  clang++ | "") if command -v clang++ >/dev/null; then compilers=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang); fi ;;
  *) echo "dscpp build: DSCPP_CXX=${DSCPP_CXX}: expected g++ or clang++" >&2; exit 2 ;;
esac
case "$variant" in
  cpu) dir=${DSCPP_BUILD_DIR:-build}; extra=() ;;
  cuda)
    dir=${DSCPP_BUILD_DIR:-build-cuda}
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    if [ ! -x "$nvcc" ]; then
      echo "dscpp build: no CUDA toolkit (nvcc) found: cannot build the CUDA variant" >&2
      exit 3
    fi
    extra=(-DDSCPP_CUDA=ON -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")") ;;
  *) echo "usage: scripts/build.sh [cpu|cuda]" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=${DSCPP_BUILD_TYPE:-RelWithDebInfo} \
  "${compilers[@]}" "${extra[@]}" ${DSCPP_CMAKE_ARGS:-} >"$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
ninja -C "$dir" -j "$jobs" "${@:2}"  # targets after the variant: only those
