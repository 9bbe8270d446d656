"""Who is stuck where: the hang verdict from per-group work counters (Flight Recorder dumps or watchdog lines).

Every rank of a process group (PG) runs the same collectives in the same order, numbered by a per-group
sequence. In a hang each rank's ``last enqueued`` and ``last completed`` numbers say where it stopped:

* a rank **stuck on the device** enqueued work that does not complete while its peers completed more
  (``last_completed < last_enqueued`` and ``last_completed`` the group's lowest, below its highest): its GPU
  (or a kernel ahead of the collective on its stream) does not finish;
* a rank **stuck on the host** stopped enqueuing while its peers went on (``last_enqueued`` below the group's
  highest, nothing of its own pending: ``last_completed == last_enqueued``): its CPU thread never reached the
  collective (a lock, the dataloader, an exception, a dead process).

Each PG casts one vote per rank and class; pipeline groups do not vote (their stages lag by design) and neither
does a group one of whose members left no counters (its vote could blame the wrong rank: "cannot decide").
The culprit is the rank whose state explains the others, not every rank behind: a rank stuck on the host with
nothing pending in any group it belongs to (it is idle, not waiting), or with votes from ``min_votes`` groups; a
rank stuck on the device with votes from ``min_votes`` groups (or from every group it could be voted in, when it
is in fewer). A rank behind in one group because it waits in another is a victim. Research and measurements:
../shared/research/wave3.md §1.7 (the two shared 16-rank cases name exactly the injected ranks).

Units: sequence numbers as the dumps count them; times epoch ns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.base import frames as fr
from forensics.facts.collectives import pg_type_expr


# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def _vote_schema() -> dict[str, Any]:
    return {"rank": pl.Int32, "cls": pl.String, "votes": pl.UInt32, "pgs": pl.List(pl.String)}


@dataclass(frozen=True)
class HangVerdict:
    """The verdict over one set of counters.

    ``groups``: one row per (pg_name, rank): pg_desc, pg_type, last_enqueued, last_completed, pending (enqueued
    and not completed), role (``device`` / ``host`` vote, ``waiting``, ``done``, ``no_vote``), voting (the group
    votes).
    ``votes``: rank, cls (device / host), votes (groups), pgs (their names).
    ``culprits``: the ``votes`` rows that are culprits, plus ``why``.
    ``undecided``: pg_name, pg_desc, missing (members with no counters, sorted), for groups that could not vote.
    ``missing``: ranks some group lists that left no counters at all.
    """

    groups: pl.DataFrame
    votes: pl.DataFrame
    culprits: pl.DataFrame
    undecided: pl.DataFrame
    missing: tuple[int, ...]

    def culprit_ranks(self, cls: str | None = None) -> list[int]:
        c = self.culprits if cls is None else self.culprits.filter(pl.col("cls") == cls)
        return sorted(set(c["rank"].to_list()))


def dump_sets(dumps: pl.DataFrame) -> list[tuple[str, list[str]]]:
    """The dumps of one job together: all of them, unless a rank has dumps in several folders (the dumps of
    several jobs or cases side by side); then one set per folder, named by it."""
    folder = pl.col("source").str.replace(r"/?[^/]*$", "")
    d = dumps.with_columns(folder.alias("folder"))
    if d.group_by("rank").agg(pl.col("folder").n_unique().alias("n"))["n"].max() in (None, 1):
        return [("", d["source"].to_list())]
    return [(str(k[0]), g["source"].to_list()) for k, g in d.sort("folder").group_by("folder", maintain_order=True)]


def counters_from_dumps(status: pl.DataFrame) -> pl.DataFrame:
    """fr_pg_status -> the vote's input: rank, pg_name, pg_desc, members (list), last_enqueued, last_completed."""
    return status.select(
        "rank", pl.col("pg_name").fill_null(pl.col("pg_id").cast(pl.String)), "pg_desc",
        pl.col("pg_ranks").alias("members"), "last_enqueued", "last_completed",
    ).unique(["rank", "pg_name"], keep="last")


