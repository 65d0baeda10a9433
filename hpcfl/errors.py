"""Errors that users see, and the exit code ``hpcfl run`` gives each.

Every message says what was expected, what was found and what to do. :func:`hpcfl.run` raises
them on every rank together (the same message everywhere); the command line prints the message
once, from rank 0, and exits with the error's :attr:`~HpcflError.exit_code`:

==  =======================  ===============================================================
2   :class:`HpcflError`      bad input: the job, its data, a foreign or damaged file, a callback
                             that is not callable (nothing was started or changed), and its
                             subclasses :class:`ConfigError` and :class:`DataError`
3   :class:`GuardStopped`    the update guard stopped the run (``guard.policy = "stop"``)
74  :class:`WriteError`      results or a checkpoint could not be written (full disk, quota)
75  :class:`RunStopped`      a stop signal: a checkpoint was written, run again to resume
1   :class:`CallbackError`   a callback raised: the run stopped with a checkpoint
==  =======================  ===============================================================

A run that diverges is not an error: it returns its results, marked diverged (exit 4 from the
command line). The codes are :mod:`hpcfl.parallel.exits`'.
"""

EXIT_INPUT = 2
EXIT_GUARD = 3
EXIT_DIVERGED = 4
EXIT_WRITE = 74
EXIT_RESUMABLE = 75
EXIT_CALLBACK = 1


def _rebuild(cls, message: str, state: dict):
    """Unpickle an error with its message and attributes, whatever its ``__init__`` takes."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(state)
    return exc


class HpcflError(Exception):
    """Base class for errors with an actionable message for the user.

    Errors travel between ranks pickled (the rank that found a problem tells the others); they
    keep their class, message and attributes, not their traceback.
    """

    exit_code = EXIT_INPUT

    def __reduce__(self):
        return _rebuild, (type(self), str(self), dict(self.__dict__))


class RunError(HpcflError):
    """The run started but cannot go on; the message says why and what to do.

    ``hpcfl run`` prints it after ``hpcfl:``. ``exit_code``: 2 where a file it found is damaged or
    was swapped under it; the subclasses have their own.
    """

    def __init__(self, message: str, exit_code: int = EXIT_INPUT):
        super().__init__(message)
        self.exit_code = exit_code


class WriteError(RunError):
    """results.h5 or a checkpoint could not be written (a full disk, a quota, an I/O error). Nothing
    written before was lost: free space and run again to resume from the newest checkpoint."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_WRITE)


class RunStopped(RunError):
    """A stop signal (Ctrl-C, SIGTERM, Slurm's SIGUSR1) ended the run; it wrote a checkpoint first
    (or, during start-up, nothing at all). The same call or command resumes it."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_RESUMABLE)


class GuardStopped(RunError):
    """The update guard refused a client's update and ``guard.policy = "stop"``."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_GUARD)


class CallbackError(RunError):
    """A callback raised. The run stopped at the end of that round with a checkpoint (results.h5 and
    the checkpoints are intact), so the same call with the callback fixed resumes it.

    ``callback``: the callback's name; on rank 0, ``__cause__`` is the callback's own exception,
    with its traceback.
    """

    def __init__(self, message: str, callback: str = ""):
        super().__init__(message, EXIT_CALLBACK)
        self.callback = callback

    def after(self, what: str) -> "CallbackError":
        """The same error with what became of the run added to its message (and the same cause)."""
        err = CallbackError(f"{self}; {what}", self.callback)
        err.__cause__ = self.__cause__
        return err


class ConfigError(HpcflError):
    """One or more problems in a job file or its ``--set`` overrides.

    Parameters
    ----------
    problems : list of str or str
        Each problem names the key (``section.key``) and the fix.
    """

    def __init__(self, problems):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self):
        if len(self.problems) == 1:
            return f"config error: {self.problems[0]}"
        lines = [f"config error: {len(self.problems)} problems:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class DataError(HpcflError):
    """A dataset file is missing, truncated or not in the expected format."""


def nearest(word: str, choices) -> str | None:
    """The choice a misspelt ``word`` most likely meant (``roundz`` -> ``rounds``), or None.

    difflib's ratio with a 0.75 cut-off: one or two letters wrong, doubled or swapped in a
    short key, not a different word.
    """
    import difflib

    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.75)
    return found[0] if found else None
