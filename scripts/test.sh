#!/usr/bin/env bash
# Builds both variants (the CUDA one compiles and links; its tests need a GPU) and runs
# every CPU test through ctest, which prints its summary last. Folders: build/ and build-cuda/
# (type Check); scripts/demo.sh keeps to its own build-demo/, so neither rebuilds the other.
set -euo pipefail
cd "$(dirname "$0")/.."
export DSCPP_BUILD_TYPE=${DSCPP_BUILD_TYPE:-Check}
scripts/build.sh cpu
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  # Without a GPU the CUDA variant's own tests cannot run: build the library and tools.
  DSCPP_CMAKE_ARGS="-DDSCPP_BUILD_TESTS=OFF" scripts/build.sh cuda
  ./build-cuda/tools/dscpp_report >/dev/null  # the CUDA build loads and runs without a GPU
else
  echo "dscpp test: no CUDA toolkit on this machine: CUDA variant not built"
fi
cd build
# Matrices that repeat a default test at every size run on request (ctest -L pipe_matrix,
# -L offload_matrix, -L cpu_optim_matrix); their covering sets run here.
ctest --output-on-failure --timeout 600 -j "${DSCPP_TEST_JOBS:-2}" -LE "${DSCPP_TEST_EXCLUDE_LABELS:-_matrix}"
