#!/usr/bin/env bash
# A rank SIGSTOPped in the middle of training (3 Gloo ranks, a 10 s collective timeout):
# the job must end non-zero within the timeout plus the launcher's kill grace (and start-up
# slack), and the error must name the stopped rank (2) as the one that did not arrive.
launcher=$1 program=$2 port=$3
timeout_s=10 grace_s=3 slack_s=12
start=$(date +%s)
out=$(DSCPP_KILL_GRACE_S=$grace_s "$launcher" --num_gpus 3 --master_port "$port" "$program" stop $timeout_s 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "comm_failures|dscpp:" | head -20
echo "exit $rc after $elapsed s"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" != 0 ] || fail "the job exited 0"
[ "$elapsed" -le $((timeout_s + grace_s + slack_s)) ] || fail "took $elapsed s"
echo "$out" | grep -q "caught at step 20: all_reduce on group 'world'.*silent rank(s) 2 of group 'world' at collective #21: rank 2 (global 2) did not arrive: its last reported collective is #[0-9]* (all_reduce), no heartbeat for" ||
  fail "no error naming rank 2 as the silent one"
echo "$out" | grep -q "silent rank(s) [01]" && fail "a live rank was named"
echo PASS
