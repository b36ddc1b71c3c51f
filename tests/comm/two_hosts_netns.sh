#!/usr/bin/env bash
# Two hosts for real, on one machine: two network namespaces joined by a veth pair (iproute2),
# an sshd in each, and a 2-node job of 4 ranks started through the ssh runner and then the
# pdsh runner from host A; the collectives suite runs across the two hosts over TCP (Gloo
# on the veth, named in .deepspeed_env as DeepSpeed users name it). Then a job whose rank 3
# (on host B) dies: the whole job must end non-zero within the grace period and leave no rank
# behind on either host.
#
#   two_hosts_netns.sh LAUNCHER COLLECTIVES_PROGRAM
#
# Needs root, `ip netns`, sshd and pdsh; without them it exits 77 (ctest's skip) saying which
# is missing. The hosts share this machine's file system, as cluster nodes share a home.
set -u
launcher=$(realpath "$1")
program=$(realpath "$2")
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "no iproute2"
[ -x /usr/sbin/sshd ] || skip "no sshd (Debian's openssh-server)"
command -v pdsh >/dev/null || skip "no pdsh"
command -v ssh >/dev/null || skip "no ssh client"

id=$$
nsa=dscppA$id nsb=dscppB$id
dir=$(mktemp -d)
cleanup() {
  for ns in $nsa $nsb; do
    [ -f "$dir/sshd-$ns.pid" ] && kill "$(cat "$dir/sshd-$ns.pid")" 2>/dev/null
    ip netns pids $ns 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del $ns 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add $nsa 2>/dev/null || skip "cannot create network namespaces here"
ip netns add $nsb || exit 1
# One veth pair; both ends get the same name in their namespace, so that one
# GLOO_SOCKET_IFNAME serves every host.
ip link add va$id type veth peer name vb$id || skip "cannot create a veth pair here"
ip link set va$id netns $nsa && ip link set vb$id netns $nsb || exit 1
ip -n $nsa link set va$id name dsnet0 && ip -n $nsb link set vb$id name dsnet0 || exit 1
ip -n $nsa addr add 10.77.0.1/24 dev dsnet0 && ip -n $nsb addr add 10.77.0.2/24 dev dsnet0 || exit 1
for ns in $nsa $nsb; do ip -n $ns link set lo up && ip -n $ns link set dsnet0 up || exit 1; done

# sshd per host: its own host key, root's login by our key only.
ssh-keygen -q -t ed25519 -N "" -f "$dir/hostkey" && ssh-keygen -q -t ed25519 -N "" -f "$dir/key" || exit 1
cp "$dir/key.pub" "$dir/authorized_keys"
mkdir -p /run/sshd
start_sshd() {  # NS ADDRESS
  cat >"$dir/sshd-$1.conf" <<EOF
ListenAddress $2
HostKey $dir/hostkey
PidFile $dir/sshd-$1.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
EOF
  ip netns exec "$1" /usr/sbin/sshd -f "$dir/sshd-$1.conf" -E "$dir/sshd-$1.log" || return 1
}
start_sshd $nsa 10.77.0.1 && start_sshd $nsb 10.77.0.2 || { cat "$dir"/sshd-*.log; exit 1; }
# The client's settings (a cluster's ~/.ssh/config): ssh reads ~ from the password file, not
# $HOME, so an ssh first in PATH adds them; pdsh's ssh module runs the same ssh.
mkdir -p "$dir/bin"
cat >"$dir/bin/ssh" <<EOF
#!/bin/sh
exec /usr/bin/ssh -i $dir/key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \\
  -o LogLevel=ERROR -o BatchMode=yes -o ConnectTimeout=10 "\$@"
EOF
chmod +x "$dir/bin/ssh"
for i in $(seq 50); do  # sshd listens within moments
  ip netns exec $nsa "$dir/bin/ssh" 10.77.0.2 true 2>/dev/null && break
  sleep 0.1
done

mkdir -p "$dir/job"
cd "$dir/job" || exit 1
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' >hostfile
echo "GLOO_SOCKET_IFNAME=dsnet0" >.deepspeed_env  # exported to every node, as DeepSpeed does
run_job() {  # LOG RUNNER PROGRAM...: the job, started on host A
  local log=$1 runner=$2
  shift 2
  timeout -k 5 240 ip netns exec $nsa env PATH="$dir/bin:$PATH" OMP_NUM_THREADS=1 \
    "$launcher" -H hostfile --launcher "$runner" --master_port 29641 "$@" >"$log" 2>&1
}
status=0
for runner in ssh pdsh; do
  run_job "$dir/$runner.log" $runner "$program"
  rc=$?
  passed=$(grep -c "PASSED" "$dir/$runner.log")
  worlds=$(grep -c "of a world of 4 ranks" "$dir/$runner.log")
  echo "$runner runner: exit $rc, $passed ranks passed, $worlds ranks saw a world of 4"
  if [ "$rc" != 0 ] || [ "$passed" != 4 ] || [ "$worlds" != 4 ]; then
    status=1
    tail -30 "$dir/$runner.log"
  fi
done

# Rank 3 lives on host B (slots 2 and 2) and dies; the others wait for ever.
cat >"$dir/job/die_or_wait.sh" <<'EOF'
#!/bin/sh
if [ "$RANK" = 3 ]; then sleep 1; echo "rank 3 dies"; exit 3; fi
exec sleep 600
EOF
chmod +x "$dir/job/die_or_wait.sh"
for runner in ssh pdsh; do
  t0=$(date +%s)
  run_job "$dir/$runner-die.log" $runner --no_python ./die_or_wait.sh
  rc=$?
  secs=$(($(date +%s) - t0))
  sleep 1  # what was sent a signal has gone by now
  left=$(for ns in $nsa $nsb; do ip netns pids $ns; done | xargs -r ps -o args= -p 2>/dev/null | grep -c "sleep 600")
  echo "$runner runner, rank 3 dead: exit $rc after $secs s, $left ranks left"
  if [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$left" != 0 ] || [ "$secs" -gt 60 ] ||
    ! grep -q "rank 3 dies" "$dir/$runner-die.log"; then
    status=1
    tail -20 "$dir/$runner-die.log"
  fi
done
[ $status = 0 ] && echo "two hosts: PASSED"
exit $status
