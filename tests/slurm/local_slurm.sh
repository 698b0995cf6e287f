#!/usr/bin/env bash
# local_slurm.sh - a throw-away SLURM cluster on this machine, for the tests.
#
# munged, slurmctld and one or more slurmd (optionally MariaDB + slurmdbd) started directly,
# as root, without systemd, each tracked by its pid file. Everything (config, munge key and
# socket, spool, state, logs, pid files) lives in one directory, $SLURM_FIXTURE_DIR, and SLURM's
# default ports are left alone. The one thing outside it: /etc/slurm/slurm.conf becomes a
# symlink to the fixture's config, because snakemake-executor-plugin-slurm's job step drops
# SLURM_* variables (SLURM_CONF too) before it calls srun, so srun inside a job only finds the
# default path. A real /etc/slurm/slurm.conf is never replaced (start refuses instead); `stop`
# removes the symlink.
#
# Several "nodes" on one host use SLURM's multiple-slurmd mode: node names c1..cN share this
# host's name and address and differ in their slurmd port, spool and log (%n in slurm.conf).
#
# Usage:  bash tests/slurm/local_slurm.sh start|stop|status|env
# Env:    SLURM_FIXTURE_DIR=/tmp/cs336-slurm   where everything lives (absolute path)
#         NODES=1            slurmd nodes c1..cN on this host (multiple-slurmd mode when > 1)
#         CPUS_PER_NODE=     CPUs each node declares (default: this host's CPUs; more than that
#                            is allowed, SlurmdParameters=config_overrides, without CPU binding)
#         MEM_PER_NODE=      MB each node declares (default: MEM_PERCENT of this host's, split)
#         FAKE_GPUS=0        gres/gpu per node (copies of /dev/null): GPU jobs are accepted and
#                            run, with CUDA_VISIBLE_DEVICES set
#         WITH_DBD=0         1: MariaDB + slurmdbd, so that `sacct` works
#         PARTITION=debug MAX_TIME=60 (minutes; longer requests are rejected at submission)
#         DEF_MEM_PER_CPU=500  MEM_PERCENT=80 (of this host's memory, split over the nodes)
#         PORT_BASE=16817    slurmctld on it, slurmdbd on +1, MariaDB on +2, slurmd of node i on +10+i
#         READY_TIMEOUT=60   seconds to wait for each daemon and for the nodes to be idle
set -euo pipefail

ACTION="${1:-start}"
DIR="${SLURM_FIXTURE_DIR:-/tmp/cs336-slurm}"
NODES="${NODES:-1}"
FAKE_GPUS="${FAKE_GPUS:-0}"
WITH_DBD="${WITH_DBD:-0}"
PARTITION="${PARTITION:-debug}"
MAX_TIME="${MAX_TIME:-60}"
DEF_MEM_PER_CPU="${DEF_MEM_PER_CPU:-500}"
MEM_PERCENT="${MEM_PERCENT:-80}"
PORT_BASE="${PORT_BASE:-16817}"
READY_TIMEOUT="${READY_TIMEOUT:-60}"
CLUSTER_NAME=cs336test

CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket"
MUNGE_PID="$DIR/run/munged.pid"
CTLD_PID="$DIR/run/slurmctld.pid"
DBD_PID="$DIR/run/slurmdbd.pid"
MYSQL_PID="$DIR/run/mariadbd.pid"
MYSQL_SOCKET="$DIR/run/mariadbd.sock"

T0=$(date +%s.%N)
log() { printf '[local_slurm %5.1fs] %s\n' "$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "$DIR" in /*) ;; *) die "SLURM_FIXTURE_DIR must be absolute, got '$DIR'" ;; esac

# alive PIDFILE: the process exists and is not a zombie (this host's PID 1 may not reap).
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE
  local name=$1 pf=$2 pid
  if alive "$pf"; then
    pid=$(cat "$pf")
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pf" || break; sleep 0.2; done
    if alive "$pf"; then log "$name did not exit, sending KILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$pf"
}

