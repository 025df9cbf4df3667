#!/usr/bin/env bash
# A single-node Slurm on this machine, for testing `orchestrator fleet --slurm` (docs/FLEET.md).
#   scripts/slurm-local.sh start   install slurm-wlm and munge if missing (Debian packages), write
#                                  a CPU-only slurm.conf, start munged, slurmctld and slurmd, and
#                                  wait until sinfo shows the node idle. Prints, last, the line
#                                  `export SLURM_CONF=...` that clients (sbatch, squeue) need.
#   scripts/slurm-local.sh stop    stop the three daemons it started (by their pid files).
#   scripts/slurm-local.sh status  sinfo and squeue.
# Exit 0: done; 3: Slurm or munge is not installed and cannot be installed here (the caller may
# skip, saying why); 2: anything else (a daemon did not start: its log's tail is printed).
# Everything lives in ${LLM_BENCH_SLURM_DIR:-/tmp/llm-bench-slurm}: no file under /etc/slurm is
# written. Needs root (the daemons, and apt-get when the packages are missing).
set -euo pipefail

dir=${LLM_BENCH_SLURM_DIR:-/tmp/llm-bench-slurm}
conf=$dir/slurm.conf
wait_s=${LLM_BENCH_SLURM_WAIT_S:-90}

say() { printf 'slurm-local: %s\n' "$*" >&2; }

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        say "must run as root (it starts slurmd and munged, and installs them if missing)"
        exit 3
    fi
}

have_all() {
    command -v munged >/dev/null && command -v slurmctld >/dev/null \
        && command -v slurmd >/dev/null && command -v sbatch >/dev/null
}

install() {
    have_all && return 0
    if ! command -v apt-get >/dev/null; then
        say "slurm-wlm and munge are not installed and this machine has no apt-get to install them"
        exit 3
    fi
    say "installing slurm-wlm and munge (apt-get)"
    if ! apt-get update >"$dir/apt.log" 2>&1 \
        || ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            slurm-wlm munge >>"$dir/apt.log" 2>&1; then
        tail -n 5 "$dir/apt.log" >&2 || true
        say "apt-get could not install slurm-wlm and munge (log: $dir/apt.log)"
        exit 3
    fi
    have_all || { say "slurm-wlm installed but munged/slurmctld/slurmd/sbatch are not on PATH"; exit 3; }
}

# A pid file's process, if it is alive.
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    local key=/etc/munge/munge.key
    if [ ! -s "$key" ]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$key"
        else
            dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
        fi
    fi
    mkdir -p "$dir/munge" /run/munge /var/lib/munge /var/log/munge
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge "$dir/munge" 2>/dev/null || true
    chmod 0700 /etc/munge
    chmod 0400 "$key"
    # A munged already serving the default socket (the machine's own) is used as it is.
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0
    fi
    local as=()
    id munge >/dev/null 2>&1 && as=(runuser -u munge --)
    "${as[@]}" munged --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
        || { tail -n 5 "$dir/munge/munged.log" >&2 || true; say "munged did not start"; exit 2; }
    cp "$dir/munge/munged.pid" "$dir/munged.pid"
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    say "munged started but munge | unmunge does not work (log: $dir/munge/munged.log)"
    exit 2
}

write_conf() {
    local host mem node
    host=$(hostname -s)
    # The node as slurmd sees the hardware (CPUs, sockets, cores, threads, memory), so the
    # configuration never claims more than there is.
    node=$(slurmd -C | head -n 1)
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    node=$(sed "s/RealMemory=[0-9]*/RealMemory=$((mem * 9 / 10))/" <<<"$node")
    mkdir -p "$dir/state" "$dir/spool"
    cat >"$conf" <<EOF
# Written by scripts/slurm-local.sh: one node, CPU only, no cgroups, no accounting.
ClusterName=llmbench
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
SlurmctldPort=${LLM_BENCH_SLURMCTLD_PORT:-6817}
SlurmdPort=${LLM_BENCH_SLURMD_PORT:-6818}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
MinJobAge=600
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    need_root
    mkdir -p "$dir"
    install
    start_munge
    if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid"; then
        say "already running ($conf)"
    else
        write_conf
        export SLURM_CONF=$conf
        # -i: ignore a previous run's saved state (jobs, node states) in $dir/state.
        slurmctld -i -f "$conf" || { tail -n 20 "$dir/slurmctld.log" >&2 || true; say "slurmctld did not start"; exit 2; }
        slurmd -f "$conf" || { tail -n 20 "$dir/slurmd.log" >&2 || true; say "slurmd did not start"; exit 2; }
    fi
    export SLURM_CONF=$conf
    local state=""
    for _ in $(seq "$((wait_s * 2))"); do
        state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1 || true)
        case $state in
            idle | mixed | allocated) break ;;
        esac
        sleep 0.5
    done
    case $state in
        idle | mixed | allocated) ;;
        *)
            tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
            say "the node did not come up within ${wait_s} s (sinfo says: ${state:-nothing})"
            exit 2
            ;;
    esac
    say "node $(hostname -s) is $state: $(sinfo -h -N -o '%c CPUs, %m MB')"
    echo "export SLURM_CONF=$conf"
}

stop() {
    local f
    for f in slurmd slurmctld munged; do
        if alive "$dir/$f.pid"; then
            kill "$(cat "$dir/$f.pid")"
            for _ in $(seq 50); do alive "$dir/$f.pid" || break; sleep 0.1; done
            say "stopped $f"
        fi
        rm -f "$dir/$f.pid"
    done
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) SLURM_CONF=$conf sinfo; SLURM_CONF=$conf squeue ;;
    *) echo "usage: scripts/slurm-local.sh start|stop|status" >&2; exit 2 ;;
esac
