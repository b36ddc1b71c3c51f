#!/usr/bin/env bash
# The GPU benchmark table: GPT 1.3B (bench/configs/gpt_1.3B_bench.json, micro-batch
# 8, bf16) with dscpp at ZeRO 0-3 on 1 and 2 GPUs, and plain PyTorch (single, DDP, FSDP2; each
# eager and with compiled blocks) in the same run, then bench/gpt_table.py prints the tables.
#
#   ROWS="d2x2 pt_fsdp2" LOGDIR=build-table-logs BUDGET_S=500 bash bench/gpt_table.sh
#
# Assumes $BUILD_DIR (build-cuda) is built (train_gpt, the dscpp launcher) and .gpu/corpus holds
# fortunes_text_document.{bin,idx}. Rows (default: all, most important first):
#   mm          bench/matmul_peak.py: the measured bf16 matrix rate (always run first if missing)
#   dSxN        dscpp train_gpt, ZeRO stage S (0-3), N GPUs (1, 2), --train-iters GPT_ITERS (20)
#   dSxNu       the same with the model's fused kernels off (MODEL_CONFIG's _unfused twin)
#   dSxNf       the same with the residual add + LayerNorm fused (MODEL_CONFIG's _fusedln twin)
#   dSxNg       the same with gradient_accumulation_fusion off (MODEL_CONFIG's _nogradfusion twin)
#   dSxNn       the same with ZeRO's collectives off (train_gpt --bench-no-comm: a no-op
#               process group): the time bound
#               for overlap_comm (wrong training, right step time)
#   d2xNd       ZeRO-2 with dscpp_deferred_allgather, the GPT as LayerSpecs (--layer-specs)
#   pt_single[_c|_w]              PyTorch on 1 GPU (eager; _c: torch.compile per block; _w: the
#                                 whole model and its loss compiled as one function)
#   dsSxN[t][e]  DeepSpeed itself (bench/deepspeed_gpt.py), ZeRO stage S, N GPUs, from the same
#               ds_config file as dSxN: its FusedAdam, or t: torch's fused AdamW via `torch_adam`;
#               e: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the 6.66 B model needs it)
#   pt_ddp[_c], pt_fsdp2[_c]      PyTorch on 2 GPUs
# Each row's output goes to LOGDIR/<row>.log (LOGDIR default $OUT/table, OUT default ./gpu-out),
# ending with a trailer "## gpt_table row=R rc=C wall_s=W"; the logs are also packed into
# $OUT/gpt_table_logs.tgz (a device call returns at most 8 files), the tables go to
# $OUT/gpt_table.md. Resumable: a row whose log has a trailer is not run again unless FORCE=1
# or RERUN="row ..." names it; a row cut by the time limit (rc 124/137) or without a trailer
# runs again. $OUT is emptied between device calls, so to resume in a second call point
# LOGDIR at a folder outside it (build-table-logs: ignored, so it can be carried).
# BUDGET_S (0: none) is the time this script may take: each row runs under `timeout` for what
# is left (at most ROW_TIMEOUT_S, default 420) and none starts with less than MIN_ROW_S
# (default 40) left, so the table is always printed.
# PYTHON (default python3) runs the Python parts; BUILD_DIR (default build-cuda),
# MODEL_CONFIG and GPUS (default: what nvidia-smi lists) override the build, the model and the
# GPU count (for tests); DS_CONFIG_PATTERN (printf, %s the stage) picks the ds_configs of both
# systems (default: bench/configs/gpt_bf16_zero%s.json, ds_configs/gpt_bf16_zero2.json for 2);
# PT_MICRO (8) the PyTorch rows' micro-batch (the ds_config's train_micro_batch_size_per_gpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t_start=$SECONDS
out=${OUT:-$PWD/gpu-out}
logdir=${LOGDIR:-$out/table}
mkdir -p "$logdir" "$out"
# NVLink multicast stays off: the shared hosts do not allow it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=${PYTHON:-python3}
all="mm d2x2 pt_fsdp2 pt_fsdp2_c d2x2n d3x2 d2x1 d0x1 pt_single pt_single_c d0x2 d1x2 d1x1 d3x1 pt_ddp pt_ddp_c"
rows=${ROWS:-$all}
[[ " $rows " == *" mm "* ]] || rows="mm $rows"  # the MFU column against the measured rate
budget=${BUDGET_S:-0}
row_timeout=${ROW_TIMEOUT_S:-420}
min_row=${MIN_ROW_S:-40}
iters=${GPT_ITERS:-20}
pt_steps=${PT_STEPS:-20}
pt_warmup=${PT_WARMUP:-10}
model=${MODEL_CONFIG:-bench/configs/gpt_1.3B_bench.json}
build=${BUILD_DIR:-build-cuda}
data=.gpu/corpus/fortunes_text_document
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
# Which machine a row ran on: rows of two calls compare only if they ran on one machine.
machine="host=$(hostname) gpu0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null || echo none)"

ds_config() {  # ds_config STAGE: the one ds_config file both systems read for that stage
  if [ -n "${DS_CONFIG_PATTERN:-}" ]; then printf "$DS_CONFIG_PATTERN\n" "$1"
  elif [ "$1" = 2 ]; then echo ds_configs/gpt_bf16_zero2.json
  else echo "bench/configs/gpt_bf16_zero$1.json"; fi
}

