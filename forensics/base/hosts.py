"""Host names as every frame stores them, so traces, NCCL logs and kernel logs join on one key."""

from __future__ import annotations

import re

_IP = re.compile(r"[\d.]+|[0-9A-Fa-f:]+:[0-9A-Fa-f:]*")


def short_host(name: str | None) -> str | None:
    """The name without its domain, as NCCL logs and syslog print it (``node7.cluster.org`` -> ``node7``).

    IP addresses are kept whole; empty names become None.
    """
    if not name:
        return None
    name = name.strip().strip('"')
    if not name:
        return None
    if _IP.fullmatch(name):
        return name
    return name.split(".", 1)[0] or None