def counters_from_watchdog(ct: pl.DataFrame) -> pl.DataFrame:
    """collective_timeouts rows with both counters -> the vote's input (group = the `[PG n]` id; members unknown)."""
    rows = ct.filter(pl.col("last_enqueued").is_not_null() & pl.col("last_completed").is_not_null()
                     & pl.col("rank").is_not_null())
    return rows.group_by("rank", pl.col("pg").cast(pl.String).fill_null("?").alias("pg_name")).agg(
        pl.lit(None, pl.String).alias("pg_desc"), pl.lit(None, pl.List(pl.Int32)).alias("members"),
        pl.col("last_enqueued").max(), pl.col("last_completed").max(),
    )


def _with_roles(c: pl.DataFrame, missing: pl.DataFrame) -> pl.DataFrame:
    g = pl.col("pg_name")
    enq, comp = pl.col("last_enqueued"), pl.col("last_completed")
    voting = ((pl.col("pg_type") != "PP") & (pl.len().over(g) >= 2)
              & ~g.is_in(missing["pg_name"].implode()))
    device = (comp < enq) & (comp == comp.min().over(g)) & (comp.min().over(g) < comp.max().over(g))
    host = (enq < enq.max().over(g)) & (comp == enq)
    return c.with_columns(pg_type_expr(pl.col("pg_desc").fill_null("")).alias("pg_type")).with_columns(
        voting.alias("voting"), (enq - comp).clip(0).alias("pending"),
    ).with_columns(
        pl.when(~pl.col("voting")).then(pl.lit("no_vote")).when(device).then(pl.lit("device"))
        .when(host).then(pl.lit("host")).when(comp < enq).then(pl.lit("waiting")).otherwise(pl.lit("done"))
        .alias("role"),
    )


def _missing_members(c: pl.DataFrame) -> pl.DataFrame:
    """Per group, the members its configuration lists that left no counters for it."""
    listed = c.drop_nulls("members").group_by("pg_name").agg(pl.col("pg_desc").first(), pl.col("members").first())
    present = c.group_by("pg_name").agg(pl.col("rank").alias("present"))
    out = listed.join(present, on="pg_name").with_columns(
        pl.col("members").list.set_difference(pl.col("present")).list.sort().alias("missing"))
    return out.filter(pl.col("missing").list.len() > 0).select("pg_name", "pg_desc", "missing").sort("pg_name")


def vote(counters: pl.DataFrame, min_votes: int = 2) -> HangVerdict:
    """The verdict over ``counters`` (see :func:`counters_from_dumps`, :func:`counters_from_watchdog`)."""
    undecided = _missing_members(counters)
    groups = _with_roles(counters, undecided)
    votes = (groups.filter(pl.col("role").is_in(["device", "host"]))
             .group_by("rank", pl.col("role").alias("cls")).agg(pl.len().alias("votes"), pl.col("pg_name").sort()
                                                                 .alias("pgs"))
             .sort("rank", "cls"))
    schema = _vote_schema()
    votes = votes.cast(schema) if votes.height else pl.DataFrame(schema=schema)  # type: ignore[arg-type]
    missing = sorted(set(undecided.explode("missing")["missing"].drop_nulls().to_list()) - set(counters["rank"]))
    return HangVerdict(groups, votes, _culprits(groups, votes, min_votes), undecided, tuple(missing))


def _culprits(groups: pl.DataFrame, votes: pl.DataFrame, min_votes: int) -> pl.DataFrame:
    per_rank = groups.group_by("rank").agg(
        (pl.col("pending") > 0).any().alias("busy"), pl.col("voting").sum().alias("could_vote"))
    v = votes.join(per_rank, on="rank", how="left")
    host = (pl.col("cls") == "host") & (~pl.col("busy") | (pl.col("votes") >= min_votes))
    device = (pl.col("cls") == "device") & (pl.col("votes") >= pl.min_horizontal(pl.lit(min_votes), "could_vote"))
    why = (pl.when(pl.col("cls") == "host")
           .then(pl.format("stopped enqueuing in {} group(s) while its peers went on"
                           + "{}", "votes", pl.when(~pl.col("busy")).then(pl.lit(", with nothing of its own pending"))
                           .otherwise(pl.lit(""))))
           .otherwise(pl.format("its enqueued work does not complete in {} group(s) whose other members completed more",
                                "votes")))
    return v.filter(host | device).with_columns(why.alias("why")).select("rank", "cls", "votes", "pgs", "why")


