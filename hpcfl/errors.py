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
