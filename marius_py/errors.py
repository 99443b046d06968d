"""User-facing errors: one clear message, a non-zero exit, no traceback.

Anything the user can get wrong (an input file, a config value, a run
directory) raises ``MariusInputError``; the CLI prints ``str(error)`` and exits
with status 2. Programming errors stay ordinary exceptions with tracebacks.
"""

from __future__ import annotations

import os
import reprlib

PATH_TYPES = (str, os.PathLike)  # what path arguments of the API take


class MariusInputError(Exception):
    """Bad user input, reported as ``file:line: problem (expected ...)``."""

    def __init__(self, problem: str, *, path: object = None, line: int | None = None,
                 expected: str | None = None):
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        self.expected = expected
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
            where += ": "
        text = where + self.problem
        if self.expected:
            text += f" (expected {self.expected})"
        return text


class DiskFullError(MariusInputError):
    """No space left on the device (or in the quota) for an output, raised once what was half-written is
    removed; the message names the directory and the space needed (``storage.durable.disk_full_error``)."""


def check_type(value, kinds: type | tuple, argument: str, expected: str) -> None:
    """Refuse an API argument that is not one of ``kinds``, naming it (a wrong type would fail deep inside, with
    a bare TypeError, or be taken for something else)."""
    if not isinstance(value, kinds):
        raise MariusInputError(f"{argument} is a {type(value).__name__}: {reprlib.repr(value)}", expected=expected)