def blocked_collectives(verdict: HangVerdict, entries: pl.DataFrame, latest_ns: int | None,
                        signatures: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per voting group with waiting ranks: the collective they are blocked in (the lowest ``last_completed + 1``
    among ranks with work pending), the members that never enqueued it, its op / sizes / dtype from any member's
    entry (sizes and dtype from ``signatures``, the entries' ``fr_signatures``), and how long the others waited
    (from its earliest enqueue to the dumps' latest recorded time: a lower bound). Columns: pg_name, pg_desc, seq,
    waiting (ranks), never_joined (ranks), op, in_sizes, dtype, created_ns, timeout_ns, waited_ns."""
    g = verdict.groups.filter(pl.col("voting"))
    stuck = g.filter(pl.col("pending") > 0).group_by("pg_name").agg(
        (pl.col("last_completed").min() + 1).alias("seq"), pl.col("pg_desc").first())
    if stuck.height == 0:
        return pl.DataFrame()
    per = g.join(stuck.select("pg_name", "seq"), on="pg_name").group_by("pg_name").agg(
        pl.col("rank").filter(pl.col("last_enqueued") >= pl.col("seq")).sort().alias("waiting"),
        pl.col("rank").filter(pl.col("last_enqueued") < pl.col("seq")).sort().alias("never_joined"))
    out = stuck.join(per, on="pg_name")
    if entries.height:
        # the blocked sequence numbers first (integers: millions of entries), then the few rows as text
        near = as_text(entries.filter(pl.col("collective_seq").is_in(out["seq"].implode())))
        what = near.join(out.select("pg_name", "seq"), left_on=["pg_name", "collective_seq"],
                         right_on=["pg_name", "seq"]).group_by("pg_name").agg(
            pl.col("op").first(), pl.col("sig").first(), pl.col("created_ns").min(), pl.col("timeout_ns").max())
        shapes = with_signatures(what, signatures).select(
            "pg_name", "op", "in_sizes", pl.col("in_dtypes").list.first().alias("dtype"), "created_ns", "timeout_ns")
        out = out.join(shapes, on="pg_name", how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.String).alias("op"), pl.lit(None, pl.Int64).alias("created_ns"),
                               pl.lit(None, pl.Int64).alias("timeout_ns"))
    return out.with_columns((pl.lit(latest_ns, pl.Int64) - pl.col("created_ns")).alias("waited_ns")).sort("pg_name")


def as_text(entries: pl.DataFrame) -> pl.DataFrame:
    """Entries with their Categorical columns as String (to join the String columns of other frames)."""
    return entries.with_columns(pl.col(pl.Categorical).cast(pl.String))


def with_signatures(entries: pl.DataFrame, signatures: pl.DataFrame | None) -> pl.DataFrame:
    """Entries (a few rows, with ``sig``) with their shapes, dtypes and stack from ``fr_signatures``; entries
    that carry those columns already (built by hand) are taken as they are."""
    if "in_sizes" in entries.columns or "sig" not in entries.columns:
        return entries
    sigs = signatures if signatures is not None else pl.DataFrame(schema=fr.schema("fr_signatures"))
    return entries.join(sigs, on="sig", how="left")


def mismatches(entries: pl.DataFrame, signatures: pl.DataFrame | None = None) -> pl.DataFrame:
    """Collectives (same group, same ``collective_seq``, not point-to-point) whose members disagree, as fr_trace
    classifies them: ``collective_type`` (a different op), ``size`` (a different input element count, for ops whose
    inputs must match; all_to_all sizes may differ), ``dtype``, ``state`` (fr_trace's COLLECTIVE_STATE_MISMATCH:
    completed on some members, scheduled or started on others; on a tie ``completed`` counts as the majority, so
    the rank that did not complete is named). Columns: pg_name, pg_desc, seq, kind, value (the minority's),
    majority, ranks (the minority). ``signatures``: the entries' ``fr_signatures``."""
    # lazily: the filter reads the few columns it needs, not a copy of millions of entries
    e = _disagreeing(entries.lazy().filter(~pl.col("is_p2p").fill_null(False) & pl.col("collective_seq").is_not_null()
                                           & pl.col("pg_name").is_not_null()))
    if e.height == 0:
        return pl.DataFrame()
    e = with_signatures(as_text(e), signatures)
    e = e.unique(["pg_name", "collective_seq", "rank"], keep="last").with_columns(
        pl.col("in_dtypes").list.join(",").alias("dtype_key"), pl.col("in_numel").cast(pl.String).alias("size_key"),
        pl.col("state").cast(pl.String).alias("state_key"))
    parts = [_minority(e, "op", "collective_type"), _minority(e.filter(_sized()), "size_key", "size"),
             _minority(e, "dtype_key", "dtype"), _minority(e, "state_key", "state")]
    return pl.concat([p for p in parts if p.height], how="vertical") if any(p.height for p in parts) else pl.DataFrame()


def _sized() -> pl.Expr:
    return ~pl.col("op").str.contains("all_to_all|alltoall|coalesced|barrier|gather$|scatter$")


def _disagreeing(e: pl.LazyFrame) -> pl.DataFrame:
    """The entries of collectives whose members' entries differ in op, shapes (``sig``: sizes, dtypes, stack) or
    state: in a job of thousands of ranks almost every collective agrees, and only these need comparing (those
    that differ only where no class looks are compared and give nothing)."""
    keys = ["pg_name", "collective_seq"]
    shape = (pl.col("sig").n_unique() > 1) if "sig" in e.collect_schema().names() else (
        (pl.col("in_dtypes").n_unique() > 1) | (pl.col("in_numel").n_unique() > 1))
    split = e.group_by(keys).agg((
        (pl.col("op").n_unique() > 1) | shape | (pl.col("state").n_unique() > 1)).alias("split")).filter(
        pl.col("split")).select(keys).collect()
    return e.join(split.lazy(), on=keys, how="semi").collect() if split.height else e.head(0).collect()


def _minority(e: pl.DataFrame, col: str, kind: str) -> pl.DataFrame:
    keys = ["pg_name", "collective_seq"]
    counts = e.group_by(*keys, col).agg(pl.col("rank").sort(), pl.col("pg_desc").first(), pl.len().alias("n"))
    split = counts.filter(pl.len().over(keys) > 1)
    if split.height == 0:
        return pl.DataFrame()
    ranked = split.sort([*keys, "n", col], descending=[False, False, True, False]).with_columns(
        pl.col(col).first().over(keys).alias("majority"))
    return ranked.filter(pl.col(col) != pl.col("majority")).select(
        "pg_name", "pg_desc", pl.col("collective_seq").alias("seq"), pl.lit(kind).alias("kind"),
        pl.col(col).cast(pl.String).alias("value"), pl.col("majority").cast(pl.String), pl.col("rank").alias("ranks"))


def stack_outliers(entries: pl.DataFrame, signatures: pl.DataFrame | None = None) -> pl.DataFrame:
    """When dumps carry stacks: each rank's stack at its oldest pending entry (else its last entry), grouped; the
    ranks whose stack differs from the majority's. Columns: rank, stack (list), n_same (ranks sharing it), outlier.
    ``signatures``: the entries' ``fr_signatures`` (where the stacks are)."""
    if "stack" not in entries.columns:
        stacked = (signatures.filter(pl.col("stack").is_not_null() & (pl.col("stack").list.len() > 0))
                   if signatures is not None else pl.DataFrame())
        if stacked.height == 0:
            return pl.DataFrame()
        entries = entries.filter(pl.col("sig").is_in(stacked["sig"].implode())).join(
            stacked.select("sig", "stack"), on="sig", how="left")
    e = entries.filter(pl.col("stack").is_not_null() & (pl.col("stack").list.len() > 0))
    if e.height == 0:
        return pl.DataFrame()
    pending = pl.col("state") != "completed"
    top = e.sort("rank", "record_id").group_by("rank").agg(
        pl.when(pending.any()).then(pl.col("stack").filter(pending).first()).otherwise(pl.col("stack").last())
        .alias("stack"))
    top = top.with_columns(pl.col("stack").list.join("\n").alias("sig"))
    top = top.with_columns(pl.len().over("sig").alias("n_same"))
    biggest = top["n_same"].max()
    return top.with_columns((pl.col("n_same") < biggest).alias("outlier")).drop("sig").sort("rank")
