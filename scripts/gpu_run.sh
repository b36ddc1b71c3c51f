#!/usr/bin/env bash
# One call on the GPU machine (see ../shared/GPU.md): unpack the Debian packages it lacks
# (carried in .gpu/: Boost.Program_options' library (../shared/gpu-debs), liburing, which zero/
# needs in every build (liburing-dev and liburing2 .debs from Debian 12's apt cache), gloo's
# headers; the corpus in .gpu/corpus: scripts/prepare_corpus.sh .gpu/corpus), build the CUDA
# variant, run the environment report and the test suite, then GPU tests and benchmarks
# as they exist. Full logs go to $OUT (or ./gpu-out); a short summary is printed last.
# A device call returns at most 8 files from $OUT: when there are more, the *.log files are
# packed into $OUT/logs.tgz at the end.
# Opt-in steps (environment):
#   GPU_TESTS=0     skip the tests and the default GPT benchmark; build only train_gpt, the
#                   launcher and dscpp_report (for calls that only run the table or a profile)
#   GPU_TESTS=quick as 0, plus the fused Adam's CUDA test, the engine cases (one process),
#                   the bf16 oracle over NCCL, and the fused ops' CUDA test and kernels_bench
#   GPU_BENCH_AG=1  all-gather / reduce-scatter / all-reduce figures (tools/comm_bench, 64 MiB
#                   to 1 GiB) with NCCL's defaults, then with NCCL_MIN_NCHANNELS=32 -> comm_ag.log
#   GPU_TABLE=1     bench/gpt_table.sh: issue 7's table (ROWS, LOGDIR, ... as that script says;
#                   it replaces the default GPT benchmark, whose rows it holds); -> gpt_table.md
#   GPU_PROFILE=1   two steps (14 and 15 of 20) of dscpp ZeRO-2 on 2 GPUs (1 where there is one)
#                   under Kineto: gzipped traces profile-rank*.json.gz and bench/trace_summary.py's
#                   profile_summary.md
#                   (GPU_PROFILE_DEFERRED=1: the d2x2d run, deferred all-gathers and LayerSpecs;
#                   GPU_PROFILE_MODEL / GPU_PROFILE_DS: another model and ds_config, e.g. the
#                   6.66 B GPT: bench/configs/gpt_6.7B_bench.json, gpt_6.7B_bf16_zero2.json)
#   GPU_FLOPS=1     DeepSpeed's flops profiler at step 5 of train_gpt (GPT 1.3B, ZeRO-2, one GPU,
#                   bench/configs/gpt_bf16_zero2_flops.json) -> flops_profile.log; GPU_FLOPS_MODEL and
#                   GPU_FLOPS_DS: another model and ds_config (the MoE GPT: model_zoo/configs/
#                   moe_1gpu.yaml with bench/configs/moe_1gpu_bf16_zero1_flops.json)
#   GPU_CPU_ADAM=1  dscpp's CPU Adam beside DeepSpeed's DeepSpeedCPUAdam on this machine's cores
#                   (bench/cpu_adam_bench.py; DeepSpeed's op JIT-builds with g++) -> cpu_adam.log
#   GPU_OFFLOAD=1   the re-lay's tests on the GPU (test_relayout, test_stage3_relay), then
#                   issue 21's ZeRO-Offload rows on one GPU (bench/offload_rows.sh: the bf16 offload
#                   oracle, a 9 B GPT at stage 2 with offload_optimizer and without, DeepSpeed's
#                   ZeRO-Offload beside dscpp at 4.6 B, stage 3 with both offloads at 8.3 B; ROWS
#                   via GPU_OFFLOAD_ROWS) -> offload_table.md; GPU_TESTS=0 with it builds
#                   engine_train too
#   GPU_67B=1       the 6.66 B GPT with activation checkpointing (bench/configs/gpt_6.7B_*):
#                   GPU_67B_ROWS (default "d2x1 ds2x1te d3x1 ds3x1t") -> gpt_table_67b.md
#   GPU_MOE=1       the MoE GPT that fills one H200 (model_zoo/configs/moe_1gpu.yaml, 6.92 B
#                   parameters, 1.28 B active) in train_gpt, bf16 ZeRO-1, 8 x 2048 tokens a step
#                   (GPU_MOE_DS: another ds_config), then its PyTorch reference (bench/
#                   pytorch_moe_gpt.py) -> train_gpt_moe.log (tokens/s, MFU on active parameters,
#                   aux loss, balance), pytorch_moe.log, moe_table.md (both rows and the ratio);
#                   GPU_MOE_WGRAD="off grouped": train_gpt again with each --grouped-wgrad;
#                   GPU_MOE_DS_MORE="a.json b.json": train_gpt again with each ds_config;
#                   both sides warm the lr up over GPU_MOE_WARMUP steps (default 1000: balanced
#                   routing; 0: none, the router collapses); GPU_MOE_COLLAPSED=1: train_gpt again
#                   without the warmup
#   GPU_NVME=1      ZeRO-Infinity's io_uring swap files on this machine's disk (liburing from the
#                   .gpu/ .debs): tests/zero/test_nvme_file, then the NVMe oracle on CPU ranks
#                   (CUDA hidden: fp32 within 1e-6 of no offload) -> nvme_file.log, nvme_oracle.log
#   GPU_MOE_KERNELS=1  the MoE kernels: their CUDA tests (test_kernels_cuda's MoePermuteKernels.*,
#                   MoeTopKCuda.*, SwigluCuda.*; GPU_MOE_TESTS: another gtest filter, '*' for all
#                   of test_kernels_cuda) and bench/moe_bench (the MoE layer at moe_1gpu's shape,
#                   kernels against the ATen path, and the grouped GEMM's share) -> moe_kernels.log,
#                   moe_bench.log; on 2 GPUs also bench/moe_overlap_bench over NCCL (the shared
#                   expert beside the all-to-alls against the serial order, capacity and
#                   dropless) -> moe_overlap.log; with GPU_TESTS=0 or quick it builds only those
#   GPU_CMAKE_ARGS  more CMake arguments for both builds (e.g. -DDSCPP_WERROR=OFF: g++ 13
#                   there warns where clang++ here does not; the warnings stay in build.log)
#   GPU_SKIP="a b"  skip the named steps (e.g. "nccl_collectives checkpoint_resume ctest")
#   GPU_BASELINE=DIR  another source tree (the code before a change: `git archive COMMIT | tar x -C
#                   .gpu/baseline`) is built too (train_gpt and the launcher), and bench/gpt_table.sh
#                   runs BASELINE_ROWS (default "d0x1 d2x1 d3x1") of both trees in turn, in this
#                   call -> baseline_compare.md (tokens/s of each row, this tree against DIR's)
#   GPU_PREBUILT=1  with GPU_TESTS=0 or quick: run scripts/gpu_prebuild.sh's pack (.gpu/prebuilt,
#                   built on a CPU machine) instead of configuring and building here, when it was
#                   built from these sources (else it builds here as before)
#   GPU_DEADLINE_S  seconds from this script's start by which the table must be printed
#                   (e.g. 570 under a 600 s device call); rows that would not fit are left for
#                   the next call
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tests=${GPU_TESTS:-1}
deps=/opt/deps
mkdir -p "$deps"
for f in .gpu/*.deb; do dpkg -x "$f" "$deps"; done
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# DeepSpeed for its own table rows (issue 17): the wheels carried in .gpu/ds-wheels (the GPU
# machine has no DeepSpeed and no network; ../shared/GPU.md).
if ls .gpu/ds-wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /opt/dspy .gpu/ds-wheels/*.whl >/dev/null 2>&1 &&
    export PYTHONPATH=/opt/dspy${PYTHONPATH:+:$PYTHONPATH}
fi
[ -d /opt/gcc/bin ] && export PATH=/opt/gcc/bin:$PATH
# DeepSpeed's cpu_adam op (its ZeRO-Offload row, and GPU_CPU_ADAM's DeepSpeedCPUAdam) JIT-builds
# with g++ when first loaded, about a minute that cut DeepSpeed's offload row in the thirteenth
# session: built now, beside the CUDA build, into the TORCH_EXTENSIONS_DIR the rows load it from.
ds_op_pid=
if { [ "${GPU_OFFLOAD:-0}" = 1 ] || [ "${GPU_CPU_ADAM:-0}" = 1 ]; } && [ -d /opt/dspy/deepspeed ]; then
  mkdir -p build-cuda/torch_extensions
  TORCH_CUDA_ARCH_LIST=9.0 TORCH_EXTENSIONS_DIR="$PWD/build-cuda/torch_extensions" python3 -c \
    'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()' \
    >"$out/ds_cpu_adam_build.log" 2>&1 &
  ds_op_pid=$!
fi
ds_op_wait() {  # the op built (or failed: the row then builds it itself, and says why)
  [ -n "$ds_op_pid" ] || return 0
  local t0=$SECONDS
  wait "$ds_op_pid"; echo "ds_cpu_adam_build rc=$? (waited $((SECONDS - t0)) s)" >>"$out/ds_cpu_adam_build.log"
  ds_op_pid=
}
summary=()
step() {  # step NAME COMMAND...: runs it, logs to $out/NAME.log, records the outcome
  local name=$1; shift
  local t0=$SECONDS
  if [[ " ${GPU_SKIP:-} " == *" $name "* ]]; then summary+=("skip  $name (GPU_SKIP)"); return 0; fi
  if "$@" >"$out/$name.log" 2>&1; then summary+=("ok    $name ($((SECONDS - t0)) s)")
  else summary+=("FAIL  $name ($((SECONDS - t0)) s): see $name.log"); fi
}
configure() {
  cmake -S . -B build-cuda -G Ninja -DDSCPP_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DDSCPP_PYTHON="$(command -v python3)" -DCMAKE_PREFIX_PATH="$deps/usr" \
    -DDSCPP_GLOO_INCLUDE="$deps/usr/include" \
    -DDSCPP_BOOST_PO_LIBRARY="$deps/usr/lib/x86_64-linux-gnu/libboost_program_options.so.1.74.0" \
    -DDSCPP_BOOST_PO_INCLUDE="$deps/usr/include" ${GPU_CMAKE_ARGS:-}
}
# GPU_PREBUILT=1 (with GPU_TESTS 0 or quick): the executables scripts/gpu_prebuild.sh built on a
# CPU machine from these very sources (sources.sha256), instead of the 140-165 s configure and
# build; any source changed since, or a binary that does not start here, and it builds as before.
prebuilt() {
  local p=.gpu/prebuilt tdir
  [ -f $p/sources.sha256 ] || { echo "no $p: scripts/gpu_prebuild.sh makes it"; return 1; }
  sha256sum -c --quiet $p/sources.sha256 || { echo "sources changed since the prebuild"; return 1; }
  cat $p/BUILT
  tdir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))') || return 1
  # LibTorch, CUDA's and NCCL's libraries from this machine's torch; yaml-cpp and protobuf-lite
  # from the pack, last, so that no Python process here loads them in place of its own.
  export LD_LIBRARY_PATH=$tdir/lib:$(dirname "$tdir")/nvidia/cu13/lib:$(dirname "$tdir")/nvidia/nccl/lib:$LD_LIBRARY_PATH:$PWD/$p/lib
  tar -C $p -xJf $p/bin.tar.xz || return 1
  mkdir -p build-cuda && cp -a $p/build-cuda/. build-cuda/ && ./build-cuda/tools/dscpp_report >/dev/null
}
use_prebuilt=0
if [ "${GPU_PREBUILT:-0}" = 1 ] && [ "$tests" != 1 ]; then
  step prebuilt prebuilt
  [[ "${summary[-1]}" == ok* ]] && use_prebuilt=1
fi
[ "$use_prebuilt" = 1 ] || step configure configure
# -k 0: one target that fails to build must not keep the others from being tested.
targets=()
[ "$tests" = 1 ] || targets=(train_gpt dscpp_launcher dscpp_report cpu_adam_bench)
[ "$tests" = quick ] && targets+=(engine_train test_fused_adam_cuda test_engine_cases test_kernels_cuda kernels_bench)
[ "${GPU_BENCH_AG:-0}" = 1 ] && [ "$tests" != 1 ] && targets+=(comm_bench)
[ "${GPU_OFFLOAD:-0}" = 1 ] && [ "$tests" != 1 ] && targets+=(engine_train test_relayout test_stage3_relay)
[ "${GPU_NVME:-0}" = 1 ] && [ "$tests" != 1 ] && targets+=(test_nvme_file engine_train dscpp_launcher)
[ "${GPU_MOE_KERNELS:-0}" = 1 ] && [ "$tests" != 1 ] && targets+=(test_kernels_cuda moe_bench moe_overlap_bench dscpp_launcher)
[ "$use_prebuilt" = 1 ] || step build ninja -C build-cuda -k 0 -j "$(nproc)" "${targets[@]}"
baseline_build() {
  (cd "$GPU_BASELINE" && configure && ninja -C build-cuda -j "$(nproc)" train_gpt dscpp_launcher)
}
[ -n "${GPU_BASELINE:-}" ] && step baseline_build baseline_build
step report ./build-cuda/tools/dscpp_report
nvidia-smi >"$out/nvidia-smi.log" 2>&1 || true
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ] && [ "$tests" = 1 ]; then
  # The collectives suite over NCCL on CUDA tensors, then nccl-tests-style figures.
  step nccl_collectives env DSCPP_TEST_BACKEND=nccl ./build-cuda/launcher/dscpp --num_gpus 2 \
    --master_port 29651 ./build-cuda/tests/comm/comm_collectives
  [ "${GPU_BENCH_COMM:-0}" = 1 ] && step comm_bench ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29652 \
    ./build-cuda/tools/comm_bench --backend nccl --dtype bf16 --ops all_reduce,reduce_scatter,all_gather \
    --min-bytes 1048576 --max-bytes 1073741824 --iters 20 --warmup 5 --check
  step engine_bf16 python3 tests/runtime/engine/bf16_oracle.py --launcher ./build-cuda/launcher/dscpp \
    --train ./build-cuda/tests/runtime/engine/engine_train
  # Checkpoints over NCCL: bit-exact resume at stages 0-2.
  step checkpoint_resume python3 tests/runtime/checkpoint/checkpoint_oracle.py --part resume \
    --launcher ./build-cuda/launcher/dscpp --train ./build-cuda/tests/runtime/engine/engine_train \
    --zero-to-fp32 ./build-cuda/tools/zero_to_fp32
fi
if [ "$tests" = quick ] && [ "$gpus" -ge 2 ]; then
  step fused_adam_test ./build-cuda/tests/optim/test_fused_adam_cuda
  step engine_cases ./build-cuda/tests/runtime/engine/test_engine_cases
  step engine_bf16 python3 tests/runtime/engine/bf16_oracle.py --launcher ./build-cuda/launcher/dscpp \
    --train ./build-cuda/tests/runtime/engine/engine_train --quick
fi
if [ "${GPU_NVME:-0}" = 1 ]; then
  step nvme_file ./build-cuda/tests/zero/test_nvme_file
  step nvme_oracle env CUDA_VISIBLE_DEVICES= python3 tests/runtime/engine/nvme_oracle.py \
    --launcher ./build-cuda/launcher/dscpp --train ./build-cuda/tests/runtime/engine/engine_train
fi
comm_ag() {  # the ZeRO step's all-gather beside the other collectives, two NCCL settings
  local ops=(--backend nccl --dtype bf16 --ops all_gather,reduce_scatter,all_reduce
    --min-bytes 67108864 --max-bytes 1073741824 --iters 20 --warmup 5)
  echo "## NCCL defaults"
  ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29653 ./build-cuda/tools/comm_bench "${ops[@]}" || return 1
  echo "## NCCL_MIN_NCHANNELS=32"
  NCCL_MIN_NCHANNELS=32 ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29654 ./build-cuda/tools/comm_bench "${ops[@]}"
}
[ "${GPU_BENCH_AG:-0}" = 1 ] && [ "$gpus" -ge 2 ] && step comm_ag comm_ag
if [ "${GPU_BENCH_ADAM:-0}" = 1 ] && [ -x ./build-cuda/bench/fused_adam_bench ]; then
  step fused_adam ./build-cuda/bench/fused_adam_bench
fi
# The GPT's fused kernels: their CUDA tests against float64 references, then their timing
# beside the eager ops at the 1.3B model's shapes.
if [ "$tests" != 0 ] && [ "$gpus" -ge 1 ] && [ -x ./build-cuda/tests/ops/test_kernels_cuda ]; then
  step kernels_cuda ./build-cuda/tests/ops/test_kernels_cuda
  step kernels_bench ./build-cuda/bench/kernels_bench
fi
# Issue 20's MoE permutation kernels: their tests, then the layer's timing (predictions in
# bench/moe_bench.cpp's header).
if [ "${GPU_MOE_KERNELS:-0}" = 1 ] && [ "$gpus" -ge 1 ]; then
  step moe_kernels ./build-cuda/tests/ops/test_kernels_cuda \
    --gtest_filter="${GPU_MOE_TESTS:-MoePermuteKernels.*:MoeTopKCuda.*:SwigluCuda.*}"
  step moe_bench ./build-cuda/bench/moe_bench
fi
# Issue 20's shared-expert overlap over NCCL (predictions in bench/moe_overlap_bench.cpp).
if [ "${GPU_MOE_KERNELS:-0}" = 1 ] && [ "$gpus" -ge 2 ]; then
  step moe_overlap ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29767 \
    ./build-cuda/bench/moe_overlap_bench --backend nccl --tokens 16384 --hidden 2048 \
    --experts 8 --k 2 --ffn 1024 --shared-ffn 2048 --iters 20 --warmup 5
fi
# GPT 1.3B training throughput: dscpp's train_gpt beside plain PyTorch in the same call
# (GPU.md: compare only figures of one call). Data: the fortunes corpus carried in .gpu/corpus.
gpt_bench() {  # gpt_bench NAME RANKS DS_CONFIG
  ./build-cuda/launcher/dscpp --num_gpus "$2" --master_port $((29700 + $2)) ./build-cuda/examples/train_gpt \
    --model-config bench/configs/gpt_1.3B_bench.json --train-data-path .gpu/corpus/fortunes_text_document \
    --deepspeed_config "$3" --train-iters "${GPT_ITERS:-30}" --log-interval 10
}
if [ -f .gpu/corpus/fortunes_text_document.idx ] && [ "$gpus" -ge 1 ] && [ "$tests" = 1 ] &&
  [ "${GPU_TABLE:-0}" != 1 ]; then
  r=$(( gpus >= 2 ? 2 : 1 ))
  step gpt_dscpp gpt_bench gpt_dscpp "$r" ds_configs/gpt_bf16_zero2.json
  step gpt_pytorch_fsdp2 python3 -m torch.distributed.run --nproc_per_node "$r" --master_port 29720 \
    bench/pytorch_gpt.py --model-config bench/configs/gpt_1.3B_bench.json --mode fsdp2 --steps 20 --warmup 10
  step gpt_pytorch_ddp python3 -m torch.distributed.run --nproc_per_node "$r" --master_port 29721 \
    bench/pytorch_gpt.py --model-config bench/configs/gpt_1.3B_bench.json --mode ddp --steps 20 --warmup 10
fi
# Issue 7's table: dscpp ZeRO 0-3 on 1 and 2 GPUs beside PyTorch single/DDP/FSDP2, eager and
# compiled, in this call. Under GPU_DEADLINE_S it gets what is left, less the profile's share.
gpt_profile() {  # two profiled ZeRO-2 steps on 2 GPUs, every rank's trace, then their summaries
  local trace=$out/profile.json limit=600
  local cfg=(--deepspeed_config "${GPU_PROFILE_DS:-ds_configs/gpt_bf16_zero2.json}")
  [ "${GPU_PROFILE_DEFERRED:-0}" = 1 ] &&
    cfg=(--deepspeed_config bench/configs/gpt_bf16_zero2_deferred.json --layer-specs)
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && limit=$((GPU_DEADLINE_S - SECONDS - 10))
  [ "$limit" -ge 45 ] || { echo "gpt_profile: ${limit} s left before GPU_DEADLINE_S: not run"; return 1; }
  local n=$(( gpus >= 2 ? 2 : 1 )) r
  timeout -k 10 "$limit" ./build-cuda/launcher/dscpp --num_gpus "$n" --master_port 29740 ./build-cuda/examples/train_gpt \
    --model-config "${GPU_PROFILE_MODEL:-bench/configs/gpt_1.3B_bench.json}" --train-data-path .gpu/corpus/fortunes_text_document \
    "${cfg[@]}" --train-iters 20 --log-interval 10 \
    --profile-step 14 --profile-steps 2 --profile-out "$trace" --profile-all-ranks || return 1
  : >"$out/profile_summary.md"
  for ((r = 0; r < n; r++)); do
    gzip -f "$out/profile-rank$r.json" || return 1
    python3 bench/trace_summary.py "$out/profile-rank$r.json.gz" >>"$out/profile_summary.md" || return 1
  done
}
if [ "${GPU_TABLE:-0}" = 1 ] && [ -f .gpu/corpus/fortunes_text_document.idx ] && [ "$gpus" -ge 1 ]; then
  budget=0
  if [ "${GPU_DEADLINE_S:-0}" -gt 0 ]; then
    budget=$((GPU_DEADLINE_S - SECONDS - 15))
    [ "${GPU_PROFILE:-0}" = 1 ] && budget=$((budget - 75))
    [ "${GPU_13B:-0}" = 1 ] && budget=$((budget - 240))
    [ "${GPU_BIG:-0}" = 1 ] && budget=$((budget - 300))
    [ "$budget" -lt 1 ] && budget=1
  fi
  step gpt_table env OUT="$out" BUDGET_S="$budget" bash bench/gpt_table.sh
fi
if [ "${GPU_PROFILE:-0}" = 1 ] && [ "$gpus" -ge 1 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  step gpt_profile gpt_profile
fi
if [ "${GPU_FLOPS:-0}" = 1 ] && [ "$gpus" -ge 1 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step flops_profile ./build-cuda/launcher/dscpp --num_gpus 1 \
    --master_port 29745 ./build-cuda/examples/train_gpt \
    --model-config "${GPU_FLOPS_MODEL:-bench/configs/gpt_1.3B_bench.json}" --train-data-path .gpu/corpus/fortunes_text_document \
    --deepspeed_config "${GPU_FLOPS_DS:-bench/configs/gpt_bf16_zero2_flops.json}" --train-iters 8 --log-interval 4
fi
# Predicted (thirteenth session, cpuadam: the step on LibTorch's OpenMP team instead of at::launch
# tasks, constants hoisted out of the kernels' loops), 16 cores, against the eleventh session's
# DeepSpeed 7,211 / 6,523 / 3,942 Melem/s at 1 M / 16 M / 67 M: 1 M ~9,500 (1.3x: no 0.3 ms of
# task dispatch, each thread's 1 MB range stays in its core's L2 from step to step, and no Python
# step overhead); 16 M ~6,700 (1.0-1.1x: both at the cache's bandwidth with the same 28 B); 67 M
# ~4,000 (1.0x: DRAM-bound, same bytes); bf16 rows ~5% under the fp32 ones at 67 M (the copy's
# 2 B read for ownership). "best" columns: the fastest of the 20 steps.
if [ "${GPU_CPU_ADAM:-0}" = 1 ] && [ -x ./build-cuda/bench/cpu_adam_bench ]; then
  ds_op_wait
  step cpu_adam env TORCH_CUDA_ARCH_LIST=9.0 TORCH_EXTENSIONS_DIR="$PWD/build-cuda/torch_extensions" \
    python3 bench/cpu_adam_bench.py --bench ./build-cuda/bench/cpu_adam_bench --threads "$(nproc)" --steps 20
fi
offload_rows() {
  local budget=0
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && budget=$((GPU_DEADLINE_S - SECONDS - 15))
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && [ "$budget" -lt 1 ] && budget=1
  env OUT="$out" LOGDIR="$out/offload" BUDGET_S="$budget" ${GPU_OFFLOAD_ROWS:+ROWS="$GPU_OFFLOAD_ROWS"} \
    TORCH_EXTENSIONS_DIR="$PWD/build-cuda/torch_extensions" bash bench/offload_rows.sh
}
if [ "${GPU_OFFLOAD:-0}" = 1 ] && [ "$gpus" -ge 1 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  # The re-lay in a buffer's own storage (the offloaded rows' host peak) on the GPU first.
  step relayout_tests bash -c './build-cuda/tests/zero/test_relayout && ./build-cuda/tests/zero/test_stage3_relay'
  ds_op_wait
  step offload_rows offload_rows
fi
table67() {
  local budget=0
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && budget=$((GPU_DEADLINE_S - SECONDS - 15))
  env OUT="$out/t67" LOGDIR="$out/table67" BUDGET_S="$budget" ROWS="${GPU_67B_ROWS:-d2x1 ds2x1te d3x1 ds3x1t}" \
    MODEL_CONFIG=bench/configs/gpt_6.7B_bench.json DS_CONFIG_PATTERN=bench/configs/gpt_6.7B_bf16_zero%s.json \
    PT_MICRO=4 bash bench/gpt_table.sh && cp "$out/t67/gpt_table.md" "$out/gpt_table_67b.md"
}
if [ "${GPU_67B:-0}" = 1 ] && [ "$gpus" -ge 1 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  step gpt_table_67b table67
fi
# GPU_13B=1: the 13 B GPT (model_zoo/configs/gpt_13B.json, activation checkpointing, micro-batch
# 1, sequence 2048) at ZeRO-3 on 2 GPUs, layer by layer; GPU_13B_STAGE2=1 also tries stage 2.
# GPT13B_MODEL picks another model config (model_zoo/configs/gpt_15B.json: the size that
# should fit 2 H200s at stage 3 but not at stage 2, docs/PERFORMANCE.md). GPU_13B_MEMSNAP=1: the
# stage-3 run records step 2's allocator history (memsnap_zero3.pickle.gz, for
# https://pytorch.org/memory_viz) and bench/memory_peak.py lists what is live at its peak.
gpt13b() {  # gpt13b DS_CONFIG [SNAPSHOT] [MODEL_CONFIG]
  local limit=900
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && limit=$((GPU_DEADLINE_S - SECONDS - 20))
  [ "$limit" -ge 60 ] || { echo "gpt13b: ${limit} s left before GPU_DEADLINE_S: not run"; return 1; }
  local snap=()
  [ -n "${2:-}" ] && snap=(--memory-snapshot "$2" --memory-snapshot-step 2)
  TORCH_SYMBOLIZE_MODE=dladdr timeout -k 10 "$limit" ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29760 \
    ./build-cuda/examples/train_gpt --model-config "${3:-${GPT13B_MODEL:-model_zoo/configs/gpt_13B.json}}" \
    --train-data-path .gpu/corpus/fortunes_text_document \
    --deepspeed_config "$1" --train-iters "${GPT13B_ITERS:-6}" --log-interval 1 "${snap[@]}" || return 1
  if [ -n "${2:-}" ]; then
    python3 bench/memory_peak.py "$2" >"$out/memory_peak.md" && gzip -f "$2"
  fi
}
if [ "${GPU_13B:-0}" = 1 ] && [ "$gpus" -ge 2 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  snap=""
  [ "${GPU_13B_MEMSNAP:-0}" = 1 ] && snap=$out/memsnap_zero3.pickle
  step gpt13b_zero3 gpt13b bench/configs/gpt_13B_zero3.json "$snap"
  if [ "${GPU_13B_STAGE2:-0}" = 1 ]; then
    sed 's/"stage": 3/"stage": 2/' bench/configs/gpt_13B_zero3.json >"$out/gpt_13B_zero2.json"
    step gpt13b_zero2 gpt13b "$out/gpt_13B_zero2.json"
  fi
fi
# GPU_MOE=1: the MoE GPT of one H200 (issue 20's row) and its PyTorch reference in this call
# (bench/pytorch_moe_gpt.py: the same model, experts through torch._grouped_mm behind a
# sort-based dispatch, fp32 weights under bf16 autocast, blocks and loss compiled), at the same
# micro-batch and global batch (bench/configs/moe_1gpu_bf16_zero1.json: 2 x 2048 tokens, 4
# micro-batches a step) on the same corpus, timed over the last GPU_MOE_ITERS - 8 = 4 steps after
# 8 of warm-up; bench/moe_table.py prints both rows and the ratio (-> moe_table.md). Both run
# with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. If train_gpt fails (out of memory),
# it runs again at half the micro-batch (train_gpt_moe_half.log); the reference retries its
# first step at half the micro-batch itself (--fallback-micro-batch) and says so.
# 6.92 B parameters at 18 bytes each (bf16 parameters, the bf16 flat gradient buffer and the
# gradient partition in bf16 by data_types.grad_accum_dtype, fp32 master and Adam) are 125 GB,
# which leaves room for micro-batch 2 (with the fp32 partition, 20 bytes, only for 1); MFU counts
# 6 x 1.28 B active parameters + 12 L h s: 8.5 GFLOP per token.
# Predicted (moeperf, fourteenth session; thirteenth: 27,715 tokens/s, 23.8%, micro-batch 1 x 8;
# docs/PERFORMANCE.md has the arithmetic): dscpp ~36,500 tokens/s (~31% active MFU): half the
# gradient accumulations of the 6.4 B expert weights a step (each a 41 GB add), no fp32 gradient
# partition, grouped GEMMs of 512 rows per expert on average instead of 256, the fused SwiGLU
# and router; the PyTorch reference ~26,000 (its weight casts, fp32 gradient casts and
# accumulations), so ~1.4x.
moe_ds() {  # the ds_config at half the micro-batch (the same global batch), for the retry
  python3 - "$1" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_micro_batch_size_per_gpu"] = max(1, c["train_micro_batch_size_per_gpu"] // 2)
json.dump(c, open(sys.argv[2], "w"))
PY
}
moe_train() {  # moe_train DS_CONFIG [train_gpt flags]
  local limit=900
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && limit=$((GPU_DEADLINE_S - SECONDS - ${GPU_MOE_REF_S:-130}))  # the rest: the reference
  [ "$limit" -ge 60 ] || { echo "moe_train: ${limit} s left before GPU_DEADLINE_S: not run"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 10 "$limit" ./build-cuda/launcher/dscpp \
    --num_gpus 1 --master_port 29765 ./build-cuda/examples/train_gpt --model-config model_zoo/configs/moe_1gpu.yaml \
    --train-data-path .gpu/corpus/fortunes_text_document --deepspeed_config "$1" \
    --train-iters "${GPU_MOE_ITERS:-12}" --log-interval 4 $(moe_warmup_flags --lr-warmup-iters) "${@:2}"
}
# Balanced routing: without an lr warmup the router collapses within these few steps (load
# balance 8.00 by step 8 on both sides, every token on the same 8 experts), which a long run's
# bias balancing keeps from happening; a warmup of GPU_MOE_WARMUP steps (default 1000, 0: none)
# keeps it near its initial balance. Both sides get the same.
moe_warmup_flags() {  # moe_warmup_flags FLAG_NAME
  local w=${GPU_MOE_WARMUP:-1000}
  [ "$w" -gt 0 ] || return 0
  if [ "$1" = --lr-warmup-iters ]; then echo "--lr-warmup-iters $w --lr-decay-style constant"; else echo "$1 $w"; fi
}
moe_train_collapsed() { GPU_MOE_WARMUP=0 moe_train "$@"; }
moe_reference() {
  local limit=900 micro batch
  [ "${GPU_DEADLINE_S:-0}" -gt 0 ] && limit=$((GPU_DEADLINE_S - SECONDS - 10))
  [ "$limit" -ge 60 ] || { echo "moe_reference: ${limit} s left before GPU_DEADLINE_S: not run"; return 1; }
  micro=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_micro_batch_size_per_gpu"])' "$moe_cfg")
  batch=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_batch_size"])' "$moe_cfg")
  PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 10 "$limit" python3 \
    bench/pytorch_moe_gpt.py --model-config model_zoo/configs/moe_1gpu.yaml \
    --data-path .gpu/corpus/fortunes_text_document --micro-batch "$micro" --accumulation $((batch / micro)) \
    --fallback-micro-batch $((micro / 2)) --warmup $(( ${GPU_MOE_ITERS:-12} - 4 )) --steps 4 \
    $(moe_warmup_flags --lr-warmup-steps)
}
if [ "${GPU_MOE:-0}" = 1 ] && [ "$gpus" -ge 1 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  moe_cfg=${GPU_MOE_DS:-bench/configs/moe_1gpu_bf16_zero1.json}
  step train_gpt_moe moe_train "$moe_cfg"
  if ! grep -q "train_gpt\] step ${GPU_MOE_ITERS:-12}/" "$out/train_gpt_moe.log"; then
    moe_ds "$moe_cfg" "$out/moe_half.json" && moe_cfg=$out/moe_half.json
    step train_gpt_moe_half moe_train "$moe_cfg"
  fi
  # The experts' weight-gradient paths beside the default in this call (ops/grouped_weight_grad.h).
  for mode in ${GPU_MOE_WGRAD:-}; do
    step "train_gpt_moe_wgrad_$mode" moe_train "$moe_cfg" --grouped-wgrad "$mode"
  done
  for extra in ${GPU_MOE_DS_MORE:-}; do
    step "train_gpt_moe_$(basename "$extra" .json)" moe_train "$extra"
  done
  [ "${GPU_MOE_COLLAPSED:-0}" = 1 ] && step train_gpt_moe_collapsed moe_train_collapsed "$moe_cfg"
  step pytorch_moe moe_reference
  moe_log=$out/train_gpt_moe.log
  [ -f "$out/train_gpt_moe_half.log" ] && moe_log=$out/train_gpt_moe_half.log
  python3 bench/moe_table.py "$moe_log" "$out/pytorch_moe.log" >"$out/moe_table.md" 2>&1
fi
# GPU_BIG=1: then a model sized to fit 2 H200s at stage 3 but not at stage 2 (GPU_BIG_MODEL,
# default model_zoo/configs/gpt_17B.json, 17.26 B), at stage 3 and then at stage 2.
if [ "${GPU_BIG:-0}" = 1 ] && [ "$gpus" -ge 2 ] && [ -f .gpu/corpus/fortunes_text_document.idx ]; then
  big=${GPU_BIG_MODEL:-model_zoo/configs/gpt_17B.json}
  sed 's/"stage": 3/"stage": 2/' bench/configs/gpt_13B_zero3.json >"$out/gpt_13B_zero2.json"
  step gptbig_zero3 gpt13b bench/configs/gpt_13B_zero3.json "" "$big"
  step gptbig_zero2 gpt13b "$out/gpt_13B_zero2.json" "" "$big"
fi
# GPU_BASELINE: the same rows of this tree and of the baseline, alternating, so that drift of
# the machine falls on both alike; each tree's row logs in a folder of its own.
baseline_compare() {
  local row
  for row in ${BASELINE_ROWS:-d0x1 d2x1 d3x1}; do
    ROWS=$row LOGDIR=$out/cmp_new BUILD_DIR=build-cuda bash bench/gpt_table.sh >/dev/null || return 1
    ROWS=$row LOGDIR=$out/cmp_base BUILD_DIR="$GPU_BASELINE/build-cuda" bash bench/gpt_table.sh >/dev/null || return 1
  done
  python3 bench/compare_rows.py "$out/cmp_new" "$out/cmp_base" ${BASELINE_ROWS:-d0x1 d2x1 d3x1} |
    tee "$out/baseline_compare.md"
}
[ -n "${GPU_BASELINE:-}" ] && [ -f .gpu/corpus/fortunes_text_document.idx ] && [ "$gpus" -ge 1 ] &&
  step baseline_compare baseline_compare
# The suite last: the figures above come back even if the call's time runs out here.
ctest_limit=100000
[ "${GPU_DEADLINE_S:-0}" -gt 0 ] && ctest_limit=$((GPU_DEADLINE_S - SECONDS - 10))
# Left out: the DeepSpeed comparisons and CPU oracles (CI runs them), and, with fewer GPUs than
# their ranks, the multi-rank oracles that would put two NCCL ranks on one GPU.
gpu_excluded="DeepSpeed|AgreesWith|SingleRankOracle|Oracle_|TokenIdsEqual"
[ "$gpus" -lt 2 ] && gpu_excluded+="|Universal_|RecoveryScript|engine.Offload|pipe.Engine|pipe.DeadStage|pipe.Fp16|SecondInitialize|TrainGptFlags|TrainGptMonitors"
[ "$tests" = 1 ] && [ "$ctest_limit" -gt 30 ] && step ctest timeout -k 5 "$ctest_limit" bash -c "cd build-cuda && ctest --output-on-failure -j 8 --timeout 300 -E \"$gpu_excluded\""
echo "=== dscpp GPU run, $(date -u +%Y-%m-%dT%H:%MZ) ==="
cat "$out/report.log" 2>/dev/null
grep -E "tests passed|tests failed" "$out/ctest.log" 2>/dev/null
grep -E "PASSED|FAILED" "$out/nccl_collectives.log" 2>/dev/null | sort | uniq -c
cat "$out/comm_bench.log" 2>/dev/null
grep -vE "^\[|^dscpp" "$out/comm_ag.log" 2>/dev/null
grep -vE "^\[" "$out/engine_bf16.log" 2>/dev/null | grep -E "FAIL|passed|reference"
grep -E "PASSED|FAILED" "$out/fused_adam_test.log" "$out/engine_cases.log" 2>/dev/null
tail -12 "$out/fused_adam.log" 2>/dev/null
grep -E "PASSED|FAILED" "$out/kernels_cuda.log" 2>/dev/null
tail -40 "$out/kernels_bench.log" 2>/dev/null
grep -E "PASSED|FAILED" "$out/moe_kernels.log" 2>/dev/null
grep -hE "PASSED|FAILED" "$out/relayout_tests.log" 2>/dev/null
tail -12 "$out/moe_bench.log" 2>/dev/null
tail -11 "$out/moe_overlap.log" 2>/dev/null
grep -E "PASS|FAIL|passed" "$out/checkpoint_resume.log" 2>/dev/null
grep -E "train_gpt\] (GPT|step)" "$out/gpt_dscpp.log" 2>/dev/null
grep -h "^pytorch" "$out"/gpt_pytorch_*.log 2>/dev/null
grep -E "^gpt_table: " "$out/gpt_table.log" 2>/dev/null  # each row's wall time
cat "$out/gpt_table.md" 2>/dev/null
cat "$out/gpt_table_67b.md" 2>/dev/null
cat "$out/offload_table.md" 2>/dev/null
tail -12 "$out/cpu_adam.log" 2>/dev/null
grep -E "params per GPU|fwd MACs per GPU|fwd flops per GPU|fwd latency|bwd latency|step latency|iter latency|FLOPS per GPU|samples/second" "$out/flops_profile.log" 2>/dev/null | head -16
cat "$out/baseline_compare.md" 2>/dev/null
for f in "$out"/profile_summary*.md; do
  [ -f "$f" ] && { echo "## $(basename "$f")"; grep -E "^# GPU|GPU span|s GPU work|exposed|compute stream" "$f"; }
done
[ -f "$out/memory_peak.md" ] && head -40 "$out/memory_peak.md"
for f in "$out"/gpt13b_*.log "$out"/gptbig_*.log "$out"/train_gpt_moe*.log; do
  [ -f "$f" ] && { echo "## $(basename "$f")"; grep -hE "train_gpt\] (GPT|start-up|step|memory)|out of memory|Error" "$f" | cut -c1-400; }
done
grep -hE "^pytorch_moe|out of memory" "$out/pytorch_moe.log" 2>/dev/null | cut -c1-400
cat "$out/moe_table.md" 2>/dev/null
printf '%s\n' "${summary[@]}"
# At most 8 files come back from a device call: pack the logs when there are more.
if [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
  (cd "$out" && find . -name '*.log' -print0 | tar czf logs.tgz --null -T - --remove-files)
fi
