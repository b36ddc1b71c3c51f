#!/usr/bin/env bash
# Two jobs (2 and 3 Gloo ranks) started at the same moment on one --master_port, many times.
# Neither may ever join the other: a job that succeeds saw exactly its own world (every rank
# sums to its own size), a job that fails says why naming the port, and in every trial at
# least one job succeeds (the loser must not take the winner down with it).
# PORT 0: one port free now, kept for every trial (the jobs' launchers are given it, not 0).
launcher=$1 program=$2 port=$3 trials=${4:-10}
if [ "$port" = 0 ]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL (trial $t): $*"; cat "$dir"/job*.log; exit 1; }
wins=0 losses=0
for t in $(seq 1 "$trials"); do
  "$launcher" --num_gpus 2 --master_port "$port" "$program" sum >"$dir/job2.log" 2>&1 &
  a=$!
  "$launcher" --num_gpus 3 --master_port "$port" "$program" sum >"$dir/job3.log" 2>&1 &
  b=$!
  wait $a; rc2=$?
  wait $b; rc3=$?
  ok=0
  for n in 2 3; do
    rc_var=rc$n
    log="$dir/job$n.log"
    grep -E "saw a world of" "$log" | grep -vq "saw a world of $n summing to $n$" &&
      fail "job of $n ranks saw another world: $(grep 'saw a world' "$log" | sort | uniq -c)"
    if [ "${!rc_var}" = 0 ]; then
      [ "$(grep -c "saw a world of $n summing to $n" "$log")" = "$n" ] || fail "job of $n exited 0 without $n ranks"
      ok=$((ok + 1)); wins=$((wins + 1))
    else
      grep -q "port $port" "$log" || fail "job of $n ranks failed without naming port $port"
      losses=$((losses + 1))
    fi
  done
  [ $ok -ge 1 ] || fail "both jobs failed"
done
echo "PASS: $trials trials, $wins jobs completed, $losses refused naming port $port"
