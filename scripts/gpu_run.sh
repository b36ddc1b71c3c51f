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
step ctest bash -c "cd build-cuda && ctest --output-on-failure -j 8 --timeout 300 -E \"DeepSpeed|AgreesWith|SingleRankOracle\""
nvidia-smi >"$out/nvidia-smi.log" 2>&1 || true
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  # The collectives suite over NCCL on CUDA tensors, then nccl-tests-style figures.
  step nccl_collectives env DSCPP_TEST_BACKEND=nccl ./build-cuda/launcher/dscpp --num_gpus 2 \
    --master_port 29651 ./build-cuda/tests/comm/comm_collectives
  step comm_bench ./build-cuda/launcher/dscpp --num_gpus 2 --master_port 29652 \
    ./build-cuda/tools/comm_bench --backend nccl --dtype bf16 --ops all_reduce,reduce_scatter,all_gather \
    --min-bytes 1048576 --max-bytes 1073741824 --iters 20 --warmup 5 --check
  step engine_bf16 python3 tests/engine/bf16_gpu_oracle.py --launcher ./build-cuda/launcher/dscpp \
    --train ./build-cuda/tests/engine/engine_train
fi
[ -x ./build-cuda/bench/fused_adam_bench ] && step fused_adam ./build-cuda/bench/fused_adam_bench
echo "=== dscpp GPU run, $(date -u +%Y-%m-%dT%H:%MZ) ==="
cat "$out/report.log" 2>/dev/null
grep -E "tests passed|tests failed" "$out/ctest.log" 2>/dev/null
grep -E "PASSED|FAILED" "$out/nccl_collectives.log" 2>/dev/null | sort | uniq -c
cat "$out/comm_bench.log" 2>/dev/null
grep -vE "^\[" "$out/engine_bf16.log" 2>/dev/null | tail -5
tail -12 "$out/fused_adam.log" 2>/dev/null
printf '%s\n' "${summary[@]}"
