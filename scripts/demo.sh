#!/usr/bin/env bash
# The main job: the scaled-down GPT pre-training. Builds dscpp, turns Debian's fortunes into a
# GPT-2-tokenized Megatron dataset (runs/corpus), and trains model_zoo/configs/gpt_tiny.json
# through the dscpp launcher with ZeRO-2: on every GPU when there are GPUs (the CUDA build),
# otherwise on 2 CPU ranks over Gloo. Logs, TensorBoard and CSV files and the checkpoint go
# under runs/. Environment: DEMO_ITERS (default 150), DEMO_RANKS (CPU ranks, default 2).
# On the CPU it builds only what it runs (train_gpt, preprocess_data, the launcher) in build/,
# in scripts/test.sh's build type, so that either of the README's two commands finds what the
# other built; on a GPU, build-cuda-demo/ in an optimised type.
# Run again, it resumes from runs/checkpoints: at DEMO_ITERS it says that the run is finished
# and how to train further (the DEMO_ITERS to give). The log is kept in runs/train.log. It
# prints how long the build took and when the first step was logged.
set -euo pipefail
cd "$(dirname "$0")/.."
variant=cpu
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then variant=cuda; fi
start=$SECONDS
build=build
type=${DSCPP_BUILD_TYPE:-Check}
if [ "$variant" = cuda ]; then
  build=build-cuda-demo
  type=${DSCPP_BUILD_TYPE:-RelWithDebInfo}
fi
DSCPP_BUILD_DIR=$build DSCPP_BUILD_TYPE=$type \
  scripts/build.sh "$variant" train_gpt preprocess_data dscpp_launcher
built=$((SECONDS - start))
export DSCPP_PYTHON=${DSCPP_PYTHON:-$PWD/.venv/bin/python3}
if [ ! -f runs/corpus/fortunes_text_document.idx ]; then
  PREPROCESS_DATA=$build/tools/preprocess_data scripts/prepare_corpus.sh runs/corpus
fi
ranks=()
[ "$variant" = cpu ] && ranks=(--num_gpus "${DEMO_RANKS:-2}")
# One OpenMP thread per rank: the ranks share the machine's cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ${DEMO_RANKS:-2} > 0 ? $(nproc) / ${DEMO_RANKS:-2} : 1 ))}
iters=${DEMO_ITERS:-150}
mkdir -p runs
# The log is kept (runs/train.log) and read once the job ends: a run resumed at its last step
# trains nothing, and train_gpt's own advice (raise --train-iters) is DEMO_ITERS here.
"$build/launcher/dscpp" "${ranks[@]}" "$build/examples/train_gpt" \
  --model-config model_zoo/configs/gpt_tiny.json \
  --train-data-path runs/corpus/fortunes_text_document \
  --deepspeed_config ds_configs/gpt_tiny_cpu.json \
  --train-iters "$iters" --log-interval 10 \
  --save runs/checkpoints --save-interval 50 --load runs/checkpoints --seed 1234 2>&1 |
  tee runs/train.log |
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [ -z "${first_step:-}" ] && [[ "$line" == *"step="* || "$line" == *"] step "* ]]; then
      first_step=$((SECONDS - start))
      echo "demo: first step logged ${first_step} s after the start (build ${built} s)"
    fi
  done
done_at=$(sed -n 's/.*finished: the checkpoint is at step \([0-9]*\).*nothing left to train.*/\1/p' runs/train.log)
if [ -n "$done_at" ]; then
  echo "demo: nothing was trained: runs/checkpoints is at step $done_at and DEMO_ITERS is $iters." \
    "To train further: DEMO_ITERS=$((done_at + iters)) scripts/demo.sh (the schedule's" \
    "total_num_steps is in ds_configs/gpt_tiny_cpu.json); to start again: rm -r runs/checkpoints"
fi
echo "demo: done in $((SECONDS - start)) s (build ${built} s)"