wait_for() {  # wait_for DESCRIPTION COMMAND...
  local what=$1; shift
  local deadline=$(( $(date +%s) + READY_TIMEOUT ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out waiting for $what (logs in $DIR/log)"
    sleep 0.2
  done
  log "$what: ok"
}

node_pidfiles() { ls "$DIR"/run/slurmd.*.pid 2>/dev/null || true; }

stop_all() {
  local pf
  # cancel what is left so that no slurmstepd outlives its slurmd
  if [ -f "$CONF" ] && alive "$CTLD_PID"; then
    SLURM_CONF="$CONF" timeout 10 scancel --full --user=root >/dev/null 2>&1 || true
  fi
  for pf in $(node_pidfiles); do stop_pidfile "slurmd $(basename "$pf" .pid | cut -d. -f2)" "$pf"; done
  stop_pidfile slurmctld "$CTLD_PID"
  stop_pidfile slurmdbd "$DBD_PID"
  stop_pidfile mariadbd "$MYSQL_PID"
  stop_pidfile munged "$MUNGE_PID"
}

status_all() {
  local pf
  for pf in "$MUNGE_PID" "$MYSQL_PID" "$DBD_PID" "$CTLD_PID" $(node_pidfiles); do
    if alive "$pf"; then echo "$(basename "$pf" .pid): running (pid $(cat "$pf"))"
    else echo "$(basename "$pf" .pid): not running"; fi
  done
  [ -f "$CONF" ] && SLURM_CONF="$CONF" timeout 10 sinfo -N -l 2>&1 || true
}

ETC_CONF=/etc/slurm/slurm.conf
link_etc_conf() {
  local other
  if [ -L "$ETC_CONF" ]; then
    # ours, or a dangling / stopped earlier fixture's link: replace it
    if [ -e "$ETC_CONF" ] && ! grep -q '^# generated by tests/slurm/local_slurm.sh' "$ETC_CONF"; then
      die "$ETC_CONF links to a config that is not this fixture's: refusing to replace it"
    fi
    other=$(dirname "$(readlink "$ETC_CONF")")
    if [ "$other" != "$DIR" ] && alive "$other/run/slurmctld.pid"; then
      die "another test cluster runs from $other: stop it first (SLURM_FIXTURE_DIR=$other $0 stop)"
    fi
  elif [ -e "$ETC_CONF" ]; then
    die "$ETC_CONF exists (a real SLURM on this host?): refusing to replace it"
  fi
  install -d -m 755 /etc/slurm
  ln -sfn "$CONF" "$ETC_CONF"
}
unlink_etc_conf() {
  if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi
}

case "$ACTION" in
  stop)   [ -d "$DIR" ] && stop_all; unlink_etc_conf; exit 0 ;;
  status) status_all; exit 0 ;;
  env)    echo "export SLURM_CONF=$CONF"; exit 0 ;;
  start)  ;;
  *)      die "unknown action '$ACTION' (start|stop|status|env)" ;;
esac

[ "$(id -u)" = 0 ] || die "must run as root (slurmd runs jobs as their users)"
for b in munged mungekey slurmctld slurmd sbatch; do
  command -v "$b" >/dev/null || die "'$b' not found: run tests/slurm/install.sh first"
done
if [ "$WITH_DBD" = 1 ]; then
  for b in slurmdbd mariadbd mysql; do
    command -v "$b" >/dev/null || die "'$b' not found: run WITH_DBD=1 tests/slurm/install.sh first"
  done
fi

link_etc_conf  # first: it refuses when a real SLURM or another test cluster is here

# A restart rewrites everything: stop what an earlier start left, keep nothing but the munge key.
stop_all
rm -rf "$DIR/spool" "$DIR/state" "$DIR/log" "$DIR/run" "$DIR/dev" "$DIR/munge/munge.socket"*
install -d -m 755 "$DIR" "$DIR/run" "$DIR/log" "$DIR/state" "$DIR/spool"
install -d -m 755 "$DIR/munge"  # clients need to reach the socket
# MariaDB runs as mysql and must reach its pid file and socket
[ "$WITH_DBD" = 1 ] && chmod 1777 "$DIR/run"

