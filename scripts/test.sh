#!/usr/bin/env bash
# The test suite, the README's second command (after scripts/install.sh); CI runs it on a
# fresh clone. Builds the CPU variant (type Check) with g++, the GPU machines' compiler, so that
# its warnings fail here before they fail a GPU call, in build-test/ (the demo's clang++ build
# in build/ stays as it is), and runs the default tier through ctest. The CUDA variant's own
# code (the kernels, the GPU paths) is built with g++ and warnings as errors by the GPU suite
# (scripts/gpu_rows.py suite): its test processes load LibTorch's CUDA libraries, which cost
# every process a third of a second more without a GPU (docs/perf-log/2026-12-07.md D).
# The fuzzers (tests/fuzz: libFuzzer with ASan and UBSan) need clang++: their harnesses alone
# are built with it in build-fuzz/ and run after the suite (label fuzz), where clang++ and
# libFuzzer are (scripts/install.sh installs both).
# Ends with the time of each part, then ctest's summary.
# docs/testing.md lists the tiers. Environment: DSCPP_TEST_JOBS (ctest's jobs, default 4: the
# tests wait on their ranks and files as much as they compute), DSCPP_TEST_EXCLUDE_LABELS (a
# regular expression of the labels left out; default: the matrices, `_matrix$`),
# DSCPP_TEST_VARIANT (cpu, the default, or cuda: the CUDA variant in build-cuda/, where a CUDA
# toolkit is), DSCPP_INSTALL_S (the install's seconds, for the closing times).
set -euo pipefail
cd "$(dirname "$0")/.."
export DSCPP_BUILD_TYPE=${DSCPP_BUILD_TYPE:-Check}
variant=${DSCPP_TEST_VARIANT:-cpu}
start=$SECONDS
case "$variant" in
  cpu)
    # A unity build (cmake/Unity.cmake): each target's units compiled in batches, which cuts
    # the build's compile time; every other build compiles them one by one, so that a unit that
    # misses an include still fails there.
    DSCPP_CXX=g++ DSCPP_BUILD_DIR=${DSCPP_BUILD_DIR:-build-test} \
      DSCPP_CMAKE_ARGS="-DDSCPP_UNITY_BUILD=ON ${DSCPP_CMAKE_ARGS:-}" scripts/build.sh cpu
    dir=${DSCPP_BUILD_DIR:-build-test} what="CPU variant, g++, unity build" ;;
  cuda)
    DSCPP_CXX=g++ scripts/build.sh cuda
    ./build-cuda/tools/dscpp_report >/dev/null # the CUDA build loads and runs without a GPU
    dir=build-cuda what="CUDA variant, g++" ;;
  *) echo "dscpp test: DSCPP_TEST_VARIANT=$variant: expected cpu or cuda" >&2; exit 2 ;;
esac
build_s=$((SECONDS - start))
root=$PWD
cd "$dir"
# ctest starts the longest tests first when it knows their times. A fresh clone's build knows
# none: an earlier run's times (tests/ctest_costs.txt; refresh it from a build's
# Testing/Temporary/CTestCostData.txt) seed them, so that the run does not end on one long test
# that started last. Later runs in the same build use their own.
seed=$root/tests/ctest_costs.txt
if [ ! -f Testing/Temporary/CTestCostData.txt ] && [ -f "$seed" ]; then
  mkdir -p Testing/Temporary && cp "$seed" Testing/Temporary/CTestCostData.txt
fi
exclude=${DSCPP_TEST_EXCLUDE_LABELS:-_matrix\$}
left_out=$(ctest --print-labels | sed -n 's/^  //p' | grep -E "$exclude" | tr '\n' ' ' || true)
echo "dscpp test: labels left out (run one with: cd $dir && ctest -L LABEL): ${left_out:-none}"
t=$SECONDS
status=0
ctest --output-on-failure --timeout 600 -j "${DSCPP_TEST_JOBS:-4}" -LE "$exclude" 2>&1 |
  tee ctest.log || status=$?
test_s=$((SECONDS - t))
cd "$root"
t=$SECONDS
fuzz="not built (no clang++)"
read -r -a harnesses <<<"$(find tests/fuzz -maxdepth 1 -name '*.cmake' 2>/dev/null |
  sed 's|.*/\(.*\)\.cmake$|fuzz_\1|' | sort | tr '\n' ' ')"
if command -v clang++ >/dev/null && [ "${#harnesses[@]}" -gt 0 ]; then
  if DSCPP_CXX=clang++ DSCPP_BUILD_DIR=build-fuzz scripts/build.sh cpu "${harnesses[@]}" \
    >build-fuzz.log 2>&1; then
    (cd build-fuzz && ctest --output-on-failure -j 2 -L '^fuzz$' 2>&1 | tee ctest.log) || status=1
    fuzz="$((SECONDS - t)) s"
  elif cat build-fuzz*.log | grep -q "tests/fuzz not built"; then
    fuzz="not built ($(cat build-fuzz*.log | grep -o "no libFuzzer[^;]*" | head -1))"
  else
    tail -30 build-fuzz.log
    status=1
    fuzz="their build failed (build-fuzz.log)"
  fi
fi
cd "$dir"
echo
echo "dscpp test: times: install ${DSCPP_INSTALL_S:--} s, build ($what) ${build_s} s," \
  "tests ${test_s} s, fuzzers (clang++ build and runs) ${fuzz}"
echo "dscpp test: slowest tests (s):"
# ctest's lines: "  n/N Test  #k: name ....   Passed   12.34 sec"
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' ctest.log |
  sort -rn | awk 'NR <= 10 { print "  " $0 }'
[ -f build-fuzz/ctest.log ] || [ ! -d "$root/build-fuzz" ] ||
  echo "dscpp test: fuzzers: $(grep -E "tests passed|tests failed out of" "$root/build-fuzz/ctest.log" | tail -1)"
# ctest's own summary stays the last lines of the run.
grep -E "tests passed|tests failed out of|Total Test time" ctest.log | tail -2 || true
exit "$status"
