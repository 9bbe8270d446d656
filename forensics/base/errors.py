"""Errors the CLI turns into one-line messages and exit code 2 (never a traceback)."""

from __future__ import annotations


class ForensicsError(Exception):
    """Base class for errors caused by the user's input or invocation, not by a bug."""


class UsageError(ForensicsError):
    """Bad command-line usage (an unknown option value, a missing folder)."""


def is_bug(exc: BaseException) -> bool:
    """Whether a guard that costs one file or one job for a bug should take ``exc``: any ``Exception``, and a
    Rust panic (pyo3's ``PanicException``, a ``BaseException``, as Polars raises on an internal error) unless it
    wraps a Ctrl-C. A Ctrl-C that lands in a Python call made from Rust code that unwraps its result comes out as
    such a panic, its message naming the ``KeyboardInterrupt``; that one must stop the run, not fail a file."""
    if isinstance(exc, Exception):
        return True
    return type(exc).__name__ == "PanicException" and "KeyboardInterrupt" not in str(exc)