# row_cmd ROW PORT: prints nothing, sets the array `cmd` and `need` (GPUs); returns 1 if unknown.
row_cmd() {
  local row=$1 port=$2
  case "$row" in
    mm) need=1; cmd=("$py" bench/matmul_peak.py) ;;
    d[0-3]x[12] | d[0-3]x[12]u | d[0-3]x[12]f | d[0-3]x[12]g | d[0-3]x[12]n | d2x[12]d)  # u: fused kernels off; f: add+LayerNorm fused; g: gradient accumulation fusion off; n: collectives off; d: deferred all-gathers
      local stage=${row:1:1} n=${row:3:1} cfg mcfg=$model
      cfg=$(ds_config "$stage")
      [[ "$row" == *u ]] && mcfg=${model%.json}_unfused.json
      [[ "$row" == *f ]] && mcfg=${model%.json}_fusedln.json
      [[ "$row" == *g ]] && mcfg=${model%.json}_nogradfusion.json
      local layered=() no_comm=()
      [[ "$row" == *d ]] && cfg=bench/configs/gpt_bf16_zero2_deferred.json && layered=(--layer-specs)
      need=$n
      cmd=()
      [[ "$row" == *n ]] && no_comm=(--bench-no-comm)
      cmd+=("$build/launcher/dscpp" --num_gpus "$n" --master_port "$port" "$build/examples/train_gpt"
        --model-config "$mcfg" --train-data-path "$data" --deepspeed_config "$cfg"
        --train-iters "$iters" --log-interval 10 "${layered[@]}" "${no_comm[@]}") ;;
    ds[0-3]x[12] | ds[0-3]x[12]t | ds[0-3]x[12]e | ds[0-3]x[12]te)
      local stage=${row:2:1} n=${row:4:1} adam=fused
      [[ "$row" == *t* ]] && adam=torch
      need=$n
      # DeepSpeed 0.19.8's op builder cannot parse the 9.0a arch PyTorch reports on an H200.
      cmd=(env TORCH_CUDA_ARCH_LIST=9.0)
      [[ "$row" == *e ]] && cmd+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
      local args=(bench/deepspeed_gpt.py --model-config "$model" --deepspeed_config "$(ds_config "$stage")"
        --adam "$adam" --steps "$pt_steps" --warmup "$pt_warmup")
      if [ "$n" = 1 ]; then cmd+=("$py" "${args[@]}")
      else cmd+=("$py" -m torch.distributed.run --nproc_per_node "$n" --master_port "$port" "${args[@]}"); fi ;;
    pt_single | pt_single_c | pt_single_w | pt_ddp | pt_ddp_c | pt_fsdp2 | pt_fsdp2_c)
      local mode=${row#pt_} extra=()
      mode=${mode%_c}
      mode=${mode%_w}
      [[ "$row" == *_c ]] && extra=(--compile)
      [[ "$row" == *_w ]] && extra=(--compile-whole)
      local args=(bench/pytorch_gpt.py --model-config "$model" --mode "$mode" --micro-batch "${PT_MICRO:-8}"
        --steps "$pt_steps" --warmup "$pt_warmup" "${extra[@]}")
      if [ "$mode" = single ]; then need=1; cmd=("$py" "${args[@]}")
      else need=2; cmd=("$py" -m torch.distributed.run --nproc_per_node 2 --master_port "$port" "${args[@]}"); fi ;;
    *) return 1 ;;
  esac
}

done_already() {  # a trailer with an rc other than a time-out's
  local log=$1
  [ -f "$log" ] || return 1
  local rc
  rc=$(sed -n 's/^## gpt_table row=[^ ]* rc=\([0-9]*\).*/\1/p' "$log" | tail -1)
  [ -n "$rc" ] && [ "$rc" != 124 ] && [ "$rc" != 137 ]
}

port=29800
for row in $rows; do
  port=$((port + 1))
  log=$logdir/$row.log
  if ! row_cmd "$row" "$port"; then echo "gpt_table: unknown row '$row' (skipped)"; continue; fi
  if [ "${FORCE:-0}" != 1 ] && [[ " ${RERUN:-} " != *" $row "* ]] && done_already "$log"; then
    echo "gpt_table: $row already logged ($(tail -1 "$log" | sed 's/^## gpt_table //'))"
    continue
  fi
  if [ "$gpus" -lt "$need" ]; then echo "gpt_table: $row needs $need GPUs, $gpus here (skipped)"; continue; fi
  limit=$row_timeout
  if [ "$budget" -gt 0 ]; then
    left=$((budget - (SECONDS - t_start)))
    if [ "$left" -lt "$min_row" ]; then echo "gpt_table: $row not started: ${left} s of BUDGET_S left"; continue; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  [ -f "$log" ] && mv "$log" "$log.prev"
  t0=$SECONDS
  {
    echo "## gpt_table row=$row started $(date -u +%FT%TZ) limit_s=$limit $machine"
    echo "## cmd: ${cmd[*]}"
  } >"$log"
  timeout -k 10 "$limit" "${cmd[@]}" >>"$log" 2>&1
  rc=$?
  echo "## gpt_table row=$row rc=$rc wall_s=$((SECONDS - t0))" >>"$log"
  echo "gpt_table: $row rc=$rc in $((SECONDS - t0)) s (script at $((SECONDS - t_start)) s)"
  # A row cut short may leave ranks behind; give the GPUs a moment to be freed.
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && sleep 5
done

# One archive of the row logs: a device call returns at most 8 files (resume elsewhere with
# `mkdir -p build-table-logs && tar xzf gpt_table_logs.tgz -C build-table-logs`).
(cd "$logdir" && tar czf "$out/gpt_table_logs.tgz" -- *.log 2>/dev/null)
"$py" bench/gpt_table.py "$logdir" --model-config "$model" | tee "$out/gpt_table.md"
echo "gpt_table: $((SECONDS - t_start)) s in all"
