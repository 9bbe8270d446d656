"""PCI bus ids spelled one way everywhere (``dddd:bb:dd.f``, lower case), whatever wrote them."""

from __future__ import annotations

import re
from typing import Literal

_BDF = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?")
_HEX = re.compile(r"(?:0x)?([0-9a-f]+)")


def normalize_bus_id(text: str | None, bare: Literal["none", "packed", "bus"] = "none") -> str | None:
    """Any spelling of a PCI address -> ``dddd:bb:dd.f`` lower case; None when absent, redacted or unreadable.

    Colon forms: ``0000:3b:00.0``, nvidia-smi's ``00000000:3B:00.0``, the kernel's ``0000:3b:00`` and
    ``3b:00``. A bare hex number (optional ``0x``) means what its writer meant by it: ``packed`` is NCCL's
    ``busId 3b000`` (the address's hex digits without separators), ``bus`` is older nccl-tests' ``[0x4c]``
    (the bus number alone, one or two digits); with ``none`` it is not an address.
    """
    if not text or "..." in text:
        return None
    t = text.strip().lower()
    m = _BDF.fullmatch(t)
    if m:
        dom = (m[1] or "0").lstrip("0").rjust(4, "0")[-4:]
        return f"{dom}:{m[2]}:{m[3]}.{m[4] or '0'}"
    h = _HEX.fullmatch(t)
    if h is None or bare == "none":
        return None
    digits = h[1]
    if bare == "bus":
        return f"0000:{int(digits, 16):02x}:00.0" if len(digits) <= 2 else None
    digits = digits.rjust(9, "0")
    return f"{digits[-9:-5]}:{digits[-5:-3]}:{digits[-3:-1]}.{digits[-1]}"
