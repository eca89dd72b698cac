#!/usr/bin/env bash
# A one-node SLURM on this machine, for the tests marked `slurm` (tests/test_slurm.py) and for
# trying `launcher: kind: slurm` without a cluster:
#
#   bash scripts/slurm-local.sh start    # install slurm-wlm and munge if missing (apt-get, as
#                                        # root), write /etc/slurm/slurm.conf for this machine,
#                                        # start munged, slurmctld, slurmd; wait for `sinfo` idle
#   bash scripts/slurm-local.sh stop     # stop the three daemons by their pids
#   bash scripts/slurm-local.sh status   # running or not (exit status 0 / 1)
#
# One partition, `debug`, the machine as its one node (its CPUs and memory as the kernel reports
# them). No accounting database: finished jobs are known to `scontrol` for MinJobAge seconds, and
# lmrepro reads a job's outcome from its run directory, not from sacct. The state (spool, logs,
# pid files) lives under $LMREPRO_SLURM_DIR (default /tmp/lmrepro-slurm).
set -euo pipefail

STATE=${LMREPRO_SLURM_DIR:-/tmp/lmrepro-slurm}
CONF=/etc/slurm/slurm.conf
MUNGE_SOCKET=/run/munge/munge.socket.2

say() { echo "slurm-local: $*"; }

install_missing() {
  local missing=()
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v sinfo >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    say "needs ${missing[*]}: run as root, or install them (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  say "installing ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

alive() {   # alive PIDFILE: the pid in it is a running process
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

write_conf() {
  local host cpus mem_mb
  host=$(hostname -s)
  cpus=$(nproc --all)
  # RealMemory a little under the total, as slurmd measures it (a node reporting less than its
  # configured memory is drained)
  mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.95)}' /proc/meminfo)
  mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
  cat > "$CONF" <<EOF
# written by lmrepro's scripts/slurm-local.sh: one node, this machine
ClusterName=lmrepro-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  say "$CONF: node $host, $cpus CPUs, $mem_mb MB, partition debug"
}

start_munge() {
  if [ -S "$MUNGE_SOCKET" ] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    return 0     # a munged already answers (this script's or the system's)
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chmod 0400 /etc/munge/munge.key
  munged --force --pid-file="$STATE/munged.pid" --log-file="$STATE/munged.log"
}

wait_idle() {
  local deadline=$((SECONDS + ${LMREPRO_SLURM_WAIT_S:-120})) state=""
  while [ $SECONDS -lt $deadline ]; do
    state=$(sinfo -h -o %T 2>/dev/null | head -1 || true)
    case "$state" in
      idle|mixed|allocated) say "node $state after ${SECONDS}s"; return 0 ;;
      drain*|down*) scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  say "the node is not idle after ${LMREPRO_SLURM_WAIT_S:-120}s (sinfo: '${state}'); see" \
      "$STATE/slurmctld.log and $STATE/slurmd.log" >&2
  return 1
}

start() {
  install_missing
  mkdir -p "$STATE"
  if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid"; then
    say "already running"
    wait_idle
    return
  fi
  write_conf
  start_munge
  alive "$STATE/slurmctld.pid" || slurmctld -i
  alive "$STATE/slurmd.pid" || slurmd
  wait_idle
}

stop_one() {   # stop_one NAME PIDFILE: SIGTERM, then SIGKILL after 10 s
  local pidfile=$2 pid
  alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill "$pid"
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$pidfile"
  say "stopped $1 ($pid)"
}

stop() {
  stop_one slurmd "$STATE/slurmd.pid"
  stop_one slurmctld "$STATE/slurmctld.pid"
  stop_one munged "$STATE/munged.pid"    # only the munged this script started
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" \
            && { say "running"; sinfo; } || { say "not running"; exit 1; } ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
