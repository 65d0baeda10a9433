"""Errors that users see.

Every message says what was expected, what was found and what to do. The CLI turns
:class:`ConfigError` into exit code 2 on every rank, printed once by rank 0.
"""


class HpcflError(Exception):
    """Base class for errors with an actionable message for the user."""


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
