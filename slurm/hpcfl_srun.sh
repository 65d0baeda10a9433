# Sourced by every template in slurm/ (it is not a job script of its own): one place for how a
# template starts the ranks and what it does with their exit code, so all of them stop, requeue
# and resume the same way.
#
#   hpcfl_srun SRUN_OPTIONS... PROGRAM...
#
# runs `srun --kill-on-bad-exit=0 --wait=120 SRUN_OPTIONS... PROGRAM...` and ends the batch script with the
# ranks' exit code:
#   0    finished;
#   75   stopped early with a checkpoint in $OUT (USR1 before the time limit, scancel --signal=TERM,
#        a stalled rank: srun then reports 137, and the watchdog's note $OUT/.hpcfl-stalled, naming
#        this launch, tells it apart): requeue this job (`scontrol requeue`; the next attempt resumes from the
#        checkpoint), at most MAX_REQUEUES times (default 5; SLURM_RESTART_COUNT counts them);
#   2    bad input (fix the job file), anything else a failure: not requeued.
# The templates' `#SBATCH --signal=B:USR1@<seconds>` sends USR1 to this batch shell only; it is
# passed on to srun, which forwards it to every rank. bash runs a trap only between commands, so
# srun runs in the background and the shell waits for it.
#
# --kill-on-bad-exit=0: every rank exits 75 after the checkpoint; with =1 the first rank out could
# get the rest killed and srun would report 137, not 75. A rank that dies still ends the step:
# python -m mpi4py aborts the whole MPI world on an uncaught exception, and --wait=120 has srun
# kill the tasks still running 120 s after the first one ended (the ranks of a stop exit within
# seconds of each other; a rank that failed in MPI_Init left the others waiting for ever); the
# engine's watchdog (watchdog.timeout_s) ends a run whose ranks stop answering.
#
# A launch whose ranks never got through MPI_Init because Slurm's pmi2 plugin misread a PMI-1
# line is started again, at most HPCFL_LAUNCH_RETRIES times (default 2), in the same allocation.
# The plugin reads a PMI-1 command with one read() of at most 1024 bytes; MPICH (the mpich wheel)
# publishes its network address in segments of up to 1,022 hex characters, which with the command's
# own words can make a line longer than that (how long depends on the address, so some launches
# fail and others do not). srun then prints "mpi/pmi2: invalid client request" (with "value not
# properly terminated" or "request not begin with 'cmd='") and the ranks abort in MPI_Init, or wait
# there until hpcfl_end_misread ends the launch: no rank has started the run, so nothing in $OUT
# changed and starting again is safe. The same job tends to fail the same way every time (MPICH
# sends the bytes that follow the UCX address in its memory too, and they rarely compress), so
# unless MPIR_CVAR_CH4_NETMOD is set the next launch uses MPICH's OFI (libfabric) netmod, whose
# address is a few dozen bytes: results are the same bits either way.

# shellcheck shell=bash

# One srun, its stderr passed on as it comes and also kept in $1 (read for the pmi2 misread);
# its exit code. USR1 reaches srun through the trap in hpcfl_srun ($pid).
hpcfl_srun_once() {
    local errors=$1 tee_pid
    shift
    # emptied here, before the watcher starts: tee truncates it only once it has started, and a
    # watcher that read the last launch's misread first would end this launch for nothing
    : > "$errors"
    exec 3> >(tee "$errors" >&2)
    tee_pid=$!
    srun --kill-on-bad-exit=0 --wait=120 "$@" 2>&3 &
    pid=$!
    exec 3>&-                       # srun holds the only writer now: tee ends when srun does
    hpcfl_end_misread "$pid" "$errors" &
    local watch_pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        wait "$pid"                 # returns early (status > 128) each time the trap runs
    done
    wait "$pid"                     # srun has exited: this gives its exit code
    local rc=$?
    pid=''
    kill "$watch_pid" 2>/dev/null
    wait "$watch_pid" 2>/dev/null
    wait "$tee_pid" 2>/dev/null     # every line of srun's stderr is in $errors
    return "$rc"
}

# what srun prints when Slurm's pmi2 plugin could not parse a rank's PMI-1 line (see above)
HPCFL_PMI_MISREAD='mpi/pmi2: (invalid client request|value not properly terminated|request not begin with)'

# A misread line is lost: the rank that sent it waits for an answer that never comes, and the
# others wait for it in MPI_Init, for ever (srun's --wait=120 counts only once a task has ended).
# While srun ($1) runs, this watches its stderr ($2); after a misread it gives the ranks 5 s to
# abort by themselves, then sends srun TERM, which it forwards to the ranks (still in MPI_Init:
# nothing has run), and KILL 20 s later if srun is still there.
hpcfl_end_misread() {
    local srun_pid=$1 errors=$2
    while kill -0 "$srun_pid" 2>/dev/null; do
        if grep -Eq "$HPCFL_PMI_MISREAD" "$errors" 2>/dev/null; then
            sleep 5
            kill -0 "$srun_pid" 2>/dev/null || return 0
            echo "hpcfl: Slurm's pmi2 plugin misread an MPI address line and the ranks are waiting in" \
                 "MPI_Init for what it lost; ending this launch" >&2
            kill -TERM "$srun_pid" 2>/dev/null
            for _ in $(seq 20); do
                sleep 1
                kill -0 "$srun_pid" 2>/dev/null || return 0
            done
            kill -KILL "$srun_pid" 2>/dev/null
            return 0
        fi
        sleep 1
    done
}

