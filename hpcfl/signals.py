"""Stop requests from SIGTERM, SIGINT and SIGUSR1 (no heavy imports: installed first).

A signal only sets a flag; the round loop agrees on it at the next round boundary,
writes a checkpoint and exits 75 (docs/reliability.md). During start-up, which writes nothing,
it also starts a watcher that ends the process if start-up is blocked (see STARTUP_GRACE_S). Installed before numpy and
torch are imported, so that a signal during start-up is not lost (Python's default for
SIGUSR1 is to die, which a requeue script would see as 138).

The first signal is acknowledged at once on stderr (by one process: rank 0 of an MPI job,
read from the launcher's environment), since start-up and a round can take minutes. A
second Ctrl-C (SIGINT) stops the process at once: the first one gives SIGINT back its
default action, death, which is safe at any moment (a run resumes from its last
checkpoint as after a kill). SIGTERM and SIGUSR1 keep waiting for the checkpoint, which
is what a batch system's warning signal is for.
"""

import contextlib
import os
import signal
import sys
import threading
import time

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
_requested: list = []   # names of the signals received by this process

# Start-up writes nothing (``hpcfl run`` changes files only once every rank has validated the job
# and found its data), so a stop during it may end the process at once. It usually ends by itself
# at the check after start-up, with a clean message; but a process blocked there (reading a file
# that never ends, a hung network file system, a peer that never comes) never reaches that check,
# and the flag alone left it deaf to SIGTERM. So a stop signal during start-up also
# starts a watcher thread: from STARTUP_GRACE_S after the signal, once the main thread has stood
# still (the same frame at the same instruction: blocked in a system call or in C) for
# STARTUP_STILL_S, the process exits STARTUP_EXIT at once. A start-up that is only slow, still
# running Python code, is left to reach the check.
STARTUP_GRACE_S = 3.0
STARTUP_STILL_S = 3.0
STARTUP_EXIT = 75   # parallel.exits.EXIT_RESUMABLE (not importable from here): run the command again
_startup: dict = {"on": False, "watcher": None, "undo": None, "may_exit": True}
# Python runs a signal's handler in the main thread between two bytecodes: never while the main
# thread is blocked inside a C call that does not return, such as an MPI collective whose peers are
# elsewhere (a frozen rank, a rank that refused). The C-level handler still writes the signal's
# number to the wakeup fd, so a thread that reads it arms the watcher above in that case too.
_woken: list = [None]   # the stop signal the wakeup thread saw, for the watcher's message
_stopping: list = [None]   # what the acknowledgement says happens next, when not a run's (install() sets it)

RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def _rank() -> str:
    for name in RANK_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return "0"


def _on_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    first = not _requested
    _requested.append(name)
    if signum == signal.SIGINT:   # a second Ctrl-C stops at once (in Python: KeyboardInterrupt, see listening())
        signal.signal(signal.SIGINT, signal.SIG_DFL if _startup["may_exit"] else signal.default_int_handler)
    if _startup["on"] and _startup["may_exit"]:
        _arm()
    if first and _rank() == "0":
        again = "; press Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
        # os.write: print() could be interrupted in the middle of writing to the same stream
        when = ("at the end of start-up, which has written nothing"
                + (" (at once if start-up is blocked)" if _startup["may_exit"] else "") if _startup["on"] else
                "at the end of start-up or of the round in progress (a checkpoint is written then)")
        text = _stopping[0] or f"stopping {when}"
        os.write(2, f"\nhpcfl: {name} received: {text}{again}\n".encode())


def _arm() -> None:
    if _startup["watcher"] is None:
        done = threading.Event()
        _startup["watcher"] = done
        threading.Thread(target=_watch, args=(done,), name="hpcfl-startup-stop", daemon=True).start()


def _main_position():
    frame = sys._current_frames().get(threading.main_thread().ident)
    return (id(frame), frame.f_lasti) if frame is not None else None


def _watch(done: threading.Event) -> None:
    """After a stop signal during start-up: end the process once its main thread stands still."""
    if done.wait(STARTUP_GRACE_S):
        return
    still_since, last = time.monotonic(), _main_position()
    while not done.wait(0.1):
        now = _main_position()
        if now != last:
            still_since, last = time.monotonic(), now
        elif time.monotonic() - still_since >= STARTUP_STILL_S:
            _give_up(time.monotonic() - still_since)
            return


