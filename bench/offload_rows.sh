#!/usr/bin/env bash
# The ZeRO-Offload GPU rows, for one run on one H200 (scripts/gpu_run.sh GPU_OFFLOAD=1):
#   oracle     tests/runtime/engine/offload_oracle.py --bf16: offload == no offload in bf16 on one
#              GPU, stages 1, 2, 3 and ratio 0.5 (the pinned staging slots, the copy stream)
#   d2off9     dscpp, the 9.08 B GPT (bench/configs/gpt_9B_offload_bench.json) at stage 2 with
#              offload_optimizer cpu (bench/configs/gpt_bf16_zero2_offload.json)
#   ds2off46   DeepSpeed's own ZeRO-Offload (bench/deepspeed_gpt.py, its DeepSpeedCPUAdam
#              JIT-built with TORCH_CUDA_ARCH_LIST=9.0), the 4.64 B GPT, the same ds_config
#   d2off46    dscpp on the same 4.64 B GPT and ds_config
#   d2off46o   the same without gradient clipping (gpt_bf16_zero2_offload_noclip.json), where the
#              CPU update overlaps backward (zero/offload_overlap.h)
#   d2off46m   d2off46 with the CUDA allocator's history of step 2 recorded (train_gpt
#              --memory-snapshot): bench/memory_peak.py lists what is live at the GPU peak ->
#              $OUT/memory_peak_off46.md (where offload's GPU memory goes)
#   d2x9       the 9.08 B GPT at stage 2 without offload (gpt_6.7B_bf16_zero2.json): the refusal
#              (16 B per parameter of model states, 135 GiB, do not fit 139 GiB with activations)
#   d3both     the 7.46 B GPT at stage 3 with both offloads (gpt_bf16_zero3_offload_both.json):
#              about the largest the 128 GiB host holds: 16 B per parameter there (master, Adam's
#              two moments, the bf16 gradient partition and the bf16 parameter partition), 111 GiB
#   d2off83    the 8.27 B GPT at stage 2 with offload_optimizer cpu: "about 8 B" where the 9.08 B
#              one's 14 B per parameter on the host (118.4 GiB) is too close to the 128 GiB limit
#   d2x83      the 8.27 B GPT at stage 2 without offload: 16 B per parameter of model states
#              (123 GiB) and its activations do not fit 139 GiB
# The offload ds_configs set wall_clock_breakdown (and steps_per_print 1): every step prints both
# systems' timers, dscpp's with ZeRO's phases (zero/phase_times.h); offload_table.md ends with
# each row's last step of them. $LOGDIR/cpu.txt: the machine's CPUs and LibTorch's thread count.
# Each row runs under bench/peak_rss.py (the peak resident memory of the largest process: the
# host's share), 6 iterations with a log interval of 3 (DeepSpeed: 3 warm-up, 3 timed), under
# `timeout` for what BUDGET_S leaves; a row is not started with less than MIN_ROW_S (40) left.
# Logs: $LOGDIR/<row>.log (default $OUT/offload), the table: $OUT/offload_table.md.
#   ROWS="oracle d2off9 ..."  (default: all, in the order above, most important first)
#   OFFLOAD_DRYRUN=1  the same logic on a CPU machine: the tiny GPT (model_zoo/configs/
#                     gpt_tiny.json) for every model, BUILD_DIR=build, 2 iterations, the oracle's
#                     first case only; DeepSpeed's row on its CPU accelerator if it runs here.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t_start=$SECONDS
out=${OUT:-$PWD/gpu-out}
logdir=${LOGDIR:-$out/offload}
mkdir -p "$logdir" "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=${PYTHON:-python3}
budget=${BUDGET_S:-0}
min_row=${MIN_ROW_S:-40}
row_timeout=${ROW_TIMEOUT_S:-300}
dry=${OFFLOAD_DRYRUN:-0}
build=${BUILD_DIR:-build-cuda}
data=${DATA:-.gpu/corpus/fortunes_text_document}
iters=6 interval=3 ds_steps=3 ds_warmup=3
m9=bench/configs/gpt_9B_offload_bench.json m46=bench/configs/gpt_4.6B_offload_bench.json
m83=bench/configs/gpt_8.3B_offload_bench.json m75=bench/configs/gpt_7.5B_offload_bench.json
oracle_only=()
if [ "$dry" = 1 ]; then
  build=${BUILD_DIR:-build}
  m9=model_zoo/configs/gpt_tiny.json m46=$m9 m83=$m9 m75=$m9
  iters=2 interval=1 ds_steps=1 ds_warmup=1
  oracle_only=(--only "mlp stage=1")
