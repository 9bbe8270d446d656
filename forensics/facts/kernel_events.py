"""Kernel-log rows -> events: one host per line, a clock per line (wall, monotonic or none), duplicates
collected twice dropped, ``fields`` decoded, sorted per host by time. Events are plain dicts (the
kernel_events columns plus ``clock``, ``t`` and the decoded fields ``f``)."""

from __future__ import annotations

from typing import Any

import orjson
import polars as pl

from forensics.facts.placement import Placement

Event = dict[str, Any]


def place_across_files(ke: pl.DataFrame) -> pl.DataFrame:
    """A monotonic-only file (plain `dmesg`) of a host whose syslog/journal copy carries wall + monotonic
    stamps: lines present in both (same host, monotonic stamp and text) prove the same boot and give
    its boot time, which places every line of that file and boot."""
    hk = pl.col("host").fill_null("")
    stamped = (ke.filter(pl.col("wall_ns").is_not_null() & pl.col("mono_ns").is_not_null())
               .select(hk.alias("_h"), "mono_ns", "message", (pl.col("wall_ns") - pl.col("mono_ns")).alias("_off"),
                       pl.col("source").alias("_src2")))
    bare = ke.filter(pl.col("wall_ns").is_null() & pl.col("mono_ns").is_not_null())
    if stamped.height == 0 or bare.height == 0:
        return ke
    offsets = (bare.with_columns(hk.alias("_h"))
               .join(stamped, on=["_h", "mono_ns", "message"], how="inner")
               .filter(pl.col("source") != pl.col("_src2"))
               .group_by("source", "_h", "boot").agg(pl.col("_off").median().cast(pl.Int64).alias("_boot_ns")))
    if offsets.height == 0:
        return ke
    ke = ke.with_columns(hk.alias("_h")).join(offsets, on=["source", "_h", "boot"], how="left")
    fill = pl.col("wall_ns").is_null() & pl.col("mono_ns").is_not_null() & pl.col("_boot_ns").is_not_null()
    return ke.with_columns(
        pl.when(fill).then(pl.col("_boot_ns") + pl.col("mono_ns")).otherwise(pl.col("wall_ns")).alias("wall_ns"),
        pl.when(fill).then(pl.lit("boot_time_other_file")).otherwise(pl.col("wall_source")).alias("wall_source"),
    ).drop("_h", "_boot_ns")


def prepare_events(normalized: pl.DataFrame) -> list[Event]:
    """The kernel_events frame (:func:`normalize_events`'d: ``JobContext.kernel_events``) as events, per
    host by time within a clock (file order breaks ties)."""
    rows = normalized.sort("source", "boot", "line").to_dicts()
    for r in rows:
        r["f"] = orjson.loads(r["fields"]) if r["fields"] else {}
    # quoted logs are not chronological: order by time within one file and boot
    rows.sort(key=lambda r: (r["host"] or "", r["source"], r["boot"] or 0,
                             r["t"] if r["t"] is not None else -1, r["line"]))
    return rows


def normalize_events(ke: pl.DataFrame, place: Placement) -> pl.DataFrame:
    """kernel_events with one host per line (the job's host names), ``clock`` (wall / mono / none) and
    ``t`` (its time on that clock), duplicates collected twice dropped."""
    place.learn_hosts(ke["host"].drop_nulls().unique().to_list())
    pairs = ke.select("host", "source").unique()
    mapping = pl.DataFrame(
        {"host": pairs["host"], "source": pairs["source"],
         "_host": [place.host_for(h, s) for h, s in pairs.iter_rows()]},
        schema={"host": pl.String, "source": pl.String, "_host": pl.String},
    )
    ke = (ke.join(mapping, on=["host", "source"], how="left", nulls_equal=True)
          .with_columns(pl.col("_host").alias("host")).drop("_host"))
    ke = place_across_files(ke)
    ke = ke.with_columns(
        pl.when(pl.col("wall_ns").is_not_null()).then(pl.lit("wall"))
        .when(pl.col("mono_ns").is_not_null()).then(pl.lit("mono")).otherwise(pl.lit("none")).alias("clock"),
        pl.coalesce("wall_ns", "mono_ns").alias("t"),
    )
    # the same line collected twice (syslog + journal + dmesg in one run dir) counts once; repeats
    # inside one file are real repeats and stay
    dup_key = [pl.col("host").fill_null(""), pl.col("wall_ns"), pl.col("message")]
    return ke.filter(pl.col("wall_ns").is_null() | (pl.col("source") == pl.col("source").first().over(dup_key)))


def synthetic_event(host: str | None, bus: str | None, source: str, line: int, t: int | None, kind: str,
                    message: str) -> Event:
    """An event for a line of a tool's report (nvidia-smi, dcgmi) rather than of a kernel log."""
    return {"host": host, "pci_bus_id": bus, "source": source, "line": line, "t": t,
            "clock": "wall" if t else "none", "boot": 0, "kind": kind, "xid": None, "message": message, "f": {},
            "time_text": None}