def _give_up(still: float) -> None:
    """Start-up is blocked after a stop signal: take back what it made, say so, and stop now."""
    if not _startup["on"]:
        return
    try:
        if _startup["undo"] is not None:   # e.g. remove the --out folder the run's lock created
            _startup["undo"]()
    except BaseException:   # noqa: BLE001, S110 - stopping regardless; the message below still goes out
        pass
    os.write(2, (f"\nhpcfl: rank {_rank()}: start-up is blocked ({still:.0f} s without progress after "
                 f"{_requested[0] if _requested else _woken[0]}: "
                 f"e.g. reading a file that never ends, such as a FIFO without a writer, or waiting for another "
                 f"rank); stopped at once. Nothing was written or changed; run the same command again to "
                 f"start\n").encode())
    os._exit(STARTUP_EXIT)


def begin_startup(undo=None) -> None:
    """From here until :func:`end_startup`, a stop signal ends a blocked process (see STARTUP_GRACE_S);
    ``undo()`` (if given) is called first, to take back what start-up made (the ``--out`` lock)."""
    _startup["on"] = True
    _startup["undo"] = undo
    if _requested:   # received earlier (before the handlers knew start-up had begun)
        _arm()


def end_startup() -> None:
    """Start-up is over (files may change from here): a stop signal is only a request again."""
    _startup["on"] = False
    _startup["undo"] = None
    done, _startup["watcher"] = _startup["watcher"], None
    if done is not None:
        done.set()


def install(stopping: str | None = None, startup: bool = False, wake: bool = True) -> None:
    """Install the stop handlers. ``stopping``: what the acknowledgement says happens next, when
    not a run's (``hpcfl sweep`` says its planning stops at once); ``startup``: the process is
    starting a run (:func:`begin_startup`); ``wake``: also end a start-up blocked in C (the
    command line; :func:`listening` never ends the process, so it leaves the wakeup fd alone)."""
    _stopping[0] = stopping
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), _on_signal)
    if wake:
        _watch_wakeups()
    if startup:
        begin_startup()


def _watch_wakeups() -> None:
    """Once per process, where no one else uses it (asyncio does): the wakeup fd and its reader."""
    if _woken[0] is not None or threading.current_thread() is not threading.main_thread():
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    if previous != -1:   # someone's event loop: leave it theirs
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return
    _woken[0] = ""
    numbers = {getattr(signal, name).value: name for name in STOP_SIGNALS}
    threading.Thread(target=_read_wakeups, args=(r, numbers), name="hpcfl-signal-wakeup", daemon=True).start()


def _read_wakeups(fd: int, numbers: dict) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        for number in data:
            if number in numbers and _startup["on"] and _startup["may_exit"]:
                _woken[0] = numbers[number]
                _arm()


@contextlib.contextmanager
def listening():
    """Stop requests for a run started from Python (:func:`hpcfl.run`), for the ``with`` block only.

    Where the command line installed the handlers first (before its imports), they stay as they
    are. Otherwise, in the main thread, the handlers are installed for the block and the caller's
    are given back after it, with no request left over (a notebook cell run again starts afresh).
    In that form a stop never ends the process: the first Ctrl-C asks for a checkpoint at the end
    of the round (:class:`hpcfl.errors.RunStopped`), a second raises KeyboardInterrupt. Signals
    reach only the main thread, so a run in another thread has no stop requests.
    """
    if signal.getsignal(signal.SIGTERM) is _on_signal or threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {name: signal.getsignal(getattr(signal, name)) for name in STOP_SIGNALS}
    _requested.clear()
    _startup["may_exit"] = False
    install(wake=False)
    try:
        yield
    finally:
        for name, handler in saved.items():
            if handler is not None:   # None: a handler set outside Python, which cannot be put back from here
                signal.signal(getattr(signal, name), handler)
        _requested.clear()
        _startup["may_exit"] = True


def stop_requested():
    """Name of the first stop signal received, or None."""
    return _requested[0] if _requested else None


def ignore() -> None:
    """Once the run's results are complete: a late stop signal must not turn exit 0 into a kill.

    At interpreter shutdown CPython resets Python-level handlers to the default (death by
    the signal, 143 for SIGTERM, which a requeue script reads as a failure); an explicit
    SIG_IGN is left alone.
    """
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
