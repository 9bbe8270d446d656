"""Per-rank stdout (NCCL_DEBUG=INFO mixed with training output) and per-node kernel logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_logs(out: Path, job: Any, engine: Any, hosts: list[str], offsets: list[int], truth: dict[str, Any], seed: int,
               timeout_info: dict[str, Any] | None, step_log: dict[int, list[tuple[int, int, int]]]) -> None:
    return None
