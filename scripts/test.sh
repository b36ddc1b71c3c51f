#!/usr/bin/env bash
# The test suite, the README's second command (after scripts/install.sh); CI runs it on a
# fresh clone. Builds the CPU variant (build/, type Check) and runs its default tier through
# ctest; builds the CUDA variant with g++ (build-cuda/: the library, tools and benchmarks
# compile and link; its tests need a GPU), so that the GPU machines' compiler sees the code
# before they do. Ends with the time of each part, then ctest's summary.
# docs/testing.md lists the tiers. Environment: DSCPP_TEST_JOBS (ctest's jobs, default 2),
# DSCPP_TEST_EXCLUDE_LABELS (a regular expression of the labels left out; default: the
# matrices, `_matrix$`), DSCPP_INSTALL_S (the install's seconds, for the closing times).
set -euo pipefail
cd "$(dirname "$0")/.."
export DSCPP_BUILD_TYPE=${DSCPP_BUILD_TYPE:-Check}
start=$SECONDS
scripts/build.sh cpu
cpu_s=$((SECONDS - start))
cuda_s=-
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  t=$SECONDS
  DSCPP_CXX=g++ DSCPP_CMAKE_ARGS="-DDSCPP_BUILD_TESTS=OFF" scripts/build.sh cuda
  ./build-cuda/tools/dscpp_report >/dev/null # the CUDA build loads and runs without a GPU
  cuda_s=$((SECONDS - t))
else
  echo "dscpp test: no CUDA toolkit on this machine: CUDA variant not built"
fi
cd build
exclude=${DSCPP_TEST_EXCLUDE_LABELS:-_matrix\$}
left_out=$(ctest --print-labels | sed -n 's/^  //p' | grep -E "$exclude" | tr '\n' ' ' || true)
echo "dscpp test: labels left out (run one with: cd build && ctest -L LABEL): ${left_out:-none}"
t=$SECONDS
status=0
ctest --output-on-failure --timeout 600 -j "${DSCPP_TEST_JOBS:-2}" -LE "$exclude" 2>&1 |
  tee ctest.log || status=$?
test_s=$((SECONDS - t))
echo
echo "dscpp test: times: install ${DSCPP_INSTALL_S:--} s, CPU build ${cpu_s} s," \
  "CUDA build (g++) ${cuda_s} s, tests ${test_s} s"
echo "dscpp test: slowest tests (s):"
# ctest's lines: "  n/N Test  #k: name ....   Passed   12.34 sec"
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' ctest.log |
  sort -rn | awk 'NR <= 10 { print "  " $0 }'
# ctest's own summary stays the last lines of the run.
grep -E "tests passed|tests failed out of|Total Test time" ctest.log | tail -2 || true
exit "$status"
