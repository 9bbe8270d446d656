"""Errors the CLI turns into one-line messages and exit code 2 (never a traceback)."""

from __future__ import annotations


class ForensicsError(Exception):
    """Base class for errors caused by the user's input or invocation, not by a bug."""


class UsageError(ForensicsError):
    """Bad command-line usage (an unknown option value, a missing folder)."""