# $1 is a whole number from $3 to $4, or the job ends with exit 2 naming variable $2.
hpcfl_check_count() {
    case $1 in
    '' | *[!0-9]*) ;;
    *) if [ "${#1}" -le 6 ] && [ "$1" -ge "$3" ] && [ "$1" -le "$4" ]; then return 0; fi ;;
    esac
    echo "hpcfl: $2=$1 is not a whole number from $3 to $4; set it to one (e.g. $2=$5) or unset it" >&2
    exit 2
}

# The watchdog's note (a rank froze: srun reports 137, the run meant 75) counts only when this
# launch wrote it: a regular file at $OUT's top whose first line names this launch's token.
hpcfl_stall_note() {
    local note=$1 token=$2 first
    [ -f "$note" ] && [ ! -L "$note" ] || return 1
    IFS= read -r first < "$note" || return 1
    [ "$first" = "hpcfl-stalled attempt=$token run=${first##* run=}" ] || return 1
    tail -n +2 "$note" | head -c 300
}

hpcfl_srun() {
    local restarts=${SLURM_RESTART_COUNT:-0} max=${MAX_REQUEUES:-5} pid='' rc
    local launches=0 retries=${HPCFL_LAUNCH_RETRIES:-2} stopping='' errors said
    hpcfl_check_count "$max" MAX_REQUEUES 0 10000 5
    hpcfl_check_count "$retries" HPCFL_LAUNCH_RETRIES 0 100 2
    echo "hpcfl: job ${SLURM_JOB_ID:-?} attempt $((restarts + 1)), out $OUT"
    # The run leaves its stall note here, headed by this launch's token (see hpcfl_stall_note);
    # a note left by an earlier attempt, or planted, is removed first (a link: the link itself).
    export HPCFL_STALL_NOTE="$OUT/.hpcfl-stalled"
    trap 'stopping=1; echo "hpcfl: got USR1, asking the ranks to checkpoint and stop"; [ -n "$pid" ] && kill -s USR1 "$pid"' USR1
    errors=$(mktemp "${TMPDIR:-/tmp}/hpcfl-srun.XXXXXX") || errors=/dev/null
    while :; do
        export HPCFL_ATTEMPT="${SLURM_JOB_ID:-0}.$restarts.$launches.$$.$RANDOM$RANDOM"
        rm -f -- "$HPCFL_STALL_NOTE" 2>/dev/null
        hpcfl_srun_once "$errors" "$@"
        rc=$?
        launches=$((launches + 1))
        if [ "$rc" -eq 0 ] || [ "$rc" -eq 2 ] || [ "$rc" -eq 75 ] || [ -n "$stopping" ] ||
           [ "$launches" -gt "$retries" ] || ! grep -Eq "$HPCFL_PMI_MISREAD" "$errors" 2>/dev/null; then
            break
        fi
        echo "hpcfl: the ranks did not start (exit $rc): Slurm's pmi2 plugin misread an MPI address line" \
             "longer than the 1024 bytes it reads at once; nothing was run, launching again" \
             "($launches of at most $retries, HPCFL_LAUNCH_RETRIES)" >&2
        if [ -z "${MPIR_CVAR_CH4_NETMOD:-}" ]; then
            # The same job misreads again and again (what follows the address in memory is sent too):
            # MPICH's libfabric netmod publishes an address of a few dozen bytes instead.
            export MPIR_CVAR_CH4_NETMOD=ofi
            echo "hpcfl: the next launch uses MPICH's OFI netmod (MPIR_CVAR_CH4_NETMOD=ofi), whose address" \
                 "fits in one PMI line; set MPIR_CVAR_CH4_NETMOD yourself to choose another" >&2
        fi
    done
    [ "$errors" = /dev/null ] || rm -f "$errors"
    # A rank froze and the watchdog ended the job: it exits 75 through MPI_Abort, which srun
    # reports as 137 after killing every task; the watchdog leaves its note first.
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ] && [ "$rc" -ne 75 ] &&
       said=$(hpcfl_stall_note "$HPCFL_STALL_NOTE" "$HPCFL_ATTEMPT"); then
        echo "hpcfl: exit code $rc after the watchdog ended a stalled run ($HPCFL_STALL_NOTE): $said"
        rc=75
    fi
    case $rc in
    0)
        echo "hpcfl: finished"
        exit 0 ;;
    75)
        if [ "$restarts" -lt "$max" ]; then
            echo "hpcfl: stopped with a checkpoint in $OUT; requeueing job ${SLURM_JOB_ID:-?}" \
                 "(requeue $((restarts + 1)) of at most $max)"
            scontrol requeue "${SLURM_JOB_ID:?}" ||
                echo "hpcfl: scontrol requeue failed; resubmit this script (same OUT) to resume from $OUT" >&2
        else
            echo "hpcfl: NOT FINISHED after $restarts requeue(s) (MAX_REQUEUES=$max);" \
                 "the checkpoint is in $OUT: resubmit this script (same OUT) to go on" >&2
        fi
        exit 75 ;;
    *)
        # 2: bad input (fix the job file); anything else: a failure. Requeueing would not help.
        echo "hpcfl: exit code $rc, not requeueing" >&2
        exit "$rc" ;;
    esac
}