# ---------------------------------------------------------------- munge (private key + socket)
[ -s "$DIR/munge.key" ] || mungekey --create --keyfile="$DIR/munge.key" >/dev/null
chmod 400 "$DIR/munge.key"
log "starting munged"
munged --key-file="$DIR/munge.key" --socket="$MUNGE_SOCKET" --pid-file="$MUNGE_PID" \
  --log-file="$DIR/log/munged.log" --seed-file="$DIR/run/munged.seed"
wait_for "munge round trip" sh -c "munge -S '$MUNGE_SOCKET' -n | unmunge -S '$MUNGE_SOCKET'"

# ---------------------------------------------------------------- slurm.conf
HOST=$(hostname -s)
HW=$(slurmd -C | head -n1)  # NodeName=.. CPUs=.. Boards=.. ... RealMemory=..
hw() { echo "$HW" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
CPUS="${CPUS_PER_NODE:-$(hw CPUs)}"
if [ "$CPUS" = "$(hw CPUs)" ]; then  # the host's own topology, so that CPU binding is right
  TOPO="CPUs=$CPUS Boards=$(hw Boards) SocketsPerBoard=$(hw SocketsPerBoard) CoresPerSocket=$(hw CoresPerSocket) ThreadsPerCore=$(hw ThreadsPerCore)"
  TASK_PLUGIN=task/affinity
else  # CPUs the host does not have cannot be bound to
  TOPO="CPUs=$CPUS"
  TASK_PLUGIN=task/none
fi
MEM="${MEM_PER_NODE:-$(( $(hw RealMemory) * MEM_PERCENT / 100 / NODES ))}"
GRES=""; [ "$FAKE_GPUS" -gt 0 ] && GRES=" Gres=gpu:$FAKE_GPUS"

{
  cat <<EOF
# generated by tests/slurm/local_slurm.sh: a test cluster on $HOST, not for production
ClusterName=$CLUSTER_NAME
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT_BASE
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
# no cgroups in a container: track processes via /proc, bind CPUs with sched_setaffinity
ProctrackType=proctrack/linuxproc
TaskPlugin=$TASK_PLUGIN
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=120
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# nodes may declare more CPUs than the host has (several slurmd on one host)
SlurmdParameters=config_overrides
# a job that does not ask for memory must not take the whole node
DefMemPerCPU=$DEF_MEM_PER_CPU
# reject at submission, instead of queueing forever, what exceeds the partition or the nodes
EnforcePartLimits=ALL
# finished jobs stay visible to squeue for 10 min: Snakemake's squeue status check needs that
MinJobAge=600
# a cancelled or timed-out job is killed 2 s after SIGTERM, not 30
KillWait=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
EOF
  if [ "$WITH_DBD" = 1 ]; then
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=127.0.0.1"
    echo "AccountingStoragePort=$(( PORT_BASE + 1 ))"
    # for slurmdbd connections this names the munge socket (AuthInfo does not apply to them)
    echo "AccountingStoragePass=$MUNGE_SOCKET"
    [ "$FAKE_GPUS" -gt 0 ] && echo "AccountingStorageTRES=gres/gpu"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
  [ "$FAKE_GPUS" -gt 0 ] && echo "GresTypes=gpu"
  names=()
  for i in $(seq 1 "$NODES"); do
    names+=("c$i")
    echo "NodeName=c$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$(( PORT_BASE + 10 + i )) $TOPO RealMemory=$MEM$GRES State=UNKNOWN"
  done
  echo "PartitionName=$PARTITION Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=$MAX_TIME State=UP"
} >"$CONF"
chmod 644 "$CONF"
if [ "$FAKE_GPUS" -gt 0 ]; then
  {
    echo "AutoDetect=off"
    for i in $(seq 1 "$NODES"); do
      # one device node per fake GPU, each a copy of /dev/null (char 1,3): SLURM then hands
      # out their indices as CUDA_VISIBLE_DEVICES. Without mknod, GPUs without File= (jobs
      # still get SLURM_GPUS_ON_NODE, not CUDA_VISIBLE_DEVICES).
      install -d "$DIR/dev/c$i"
      files="File=$DIR/dev/c$i/gpu[0-$(( FAKE_GPUS - 1 ))]"
      for g in $(seq 0 $(( FAKE_GPUS - 1 ))); do
        mknod -m 666 "$DIR/dev/c$i/gpu$g" c 1 3 2>/dev/null || files=""
      done
      echo "NodeName=c$i Name=gpu Count=$FAKE_GPUS $files"
    done
  } >"$DIR/gres.conf"
else
  rm -f "$DIR/gres.conf"
fi
export SLURM_CONF="$CONF"
log "slurm.conf: $NODES node(s) x $CPUS CPUs, ${MEM} MB, $FAKE_GPUS fake GPU(s), dbd=$WITH_DBD, ports $PORT_BASE+"

# ---------------------------------------------------------------- accounting (optional)
if [ "$WITH_DBD" = 1 ]; then
  install -d -o mysql -g mysql -m 700 "$DIR/mysql"
  if [ ! -d "$DIR/mysql/mysql" ]; then
    log "initialising MariaDB data directory"
    mariadb-install-db --user=mysql --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
      >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed, see $DIR/log/mariadb-install.log"
  fi
  log "starting mariadbd"
  setsid -f mariadbd --user=mysql --datadir="$DIR/mysql" --socket="$MYSQL_SOCKET" \
    --pid-file="$MYSQL_PID" --skip-networking=0 --bind-address=127.0.0.1 --port=$(( PORT_BASE + 2 )) \
    </dev/null >>"$DIR/log/mariadbd.log" 2>&1
  wait_for "mariadb ping" mysqladmin --socket="$MYSQL_SOCKET" ping
  # fresh accounting, like the fresh controller state (job ids restart at 1)
  mysql --socket="$MYSQL_SOCKET" -e "DROP DATABASE IF EXISTS slurm_acct_db; CREATE DATABASE slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmtest';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  cat >"$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$(( PORT_BASE + 1 ))
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DBD_PID
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$(( PORT_BASE + 2 ))
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurmtest
EOF
  chmod 600 "$DIR/slurmdbd.conf"  # slurmdbd refuses a readable config (it holds a password)
  log "starting slurmdbd"
  slurmdbd  # reads slurmdbd.conf beside $SLURM_CONF
  wait_for "slurmdbd answering" sacctmgr -n list cluster
fi

# ---------------------------------------------------------------- controller and nodes
log "starting slurmctld"
slurmctld -f "$CONF"
wait_for "slurmctld ping" sh -c 'scontrol ping | grep -q UP'

for i in $(seq 1 "$NODES"); do
  install -d -m 755 "$DIR/spool/c$i"
  log "starting slurmd c$i"
  slurmd -f "$CONF" -N "c$i"
done

all_idle() {
  local states
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(echo "$states" | awk '$2 == "idle"' | wc -l)" -eq "$NODES" ]
}
deadline=$(( $(date +%s) + READY_TIMEOUT ))
until all_idle; do
  [ "$(date +%s)" -lt "$deadline" ] || die "nodes not idle: $(sinfo -h -N -o '%N=%T' | tr '\n' ' ') (see $DIR/log/slurmd.*.log)"
  sleep 0.2
done
log "node(s) idle: $(sinfo -h -N -o '%N' | tr '\n' ' ')"
# sinfo may show a state restored from StateSaveLocation before slurmd re-registers: a real
# job step on every node proves the nodes answer.
timeout "$READY_TIMEOUT" srun --quiet -N "$NODES" -n "$NODES" --mem=16 -t 1 true \
  || die "srun smoke test on $NODES node(s) failed (see $DIR/log)"
log "srun smoke test on $NODES node(s): ok"

if [ "$WITH_DBD" = 1 ]; then
  wait_for "cluster registered in slurmdbd" sh -c "sacctmgr -n -P list cluster format=cluster | grep -qx $CLUSTER_NAME"
fi
log "ready: export SLURM_CONF=$CONF (sacct $([ "$WITH_DBD" = 1 ] && echo works || echo 'does not work: status via squeue'))"
