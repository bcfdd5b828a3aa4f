#!/usr/bin/env bash
# A one-node SLURM on localhost for tests/test_launch.py (and .ci/run): munged, slurmctld and slurmd started directly
# (containers have no systemd), one CPU partition 'debug'. Run as root after `apt-get install slurm-wlm munge`.
# Everything lives in $DIR, /etc/slurm is never touched: clients find the cluster through SLURM_CONF=$DIR/slurm.conf.
# Idempotent: returns at once when the cluster already answers. Prints the SLURM_CONF line to use.
set -euo pipefail
DIR=${CORRIDOR_SLURM_DIR:-/tmp/corridor-slurm}
export SLURM_CONF=$DIR/slurm.conf
up() { sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }
if [ -f "$SLURM_CONF" ] && up; then echo "export SLURM_CONF=$SLURM_CONF"; exit 0; fi

mkdir -p "$DIR/state" "$DIR/spool"
host=$(hostname -s)
# no cgroups (containers rarely allow them): process groups track a job, no task binding, no accounting daemon
cat > "$SLURM_CONF" <<EOF
ClusterName=corridor
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job (submitit's, at a time limit) waits cred_expire + 1 s before it may start again: 120 s by default
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
KillWait=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

# munge: Debian's package makes the key; make one if it is missing, then run the daemon as its own user
[ -f /etc/munge/munge.key ] || { mungekey -c -f 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1; }
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged

pgrep -x slurmctld >/dev/null || slurmctld -f "$SLURM_CONF"
pgrep -x slurmd >/dev/null || slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do up && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }; sleep 0.5; done
echo "slurm_local.sh: the node did not come up in 30 s; see $DIR/slurmctld.log and $DIR/slurmd.log" >&2
sinfo >&2 || true
exit 1
