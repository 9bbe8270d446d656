"""Who is stuck where: per process group, each rank's last enqueued / completed collective and its state.

From the Flight Recorder dumps (``fr_pg_status``) through the same vote as the ``hang`` detector
(:mod:`forensics.facts.hang`); the culprit marks are the ``hang`` findings' ranks, so the view and the findings agree.
Shown: the groups a culprit is in, then the groups with ranks waiting, at most :data:`MAX_ROWS` rows; and the
collective each blocked group waits in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.view import View

from forensics.detectors import kind_of as declared_kind
from forensics.detectors.hang_verdict import STUCK_RANK
from forensics.facts import hang

if TYPE_CHECKING:
    from forensics.pipeline import Analysis

MAX_ROWS = 400
CAPTION = ("Per process group, where each rank stopped: a culprit (marked) is stuck on the device (its enqueued "
           "work does not complete) or on the host (it stopped enqueuing); the others wait for it.")
STATE_TEXT = {"device": "stuck on the device", "host": "stuck on the host", "waiting": "waiting (work pending)",
              "done": "all its work completed", "no_vote": "not voting (pipeline group, one member, or a dump missing)"}


def hang_view(analysis: Analysis) -> View:
    view = View("who-is-stuck-where", "Who is stuck where", CAPTION)
    frames = analysis.context.frames
    if frames["fr_pg_status"].height == 0:
        view.empty_reason = "no Flight Recorder dumps in the inputs"
        return view
    # the Flight Recorder's stuck ranks (its declared kind, not another detector's stuck_rank): key "stuck_*:FOLDER"
    culprits = {(f.key.partition(":")[2], r) for f in analysis.findings
                if declared_kind(f) is STUCK_RANK for r in f.ranks}
    sets = hang.dump_sets(frames["fr_dumps"])
    for folder, sources in sets:
        # one job: every row is its own (no filtered copy of millions of entries)
        status, entries, dumps = (frames[n] if len(sets) == 1 else frames[n].filter(pl.col("source").is_in(sources))
                                  for n in ("fr_pg_status", "fr_entries", "fr_dumps"))
        where = f" ({folder})" if len(sets) > 1 else ""
        view.tables += _tables(status, entries, dumps, frames["fr_signatures"],
                               sorted(r for f, r in culprits if f == folder), where)
    return view


def _tables(status: pl.DataFrame, entries: pl.DataFrame, dumps: pl.DataFrame, signatures: pl.DataFrame,
            culprits: list[int], where: str) -> list[tuple[str, pl.DataFrame]]:
    verdict = hang.vote(hang.counters_from_dumps(status))
    g = verdict.groups.with_columns(pl.col("rank").is_in(culprits).alias("culprit"))
    involved = g.group_by("pg_name").agg(pl.col("culprit").any().alias("_c"), (pl.col("pending") > 0).any().alias("_w"))
    rows = g.join(involved, on="pg_name").filter(pl.col("_c") | pl.col("_w")).sort(
        ["_c", "_w", "pg_name", "rank"], descending=[True, True, False, False])
    table = rows.head(MAX_ROWS).select(
        "pg_name", pl.col("pg_desc").fill_null(""), "rank", "last_enqueued", "last_completed", "pending",
        pl.col("role").replace_strict(STATE_TEXT, default=pl.col("role")).alias("state"),
        pl.when(pl.col("culprit")).then(pl.lit("CULPRIT")).otherwise(pl.lit("")).alias("culprit"))
    more = f" (first {MAX_ROWS} of {rows.height})" if rows.height > MAX_ROWS else ""
    out = [(f"Ranks of the groups with a culprit or ranks waiting{where}{more}", table)]
    latest = dumps["latest_ns"].max()
    blocked = hang.blocked_collectives(verdict, entries,
                                       int(latest) if latest is not None else None,  # type: ignore[arg-type]
                                       signatures)
    if blocked.height:
        out.append((f"The collective each blocked group waits in{where}", blocked.select(
            "pg_name", pl.col("pg_desc").fill_null(""), "seq", pl.col("op").fill_null("?"),
            pl.col("waiting").cast(pl.List(pl.String)).list.join(", "),
            pl.col("never_joined").cast(pl.List(pl.String)).list.join(", "))))
    if verdict.undecided.height:
        out.append((f"Groups that cannot vote: members' dumps missing{where}", verdict.undecided.with_columns(
            pl.col("missing").cast(pl.List(pl.String)).list.join(", "))))
    return out
