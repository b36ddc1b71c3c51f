#!/usr/bin/env bash
# The test suite, the README's second command (after scripts/install.sh); CI runs it on a
# fresh clone. Builds one variant (type Check) and runs its default tier through ctest: where
# a CUDA toolkit is present, the CUDA variant with g++ (build-cuda/), the GPU machines'
# compiler, so that its warnings fail here before they do there, and its tests run on the CPU
# (those that need a GPU skip); without one, the CPU variant (build/). One build, not a CPU
# build beside a CUDA one: the CUDA variant compiles everything the CPU one does. Ends with
# the time of each part, then ctest's summary.
# docs/testing.md lists the tiers. Environment: DSCPP_TEST_JOBS (ctest's jobs, default 2),
# DSCPP_TEST_EXCLUDE_LABELS (a regular expression of the labels left out; default: the
# matrices, `_matrix$`), DSCPP_TEST_VARIANT (cpu or cuda: the variant, instead of the
# toolkit's presence), DSCPP_INSTALL_S (the install's seconds, for the closing times).
set -euo pipefail
cd "$(dirname "$0")/.."
export DSCPP_BUILD_TYPE=${DSCPP_BUILD_TYPE:-Check}
variant=${DSCPP_TEST_VARIANT:-}
if [ -z "$variant" ]; then
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then variant=cuda; else variant=cpu; fi
fi
start=$SECONDS
case "$variant" in
  cuda)
    DSCPP_CXX=g++ scripts/build.sh cuda
    ./build-cuda/tools/dscpp_report >/dev/null # the CUDA build loads and runs without a GPU
    dir=build-cuda what="CUDA variant, g++" ;;
  cpu)
    echo "dscpp test: no CUDA toolkit on this machine: the CPU variant"
    scripts/build.sh cpu
    dir=build what="CPU variant" ;;
  *) echo "dscpp test: DSCPP_TEST_VARIANT=$variant: expected cpu or cuda" >&2; exit 2 ;;
esac
build_s=$((SECONDS - start))
cd "$dir"
exclude=${DSCPP_TEST_EXCLUDE_LABELS:-_matrix\$}
left_out=$(ctest --print-labels | sed -n 's/^  //p' | grep -E "$exclude" | tr '\n' ' ' || true)
echo "dscpp test: labels left out (run one with: cd $dir && ctest -L LABEL): ${left_out:-none}"
t=$SECONDS
status=0
ctest --output-on-failure --timeout 600 -j "${DSCPP_TEST_JOBS:-2}" -LE "$exclude" 2>&1 |
  tee ctest.log || status=$?
test_s=$((SECONDS - t))
echo
echo "dscpp test: times: install ${DSCPP_INSTALL_S:--} s, build ($what) ${build_s} s," \
  "tests ${test_s} s"
echo "dscpp test: slowest tests (s):"
# ctest's lines: "  n/N Test  #k: name ....   Passed   12.34 sec"
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' ctest.log |
  sort -rn | awk 'NR <= 10 { print "  " $0 }'
# ctest's own summary stays the last lines of the run.
grep -E "tests passed|tests failed out of|Total Test time" ctest.log | tail -2 || true
exit "$status"