fi
rows=${ROWS:-oracle d2off9 ds2off46 d2off46 d2off46o d2x9 d3both}
off2=bench/configs/gpt_bf16_zero2_offload.json

train() {  # train PORT MODEL DS_CONFIG: dscpp's train_gpt on one GPU
  cmd=("$py" bench/peak_rss.py "$build/launcher/dscpp" --num_gpus 1 --master_port "$1"
    "$build/examples/train_gpt" --model-config "$2" --train-data-path "$data" --deepspeed_config "$3"
    --train-iters "$iters" --log-interval "$interval")
}
row_cmd() {  # sets `cmd` and `model` for a row; returns 1 if unknown
  case "$1" in
    oracle) model="" cmd=("$py" tests/runtime/engine/offload_oracle.py --bf16
      --launcher "$build/launcher/dscpp" --train "$build/tests/runtime/engine/engine_train" "${oracle_only[@]}") ;;
    d2off9) model=$m9; train 29862 "$m9" "$off2" ;;
    d2off46) model=$m46; train 29863 "$m46" "$off2" ;;
    d2off46m) model=$m46; train 29868 "$m46" "$off2"
      cmd+=(--memory-snapshot "$logdir/memsnap_off46.pickle" --memory-snapshot-step 2) ;;
    d2off46o) model=$m46; train 29867 "$m46" bench/configs/gpt_bf16_zero2_offload_noclip.json ;;
    d2x9) model=$m9; train 29864 "$m9" bench/configs/gpt_6.7B_bf16_zero2.json ;;
    d3both) model=$m75; train 29865 "$m75" bench/configs/gpt_bf16_zero3_offload_both.json ;;
    d2off83) model=$m83; train 29869 "$m83" "$off2" ;;
    d2x83) model=$m83; train 29870 "$m83" bench/configs/gpt_6.7B_bf16_zero2.json ;;
    ds2off46) model=$m46
      cmd=(env TORCH_CUDA_ARCH_LIST=9.0 MASTER_PORT=29866 "$py" bench/peak_rss.py "$py" bench/deepspeed_gpt.py
        --model-config "$m46" --deepspeed_config "$off2" --adam fused --steps "$ds_steps" --warmup "$ds_warmup") ;;
    *) return 1 ;;
  esac
}

{ nproc; lscpu 2>/dev/null | grep -E "^(Model name|Socket|Core|Thread|CPU\(s\)|NUMA)"
  "$py" -c 'import torch; print("torch intra-op threads:", torch.get_num_threads())' 2>&1; } >"$logdir/cpu.txt"
models=()
for row in $rows; do
  log=$logdir/$row.log
  if ! row_cmd "$row"; then echo "offload_rows: unknown row '$row' (skipped)"; continue; fi
  limit=$row_timeout
  if [ "$budget" -gt 0 ]; then
    left=$((budget - (SECONDS - t_start)))
    if [ "$left" -lt "$min_row" ]; then echo "offload_rows: $row not started: ${left} s of BUDGET_S left"; continue; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  t0=$SECONDS
  { echo "## offload_rows row=$row model=$model started $(date -u +%FT%TZ) limit_s=$limit"
    echo "## cmd: ${cmd[*]}"; } >"$log"
  timeout -k 10 "$limit" "${cmd[@]}" >>"$log" 2>&1
  rc=$?
  echo "## gpt_table row=$row rc=$rc wall_s=$((SECONDS - t0))" >>"$log"
  echo "offload_rows: $row rc=$rc in $((SECONDS - t0)) s (script at $((SECONDS - t_start)) s)"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && sleep 5
  if [ "$row" = d2off46m ] && [ -f "$logdir/memsnap_off46.pickle" ]; then
    "$py" bench/memory_peak.py "$logdir/memsnap_off46.pickle" >"$out/memory_peak_off46.md" 2>&1
    rm -f "$logdir/memsnap_off46.pickle"
  fi
done
"$py" bench/offload_table.py "$logdir" | tee "$out/offload_table.md"
echo "offload_rows: $((SECONDS - t_start)) s in all"
