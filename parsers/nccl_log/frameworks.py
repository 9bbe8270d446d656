"""Training-framework lines in the same output: the checkpoint saves and failures of Megatron, DeepSpeed, Lightning
and generic trainers, with their step and time."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import polars as pl
from forensics.parsers.nccl_log.pytorch import PT_RANK
from forensics.parsers.nccl_log.rows import Acc

# --- checkpoint saves -------------------------------------------------------------------------
# Each pattern starts with a literal and has no nested or overlapping quantifiers (linear); they
# only run on lines that passed the substring guard in checkpoint_line.
CK_MEGATRON = re.compile(r"(?:saving|successfully saved) checkpoint (?:from |at )?iteration\s+(?P<it>\d+) to (?P<path>\S+)")
CK_DEEPSPEED = re.compile(r"Saving model checkpoint(?:: (?P<path>\S+))?")
CK_LIGHTNING = re.compile(r"Epoch (?P<ep>\d+), global step (?P<step>\d+): ")
CK_LIGHTNING_TO = re.compile(r"saving model to '?(?P<path>[^'\s]+)")
CK_GENERIC = re.compile(r"(?i)\b(?:checkpoint saved|saved (?:the |a )?checkpoint|finished saving (?:the )?checkpoint)\b")
CK_GEN_PATH = re.compile(r"(?i)\b(?:to|at|in|:) '?(?P<path>[/.~][^'\s,;]*)")
CK_STEP = re.compile(r"(?i)(?:global_step|\bstep)[ =_:-]?(?P<step>\d+)")
CK_FAIL = re.compile(r"(?i)fail|error|unable|could not|cannot|skip")
CK_ISO = re.compile(r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?")
CK_GLOG = re.compile(r"\[[EWIF](?P<md>\d{4}) (?P<t>\d\d:\d\d:\d\d(?:\.\d{1,9})?)")


def fill_checkpoints(checkpoints: pl.DataFrame, one: pl.DataFrame) -> pl.DataFrame:
    """Checkpoint lines of a file of one process are that process's (rank and host)."""
    if checkpoints.height == 0 or one.height == 0:
        return checkpoints
    got = one.select("source", pl.col("rank").cast(pl.Int32).alias("_r"), pl.col("host").alias("_h"))
    return checkpoints.join(got, on="source", how="left", maintain_order="left").with_columns(
        pl.col("rank").fill_null(pl.col("_r")), pl.col("host").fill_null(pl.col("_h"))).drop("_r", "_h")


def checkpoint_line(acc: Acc, line: str, n: int) -> None:
    """One checkpoint-save line -> a `checkpoints` row (the line is still classified as before)."""
    if "heckpoint" not in line and "saving model to" not in line:  # cheap guard: almost every line stops here
        return
    if CK_FAIL.search(line):
        return
    row = _ck_fields(line)
    if row is None:
        return
    rm = PT_RANK.search(line)
    tm = CK_ISO.search(line)
    gm = None if tm else CK_GLOG.search(line)
    acc.add("checkpoints", host=None, line=n, rank=int(rm["r"] or rm["R"]) if rm else None,
            time_ns=_iso_ns(tm) if tm else None, stamp=f"{gm['md']} {gm['t']}" if gm else None, **row)


def _ck_fields(line: str) -> dict[str, Any] | None:
    """iteration / step / epoch / path / framework of a save line; None when it is not one."""
    m = CK_MEGATRON.search(line)
    if m:
        return dict(iteration=int(m["it"]), step=None, epoch=None, path=m["path"], framework="megatron")
    m = CK_DEEPSPEED.search(line)
    if m:
        sm = CK_STEP.search(m["path"] or "")
        return dict(iteration=None, step=int(sm["step"]) if sm else None, epoch=None, path=m["path"],
                    framework="deepspeed")
    m = CK_LIGHTNING.search(line)
    if m and "saving model to" in line:
        pm = CK_LIGHTNING_TO.search(line, m.end())
        return dict(iteration=None, step=int(m["step"]), epoch=int(m["ep"]), path=pm["path"] if pm else None,
                    framework="lightning")
    if "Saving latest checkpoint" in line:
        return dict(iteration=None, step=None, epoch=None, path=None, framework="lightning")
    m = CK_GENERIC.search(line)
    if m:
        pm = CK_GEN_PATH.search(line, m.end())
        sm = CK_STEP.search(line)
        return dict(iteration=None, step=int(sm["step"]) if sm else None, epoch=None,
                    path=pm["path"] if pm else None, framework="generic")
    return None


def _iso_ns(m: re.Match[str]) -> int | None:
    try:
        t = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000 + int((m["f"] or "0").ljust(9, "0"))
