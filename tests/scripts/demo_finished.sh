#!/usr/bin/env bash
# Scripts/demo.sh run again after a finished run says that nothing was trained and
# which DEMO_ITERS trains further. Runs demo.sh in a copy of scripts/ whose build.sh makes a
# stub launcher printing train_gpt's finished line (its wording is examples.TrainGptFlags'),
# and one that trains (no such line: the demo adds nothing).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tree/scripts" "$tmp/bin" "$tmp/tree/runs/corpus"
cp "$src/scripts/demo.sh" "$tmp/tree/scripts/"
touch "$tmp/tree/runs/corpus/fortunes_text_document.idx"
cat >"$tmp/tree/scripts/build.sh" <<'STUB'
#!/usr/bin/env bash
dir=${DSCPP_BUILD_DIR:-build}
mkdir -p "$dir/launcher"
cat >"$dir/launcher/dscpp" <<'LAUNCHER'
#!/usr/bin/env bash
iters=0; while [ $# -gt 0 ]; do [ "$1" = --train-iters ] && iters=$2; shift; done
if [ "${STUB_CHECKPOINT_STEP:-0}" -ge "$iters" ]; then
  echo "[train_gpt] resumed from runs/checkpoints/global_step$STUB_CHECKPOINT_STEP at step $STUB_CHECKPOINT_STEP"
  echo "[train_gpt] finished: the checkpoint is at step $STUB_CHECKPOINT_STEP and --train-iters is $iters, so" \
    "there is nothing left to train. To train further, raise --train-iters (e.g. --train-iters" \
    "$((STUB_CHECKPOINT_STEP + iters))); the LR schedule ends at total_num_steps=150 too"
else
  echo "[train_gpt] step $iters/$iters | loss 4.0" >&2  # to stderr: the demo's log keeps both
fi
exit "${STUB_EXIT:-0}"
LAUNCHER
chmod +x "$dir/launcher/dscpp"
STUB
chmod +x "$tmp/tree/scripts/build.sh"
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
export PATH="$tmp/bin:$PATH"
unset DSCPP_BUILD_TYPE DSCPP_BUILD_DIR DEMO_ITERS
cd "$tmp/tree"
fail() { echo "FAIL: $1"; echo "--- output:"; cat out.txt; exit 1; }

STUB_CHECKPOINT_STEP=150 ./scripts/demo.sh >out.txt 2>&1 || fail "the finished demo exited non-zero"
grep -q "^demo: nothing was trained: runs/checkpoints is at step 150 and DEMO_ITERS is 150\. To train further: DEMO_ITERS=300 scripts/demo.sh" out.txt ||
  fail "the finished run (150 of 150) does not say so and how to go on"
grep -q "there is nothing left to train" runs/train.log || fail "runs/train.log lacks train_gpt's line"

STUB_CHECKPOINT_STEP=200 DEMO_ITERS=100 ./scripts/demo.sh >out.txt 2>&1 || fail "exit status"
grep -q "is at step 200 and DEMO_ITERS is 100\. To train further: DEMO_ITERS=300 " out.txt ||
  fail "a checkpoint past DEMO_ITERS (200 > 100): the advice must count from the checkpoint"

STUB_CHECKPOINT_STEP=0 ./scripts/demo.sh >out.txt 2>&1 || fail "a training run exited non-zero"
grep -q "step 150/150" runs/train.log || fail "a training run's stderr is not in runs/train.log"
if grep -q "^demo: nothing was trained" out.txt; then fail "a run that trained says nothing was trained"; fi
grep -q "^demo: first step logged [0-9]* s after the start (build [0-9]* s)" out.txt ||
  fail "the demo does not say when its first step was logged"
if STUB_EXIT=3 ./scripts/demo.sh >out.txt 2>&1; then fail "a failed job (exit 3) let the demo exit 0"; fi
echo "PASS: a finished demo says nothing was trained and the DEMO_ITERS that trains further"
