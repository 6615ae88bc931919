#!/usr/bin/env bash
# A real one-node Slurm on this machine, for the launcher's real-Slurm tests (tests/test_slurm_real.py)
# and for anyone who wants to try the launch scripts without a cluster. Needs root and Debian/Ubuntu
# packages (apt-get); no systemd: the daemons run in the background, state under $STATE.
#
#   bash tests/slurm/one_node_slurm.sh up      # install if missing, write the config, start, wait for the node
#   bash tests/slurm/one_node_slurm.sh down    # stop the daemons (jobs die with them)
#   bash tests/slurm/one_node_slurm.sh status
#
# The node is deliberately unlike a laptop and like a cluster: its Slurm name (gpu01) is not the host
# name, it advertises 8 GPUs (gres.conf, AutoDetect=off, files that exist but are no devices), and
# has partitions for preemption tests: `low` (default, PreemptMode=REQUEUE, GraceTime $AVSPO_CI_GRACE s)
# and `nograce` (GraceTime 0), both preempted by `high`. Jobs keep their records for an hour (MinJobAge), so
# `scontrol show job` gives the exit state without slurmdbd.
set -euo pipefail
STATE=${AVSPO_CI_SLURM_STATE:-/var/lib/avspo-ci-slurm}
NODE=gpu01
GRACE=${AVSPO_CI_GRACE:-60}
cmd=${1:-up}

die() { printf 'one_node_slurm: error: %s\n' "$*" >&2; exit 2; }

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null && return
  [ "$(id -u)" = 0 ] || die "installing Slurm needs root (apt-get)"
  command -v apt-get >/dev/null || die "no apt-get: install slurmctld, slurmd, slurm-client and munge yourself"
  local t=$SECONDS
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge \
    >"$STATE/apt.log" 2>&1 || { tail -n 20 "$STATE/apt.log" >&2; die "apt-get install failed (log: $STATE/apt.log)"; }
  echo "one_node_slurm: installed slurmctld, slurmd, slurm-client, munge in $((SECONDS - t)) s"
}

write_config() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
  mkdir -p /etc/slurm "$STATE"/{ctld,d,gpus,log}
  for i in 0 1 2 3 4 5 6 7; do : >"$STATE/gpus/nvidia$i"; done
  cat >/etc/slurm/slurm.conf <<EOF
# written by tests/slurm/one_node_slurm.sh
ClusterName=avspo-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
MinJobAge=3600
KillWait=10
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
DefMemPerCPU=1000
NodeName=$NODE NodeHostname=$host CPUs=$cpus RealMemory=$mem Gres=gpu:8 State=UNKNOWN
PartitionName=low Nodes=$NODE Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE OverSubscribe=NO
PartitionName=nograce Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0 OverSubscribe=NO
PartitionName=high Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  {
    echo "AutoDetect=off"
    for i in 0 1 2 3 4 5 6 7; do echo "NodeName=$NODE Name=gpu File=$STATE/gpus/nvidia$i"; done
  } >/etc/slurm/gres.conf
  echo "ConstrainDevices=no" >/etc/slurm/cgroup.conf
}

start() {
  [ "$(id -u)" = 0 ] || die "starting slurmctld/slurmd needs root"
  mkdir -p "$STATE"
  install
  write_config
  if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
  fi
  if pgrep -x slurmctld >/dev/null; then scontrol reconfigure >/dev/null 2>&1 || true; else slurmctld -i; fi
  pgrep -x slurmd >/dev/null || slurmd -N "$NODE"
  local t
  for t in $(seq 1 60); do
    if sinfo -h -n "$NODE" -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "one_node_slurm: node $NODE (host $(hostname -s)) up: $(sinfo -h -n "$NODE" -o '%c CPUs, %m MB, %G')"
      return 0
    fi
    [ "$t" = 10 ] && scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
    sleep 1
  done
  sinfo -N -l >&2 || true
  tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
  die "the node did not become idle within 60 s (logs: $STATE/log)"
}

stop() {
  scancel --user=root 2>/dev/null || true
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  sleep 1
}

case "$cmd" in
  up) start ;;
  down) stop ;;
  status) sinfo -N -l; squeue ;;
  *) die "usage: one_node_slurm.sh up|down|status" ;;
esac
