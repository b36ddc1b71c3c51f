#!/usr/bin/env bash
# The README's two commands, scripts/test.sh and scripts/demo.sh, and their build folders:
# test.sh builds the whole CPU variant (type Check) with g++ in build-test/, as a unity build
# (the only one), and runs ctest there; the demo builds only its three targets in build/ with
# the default compiler (clang++ where there is one: twice as fast on LibTorch code); neither
# reconfigures the other's folder (a folder's compiler cannot change without a rebuild); test.sh
# builds the fuzzers' harnesses alone with clang++ in build-fuzz/ and runs their ctest there.
# DSCPP_TEST_VARIANT=cuda builds the CUDA variant in build-cuda/ instead. Runs both scripts in a
# copy of scripts/ whose build.sh records the variant, folder, compiler, type, CMake arguments
# and targets each asks for (and ctest, the tools and the launcher are stubs), in either order,
# for each variant.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tree/scripts" "$tmp/bin" "$tmp/tree/runs/corpus" "$tmp/tree/tests/fuzz"
touch "$tmp/tree/tests/fuzz/zip.cmake" "$tmp/tree/tests/fuzz/config.cmake"
cp "$src/scripts/test.sh" "$src/scripts/demo.sh" "$tmp/tree/scripts/"
touch "$tmp/tree/runs/corpus/fortunes_text_document.idx"
cat >"$tmp/tree/scripts/build.sh" <<'STUB'
#!/usr/bin/env bash
variant=$1
case "$variant" in cpu) dir=${DSCPP_BUILD_DIR:-build} ;; cuda) dir=${DSCPP_BUILD_DIR:-build-cuda} ;; esac
args=$(echo ${DSCPP_CMAKE_ARGS:-})
echo "$variant $dir ${DSCPP_CXX:-default} ${DSCPP_BUILD_TYPE:-RelWithDebInfo}${args:+ $args}${2:+ ${*:2}}" >>"$(dirname "$0")/../builds.log"
mkdir -p "$dir/launcher" "$dir/tools"
printf '#!/bin/sh\necho launched "$@"\n' >"$dir/launcher/dscpp"
printf '#!/bin/sh\ntrue\n' >"$dir/tools/dscpp_report"
chmod +x "$dir/launcher/dscpp" "$dir/tools/dscpp_report"
STUB
chmod +x "$tmp/tree/scripts/build.sh"
printf '#!/bin/sh\necho "ctest in $(basename "$PWD")" >>../builds.log\n' >"$tmp/bin/ctest"
# No GPU here: demo.sh picks the CPU variant (nvidia-smi fails).
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/nvidia-smi"
printf '#!/bin/sh\ntrue\n' >"$tmp/bin/clang++"
chmod +x "$tmp/bin/ctest" "$tmp/bin/nvidia-smi" "$tmp/bin/clang++"
export PATH="$tmp/bin:$PATH"
unset DSCPP_BUILD_TYPE DSCPP_BUILD_DIR DSCPP_CXX DSCPP_CMAKE_ARGS
cd "$tmp/tree"
want_demo="cpu build default Check train_gpt preprocess_data dscpp_launcher"
want_fuzz="cpu build-fuzz clang++ Check fuzz_config fuzz_zip"
for variant in cpu cuda; do
  case "$variant" in
    cpu) want_test="cpu build-test g++ Check -DDSCPP_UNITY_BUILD=ON" want_ctest="ctest in build-test" ;;
    cuda) want_test="cuda build-cuda g++ Check" want_ctest="ctest in build-cuda" ;;
  esac
  for order in "test demo" "demo test"; do
    rm -f builds.log
    for s in $order; do DSCPP_TEST_VARIANT=$variant "./scripts/$s.sh" >/dev/null; done
    if ! grep -qx "$want_test" builds.log || ! grep -qx "$want_demo" builds.log ||
       ! grep -qx "$want_fuzz" builds.log || [ "$(grep -vc "^ctest" builds.log)" -ne 3 ] ||
       ! grep -qx "$want_ctest" builds.log || ! grep -qx "ctest in build-fuzz" builds.log; then
      echo "FAIL ($variant, $order): builds asked for:"; cat builds.log; exit 1
    fi
  done
done
echo "PASS: test.sh builds build-test/ (CPU variant, g++, Check, unity), or build-cuda/ for the CUDA" \
  "variant, and runs ctest there, and the fuzzers with clang++ in build-fuzz/; demo.sh builds" \
  "its three targets in build/; in either order"
