#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine (Debian's slurm-wlm and munge, as root):
# munged, slurmctld and slurmd, one partition `debug` holding this node with all its CPUs.
# Used by .ci/slurm.sh; safe to run twice (a running cluster is left as it is).
#   bash .ci/slurm-cluster.sh          start (installs the packages first if missing)
#   bash .ci/slurm-cluster.sh stop     stop the daemons
# Exits 3, saying why, where it cannot run: not root, or no apt-get.
set -euo pipefail
if [ "${1:-}" = stop ]; then
  pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "SLURM cluster not started: needs root and apt-get (Debian's slurm-wlm, munge)"; exit 3
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
fi
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
state=/var/lib/slurm-flashnum
mkdir -p "$state/ctld" "$state/d" /var/log/slurm /run/munge
chown -R slurm:slurm "$state" /var/log/slurm
chown munge:munge /run/munge
# no cgroups (a container may not delegate them): processes tracked through /proc
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=flashnum
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
# scancel sends SIGTERM, then SIGKILL KillWait s later; submitit's job wrapper ignores the
# SIGTERM (it expects preemption), so a short KillWait makes a cancelled task die promptly
KillWait=2
MpiDefault=none
SchedulerType=sched/backfill
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c "munged --force"
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
    echo "SLURM cluster up: node $host, $cpus CPUs, partition debug"; exit 0
  fi
  sleep 1
done
echo "SLURM cluster did not come up; last lines of its logs:"
tail -5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log || true
exit 1
