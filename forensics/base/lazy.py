"""Modules whose code runs when first used, not when imported."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """Import with the cyclic collector paused, then freeze what exists: start-up's modules, classes and functions
    (about 200,000 objects at the entry point; ``analyze`` then imports about 450 modules more) live as long as the
    process, and the collections their creation triggered cost 40-60 ms of CPU that found nothing to free
    (docs/performance.md, tenth pass). Later collections skip what is frozen. The collector is left as it was."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if paused:
            gc.enable()
