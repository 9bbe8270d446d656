"""Errors the CLI turns into one-line messages and exit code 2 (never a traceback)."""

from __future__ import annotations


class ForensicsError(Exception):
    """Base class for errors caused by the user's input or invocation, not by a bug."""


class InputError(ForensicsError):
    """Unreadable or unusable input. ``path`` and ``line`` locate it when known."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = path or ""
        if path and line is not None:
            where = f"{path}:{line}"
        super().__init__(f"{where}: {message}" if where else message)


class UsageError(ForensicsError):
    """Bad command-line usage (an unknown option value, a missing folder)."""
