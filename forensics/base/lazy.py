"""Modules whose code runs when first used, not when imported."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any


class _Deferred(ModuleType):
    """Stands in ``sys.modules`` for a module not run yet. Its spec is the real one's, so an ``import`` statement
    takes it as imported (the standard library's ``LazyLoader`` would run the module there: Python 3.11's import
    reads the module's ``__spec__``). The first attribute it lacks runs the real module, copies its namespace and
    answers from it; later reads find the copy."""

    def __getattr__(self, attr: str) -> Any:
        name = self.__spec__.name if self.__spec__ else self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def defer_import(name: str) -> None:
    """Make ``import name`` bind a stand-in whose first attribute read imports the module. Nothing happens when
    ``name`` is already imported or cannot be found (its import then fails where it is written, as before).

    ``forensics rules`` defers Polars: it imports every detector for its declarations, and the detectors, the facts
    and the frames they import use Polars only inside functions (frames.Dtype), so the command never runs it."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    stand_in = _Deferred(name)
    stand_in.__spec__ = spec
    sys.modules[name] = stand_in
