#!/usr/bin/env bash
# A stage that dies mid-step (the last of 2 stages exits inside a forward while the first
# waits on it): the job must end non-zero within the group timeout plus the launcher's kill
# grace (and start-up slack), and no rank of it may be left running.
launcher=$1 program=$2 port=$3
timeout_s=20 grace_s=3 slack_s=15
start=$(date +%s)
out=$(DEEPSPEED_TIMEOUT=$((timeout_s / 60 + 1)) DSCPP_KILL_GRACE_S=$grace_s \
  "$launcher" --num_gpus 2 --master_port "$port" "$program" --mode die 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "pipe_train|dscpp" | head -20
echo "exit $rc after $elapsed s"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" != 0 ] || fail "the job exited 0"
[ "$elapsed" -le $((60 + grace_s + slack_s)) ] || fail "took $elapsed s"
echo "$out" | grep -q "the last stage exits mid-step" || fail "the stage did not die as planned"
sleep 1
pgrep -f -- "$program --mode die" >/dev/null && fail "a rank is left running"
echo PASS
