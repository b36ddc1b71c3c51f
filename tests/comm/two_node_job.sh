#!/usr/bin/env bash
# Starts node 0 and node 1 of a two-host job by hand (--no_ssh --node_rank K), both on this
# machine, and succeeds only if both launchers (and so all 4 ranks) succeed.
set -u
launcher=$1
program=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'localhost slots=2\n127.0.0.1 slots=2\n' >"$dir/hostfile"
common=(-H "$dir/hostfile" --no_ssh --master_addr 127.0.0.1 --master_port 29624)
"$launcher" "${common[@]}" --node_rank 0 "$program" >"$dir/node0.log" 2>&1 &
p0=$!
"$launcher" "${common[@]}" --node_rank 1 "$program" >"$dir/node1.log" 2>&1 &
p1=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
cat "$dir/node0.log" "$dir/node1.log" | grep -E "PASSED|FAILED|Failure|error" | sort | uniq -c
passed=$(cat "$dir/node0.log" "$dir/node1.log" | grep -c "PASSED")
worlds=$(cat "$dir/node0.log" "$dir/node1.log" | grep -c "of a world of 4 ranks")
echo "node 0 exit $rc0, node 1 exit $rc1, $passed ranks passed, $worlds ranks saw a world of 4"
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] && [ "$passed" = 4 ] && [ "$worlds" = 4 ]
