#!/usr/bin/env bash
# The README's two commands, scripts/test.sh and scripts/demo.sh, and their build folders. On a
# machine without a CUDA toolkit both use build/ (type Check): the demo asks only for what it
# runs, and whichever runs second builds only what the first left out, never reconfiguring the
# other's folder. With a toolkit, test.sh builds the CUDA variant in build-cuda/ (Check) and runs
# ctest there, and the demo still builds its three targets in build/. Runs both scripts in a
# copy of scripts/ whose build.sh records the folder, type and targets each asks for (and
# ctest, the tools and the launcher are stubs), in either order, for each variant.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tree/scripts" "$tmp/bin" "$tmp/tree/runs/corpus"
cp "$src/scripts/test.sh" "$src/scripts/demo.sh" "$tmp/tree/scripts/"
touch "$tmp/tree/runs/corpus/fortunes_text_document.idx"
cat >"$tmp/tree/scripts/build.sh" <<'STUB'
#!/usr/bin/env bash
variant=$1
case "$variant" in cpu) dir=${DSCPP_BUILD_DIR:-build} ;; cuda) dir=${DSCPP_BUILD_DIR:-build-cuda} ;; esac
echo "$variant $dir ${DSCPP_BUILD_TYPE:-RelWithDebInfo}${2:+ ${*:2}}" >>"$(dirname "$0")/../builds.log"
mkdir -p "$dir/launcher" "$dir/tools"
printf '#!/bin/sh\necho launched "$@"\n' >"$dir/launcher/dscpp"
printf '#!/bin/sh\ntrue\n' >"$dir/tools/dscpp_report"
chmod +x "$dir/launcher/dscpp" "$dir/tools/dscpp_report"
STUB
chmod +x "$tmp/tree/scripts/build.sh"
printf '#!/bin/sh\necho "ctest in $(basename "$PWD")" >>../builds.log\n' >"$tmp/bin/ctest"
# No GPU here: demo.sh picks the CPU variant (nvidia-smi fails).
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/ctest" "$tmp/bin/nvidia-smi"
export PATH="$tmp/bin:$PATH"
unset DSCPP_BUILD_TYPE DSCPP_BUILD_DIR
cd "$tmp/tree"
want_demo="cpu build Check train_gpt preprocess_data dscpp_launcher"
for variant in cpu cuda; do
  for order in "test demo" "demo test"; do
    rm -f builds.log
    for s in $order; do DSCPP_TEST_VARIANT=$variant "./scripts/$s.sh" >/dev/null; done
    if [ "$variant" = cpu ]; then
      cpu=$(grep '^cpu ' builds.log)
      if ! grep -qx "cpu build Check" <<<"$cpu" || ! grep -qx "$want_demo" <<<"$cpu" ||
         [ "$(wc -l <<<"$cpu")" -ne 2 ] || ! grep -qx "ctest in build" builds.log ||
         grep -q '^cuda ' builds.log; then
        echo "FAIL ($variant, $order): builds asked for:"; cat builds.log; exit 1
      fi
    elif ! grep -qx "cuda build-cuda Check" builds.log || ! grep -qx "$want_demo" builds.log ||
         [ "$(grep -c '^cuda ' builds.log)" -ne 1 ] || [ "$(grep -c '^cpu ' builds.log)" -ne 1 ] ||
         ! grep -qx "ctest in build-cuda" builds.log; then
      echo "FAIL ($variant, $order): builds asked for:"; cat builds.log; exit 1
    fi
  done
done
echo "PASS: test.sh builds build/ (Check) and shares it with demo.sh's three targets, or builds" \
  "build-cuda/ (Check) for the CUDA variant; in either order"
