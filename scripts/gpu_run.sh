#!/usr/bin/env bash
# One call on the GPU machine (see ../shared/GPU.md): unpack the Debian packages it lacks
# (carried in .gpu/: Boost.Program_options' library, gloo's headers), build the CUDA
# variant, run the environment report and the test suite, then GPU tests and benchmarks
# as they exist. Full logs go to $OUT (or ./gpu-out); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
deps=/opt/deps
mkdir -p "$deps"
for f in .gpu/*.deb; do dpkg -x "$f" "$deps"; done
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
[ -d /opt/gcc/bin ] && export PATH=/opt/gcc/bin:$PATH
summary=()
step() {  # step NAME COMMAND...: runs it, logs to $out/NAME.log, records the outcome
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then summary+=("ok    $name ($((SECONDS - t0)) s)")
  else summary+=("FAIL  $name ($((SECONDS - t0)) s): see $name.log"); fi
}
configure() {
  cmake -S . -B build-cuda -G Ninja -DDSCPP_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DDSCPP_PYTHON="$(command -v python3)" -DCMAKE_PREFIX_PATH="$deps/usr" \
    -DDSCPP_GLOO_INCLUDE="$deps/usr/include" \
    -DDSCPP_BOOST_PO_LIBRARY="$deps/usr/lib/x86_64-linux-gnu/libboost_program_options.so.1.74.0" \
    -DDSCPP_BOOST_PO_INCLUDE="$deps/usr/include"
}
step configure configure
# -k 0: one target that fails to build must not keep the others from being tested.
step build ninja -C build-cuda -k 0 -j "$(nproc)"
step report ./build-cuda/tools/dscpp_report
nvidia-smi >"$out/nvidia-smi.log" 2>&1 || true
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  # The collectives suite over NCCL on CUDA tensors, then nccl-tests-style figures.
  step nccl_collectives env DSCPP_TEST_BACKEND=nccl ./build-cuda/launcher/dscpp --num_gpus 2 \
    --master_port 29651 ./build-cuda/tests/comm/comm_collectives
  [ "${GPU_BENCH_COMM:-0}" = 1 ] && step comm_bench ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29652 \
    ./build-cuda/tools/comm_bench --backend nccl --dtype bf16 --ops all_reduce,reduce_scatter,all_gather \
    --min-bytes 1048576 --max-bytes 1073741824 --iters 20 --warmup 5 --check
  step engine_bf16 python3 tests/engine/bf16_gpu_oracle.py --launcher ./build-cuda/launcher/dscpp \
    --train ./build-cuda/tests/engine/engine_train
  # Checkpoints over NCCL: bit-exact resume at stages 0-2.
  step checkpoint_resume python3 tests/checkpoint/checkpoint_oracle.py --part resume \
    --launcher ./build-cuda/launcher/dscpp --train ./build-cuda/tests/engine/engine_train \
    --zero-to-fp32 ./build-cuda/tools/zero_to_fp32
fi
if [ "${GPU_BENCH_ADAM:-0}" = 1 ] && [ -x ./build-cuda/bench/fused_adam_bench ]; then
  step fused_adam ./build-cuda/bench/fused_adam_bench
fi
# GPT 1.3B training throughput: dscpp's train_gpt beside plain PyTorch in the same call
# (GPU.md: compare only figures of one call). Data: the fortunes corpus carried in .gpu/corpus.
gpt_bench() {  # gpt_bench NAME RANKS DS_CONFIG
  ./build-cuda/launcher/dscpp --num_gpus "$2" --master_port $((29700 + $2)) ./build-cuda/examples/train_gpt \
    --model-config bench/configs/gpt_1.3B_bench.json --train-data-path .gpu/corpus/fortunes_text_document \
    --deepspeed_config "$3" --train-iters "${GPT_ITERS:-30}" --log-interval 10
}
if [ -f .gpu/corpus/fortunes_text_document.idx ] && [ "$gpus" -ge 1 ]; then
  r=$(( gpus >= 2 ? 2 : 1 ))
  step gpt_dscpp gpt_bench gpt_dscpp "$r" ds_configs/gpt_bf16_zero2.json
  step gpt_pytorch_fsdp2 python3 -m torch.distributed.run --nproc_per_node "$r" --master_port 29720 \
    bench/pytorch_gpt.py --model-config bench/configs/gpt_1.3B_bench.json --mode fsdp2 --steps 20 --warmup 10
  step gpt_pytorch_ddp python3 -m torch.distributed.run --nproc_per_node "$r" --master_port 29721 \
    bench/pytorch_gpt.py --model-config bench/configs/gpt_1.3B_bench.json --mode ddp --steps 20 --warmup 10
fi
# The suite last: the figures above come back even if the call's time runs out here.
step ctest bash -c "cd build-cuda && ctest --output-on-failure -j 8 --timeout 300 -E \"DeepSpeed|AgreesWith|SingleRankOracle|Oracle_|TokenIdsEqual\""
echo "=== dscpp GPU run, $(date -u +%Y-%m-%dT%H:%MZ) ==="
cat "$out/report.log" 2>/dev/null
grep -E "tests passed|tests failed" "$out/ctest.log" 2>/dev/null
grep -E "PASSED|FAILED" "$out/nccl_collectives.log" 2>/dev/null | sort | uniq -c
cat "$out/comm_bench.log" 2>/dev/null
grep -vE "^\[" "$out/engine_bf16.log" 2>/dev/null | tail -5
tail -12 "$out/fused_adam.log" 2>/dev/null
grep -E "PASS|FAIL|passed" "$out/checkpoint_resume.log" 2>/dev/null
grep -E "train_gpt\] (GPT|step)" "$out/gpt_dscpp.log" 2>/dev/null
grep -h "^pytorch" "$out"/gpt_pytorch_*.log 2>/dev/null
printf '%s\n' "${summary[@]}"
