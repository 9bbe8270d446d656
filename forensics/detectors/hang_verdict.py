"""Hangs from PyTorch Flight Recorder dumps: who is stuck where, and why the others wait.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import polars as pl

from forensics.base.findings import CostBasis, Finding, FindingKind, MetricValue, Role, Severity, When
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.facts import hang
from forensics.facts.context import JobContext

DOC = DetectorDoc(
    summary="Hangs from PyTorch Flight Recorder dumps: who is stuck where, and why the others wait.",
    detects=(
        "Per process group, from each rank's Flight Recorder dump (last enqueued / completed collective, the "
        'pending entries): the rank stuck on the device (its enqueued work does not complete while its peers '
        'completed more), the rank stuck on the host (it stopped enqueuing while its peers went on), the '
        'collective the others are blocked in (op, sequence number, sizes, how long they waited), ranks that '
        "never joined it; collectives whose members disagree (type, sizes, dtype, state, as PyTorch's fr_trace "
        'classifies them); groups it cannot decide because dumps are missing (naming those ranks); and, when '
        'the dumps carry stacks, the ranks whose stack differs from the majority. When the logs hold the '
        "watchdog's counters for the same hang, it says whether their vote agrees."),
    matters=(
        'A hang costs every GPU of the job from the last progress until the watchdog kills it (often 30 '
        'minutes or more), and the rank that timed out is usually a victim: the culprit is the rank whose '
        'state explains the others. Naming it (and whether it is its GPU or its CPU thread) is what decides '
        'between draining a node and debugging the code.'),
    measures=(
        'forensics.facts.hang: each group votes (pipeline groups and groups with a missing dump do not): '
        "device-stuck = last_completed < last_enqueued and the group's lowest completed, below its highest; "
        "host-stuck = last_enqueued below the group's highest with nothing pending. A culprit needs votes "
        'from `min_votes` groups (or every group it could be voted in), or, for the host, nothing pending '
        "anywhere. Cost = GPUs x (the watchdog's kill, estimated as the blocked collective's enqueue time + "
        "its timeout, or the dumps' latest time when later - that enqueue time). Evidence: the culprits' rows (one "
        "per group they are voted stuck in), earliest first by when the group's blocked collective was enqueued "
        "(progress stopped there), then by rank and sequence number; then the ranks that wait for them, by rank, "
        "each in the group it was blocked in earliest; at most 12 of each."),
    todo=(
        "Device-stuck: check that rank's GPU (dmesg Xid/ECC, nvidia-smi), and the kernel before the "
        "collective on its stream; drain the node if the GPU is faulty. Host-stuck: look at that rank's "
        "Python stack (py-spy dump, the dump's `frames` with TORCH_NCCL_TRACE_CPP_STACK), its dataloader, "
        'locks and exceptions. Mismatch: make every rank issue the same collective with the same sizes and '
        "dtype. Missing dumps: collect every rank's dump (TORCH_NCCL_DUMP_ON_TIMEOUT=1, a shared "
        'TORCH_NCCL_DEBUG_INFO_TEMP_FILE path).'),
)
STUCK_RANK = FindingKind(
    "stuck_rank", "a rank whose state explains a hang: stuck on the device (its enqueued work does not complete) or "
    "on the host (it stopped enqueuing while its peers went on), from Flight Recorder dumps", Role.HANG,
    "Device: check the rank's GPU (Xid, ECC, nvidia-smi) and drain a faulty node; host: look at its Python stack, "
    "dataloader, locks and exceptions, and its host's OOM kills and hung tasks.", stage=1)
MISMATCH = FindingKind(
    "collective_mismatch", "the members of one collective (same group, same sequence number) disagree on its type, "
    "size, dtype or state, as PyTorch's fr_trace classifies them", Role.HANG,
    "Find the code path that makes these ranks issue a different collective, size or dtype and make every rank "
    "issue the same.", stage=1)
UNDECIDED = FindingKind(
    "hang_undecided", "the Flight Recorder dumps of some members of a group are missing: who is stuck there cannot "
    "be decided", Role.SYMPTOM,
    "Collect every rank's Flight Recorder dump (or its logs) and analyze again.")
_CLASS_TEXT = {"device": ("stuck on the device", "its GPU work does not complete"),
               "host": ("stuck on the host", "its CPU thread stopped issuing collectives")}


@dataclass(frozen=True)
class HangConfig:
    """Thresholds of the vote."""

    min_votes: int = setting(2, unit="process groups", low=1, high=64,
                             doc="groups that must vote for a rank (fewer when the rank is in fewer voting groups)")


@dataclass(frozen=True)
class _Job:
    """What every finding of one analysis reads."""

    verdict: hang.HangVerdict
    blocked: pl.DataFrame
    who: pl.DataFrame  # rank, host, bus_id
    gpus: int | None
    latest_ns: int | None
    watchdog: hang.HangVerdict | None


@detector("hang_verdict", doc=DOC, settings=HangConfig, requires_any=("fr_pg_status", "fr_dumps"),
          kinds=(STUCK_RANK, MISMATCH, UNDECIDED), view="who-is-stuck-where")
def detect(ctx: JobContext, cfg: HangConfig) -> list[Finding]:
    f = ctx.frames
    if f["fr_pg_status"].height == 0:
        raise Skip("the Flight Recorder dumps hold no per-group counters (no pg_status and no entries)")
    sets = hang.dump_sets(f["fr_dumps"])
    out: list[Finding] = []
    for folder, sources in sets:
        tables = (f["fr_pg_status"], f["fr_entries"], f["fr_dumps"])
        # one job: every row is its own (no filtered copy of millions of entries)
        mine = list(tables) if len(sets) == 1 else [t.filter(pl.col("source").is_in(sources)) for t in tables]
        status, entries, dumps = mine
        found = _verdict(ctx, cfg, status, entries, dumps, f["fr_signatures"])
        out += [replace(x, key=f"{x.key}:{folder}", title=f"{x.title} ({folder or '.'})") for x in found] \
            if len(sets) > 1 else found
    return out


def _verdict(ctx: JobContext, cfg: HangConfig, status: pl.DataFrame, entries: pl.DataFrame,
             dumps: pl.DataFrame, signatures: pl.DataFrame) -> list[Finding]:
    verdict = hang.vote(hang.counters_from_dumps(status), cfg.min_votes)
    latest = dumps["latest_ns"].max()
    latest_ns = int(latest) if latest is not None else None  # type: ignore[arg-type]
    job = _Job(verdict, hang.blocked_collectives(verdict, entries, latest_ns, signatures), _who(ctx, dumps),
               ctx.world_size or _expected(verdict, dumps), latest_ns, _watchdog(ctx, cfg))
    out = [_culprit_finding(job, _measure_culprit(job, cls, entries, signatures)) for cls in ("device", "host")
           if verdict.culprit_ranks(cls)]
    if verdict.undecided.height:
        out.append(_undecided_finding(job))
    out += _mismatch_findings(hang.mismatches(entries, signatures))
    return out


def _expected(verdict: hang.HangVerdict, dumps: pl.DataFrame) -> int:
    return len(set(dumps["rank"].drop_nulls().to_list()) | set(verdict.missing))


def _who(ctx: JobContext, dumps: pl.DataFrame) -> pl.DataFrame:
    """rank -> host, bus_id: the NCCL logs' identities first, else the host the dump's file name carries."""
    ident = ctx.identity.select("rank", "host", "bus_id").drop_nulls("rank").unique("rank", keep="first")
    named = dumps.select("rank", pl.col("host").alias("dump_host")).drop_nulls("rank").unique("rank")
    return named.join(ident, on="rank", how="full", coalesce=True).select(
        pl.col("rank").cast(pl.Int32), pl.col("host").fill_null(pl.col("dump_host")), "bus_id")


def _watchdog(ctx: JobContext, cfg: HangConfig) -> hang.HangVerdict | None:
    counters = hang.counters_from_watchdog(ctx.frames["collective_timeouts"])
    return hang.vote(counters, cfg.min_votes) if counters.height else None


def _names(df: pl.DataFrame, ranks: list[int], col: str) -> tuple[str, ...]:
    return tuple(sorted(set(df.filter(pl.col("rank").is_in(ranks))[col].drop_nulls().to_list())))


def _ranks(xs: list[int]) -> str:
    return ", ".join(map(str, xs))


def _blocked_text(b: pl.DataFrame) -> str:
    if b.height == 0:
        return ""
    parts = []
    for r in b.sort("pg_name").head(4).iter_rows(named=True):
        op = f"{r.get('op') or 'a collective'}"
        sizes = f" of {r['in_sizes']}" if r.get("in_sizes") else ""
        waited = f", enqueued at {_clock(r['created_ns'])} UTC" if r.get("created_ns") else ""
        if r.get("timeout_ns"):
            waited += f" (watchdog timeout {r['timeout_ns'] // 1_000_000_000} s)"
        never = f"; rank(s) {_ranks(r['never_joined'])} never enqueued it" if r["never_joined"] else ""
        parts.append(f"{r['pg_desc'] or 'group'} (PG {r['pg_name']}): rank(s) {_ranks(r['waiting'])} blocked in {op}"
                     f" #{r['seq']}{sizes}{waited}{never}")
    more = f" (and {b.height - 4} more group(s))" if b.height > 4 else ""
    return "Blocked: " + "; ".join(parts) + more + "."


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class _Culprit:
    """What the vote measured for one class of culprit (device or host): who, the blocked collectives they are in,
    the cost, the evidence rows, and whether the watchdog's counters and the stacks agree."""

    cls: str
    ranks: list[int]
    rows: pl.DataFrame  # rank, why, votes of each culprit
    blocked: pl.DataFrame  # the blocked collectives the culprits wait in or never joined
    metrics: dict[str, MetricValue]
    lost: float | None
    evidence: tuple[dict[str, Any], ...]
    agreement: dict[str, MetricValue]  # watchdog_culprits, watchdog_agrees (empty without the watchdog's counters)
    stacks: pl.DataFrame  # hang.stack_outliers of the dumps' entries

    @property
    def groups(self) -> str | None:
        """The process groups (Flight Recorder ``pg_name``) the culprits are voted stuck in."""
        names = sorted({str(e["pg_name"]) for e in self.evidence if e["role"] == "culprit" and e["pg_name"]})
        return ",".join(names) or None


def _measure_culprit(job: _Job, cls: str, entries: pl.DataFrame, signatures: pl.DataFrame) -> _Culprit:
    v = job.verdict
    ranks = v.culprit_ranks(cls)
    rows = v.culprits.filter(pl.col("rank").is_in(ranks))
    involved = ((pl.col("waiting").list.set_intersection(ranks).list.len() > 0)
                | (pl.col("never_joined").list.set_intersection(ranks).list.len() > 0))
    mine = job.blocked.filter(involved) if job.blocked.height else job.blocked
    metrics, lost = _cost(job, mine)
    agreement = _agreement_metrics(job, ranks)
    metrics.update({"class": cls, "culprit_ranks": _ranks(ranks),
                    "votes": ", ".join(f"{r}:{n}" for r, n in rows.select("rank", "votes").iter_rows()),
                    "groups_blocked": job.blocked.height, "missing_dumps": _ranks(list(v.missing)) or None,
                    **agreement})
    return _Culprit(cls, ranks, rows, mine, metrics, lost, _evidence(v, ranks, job.blocked), agreement,
                    hang.stack_outliers(entries, signatures))


def _culprit_words(c: _Culprit) -> tuple[str, str]:
    """The measured culprits in words: title and summary."""
    what, how = _CLASS_TEXT[c.cls]
    summary = (f"Rank(s) {_ranks(c.ranks)} {'is' if len(c.ranks) == 1 else 'are'} {what}: {how} "
               f"({'; '.join(f'rank {r[0]}: {r[1]}' for r in c.rows.select('rank', 'why').iter_rows())}). "
               f"{_blocked_text(c.blocked)} Their peers wait for them; the others are consequences."
               + _agreement_text(c.agreement) + _stacks_text(c.stacks))
    return f"Hang: rank(s) {_ranks(c.ranks)} {what}", summary


def _culprit_finding(job: _Job, c: _Culprit) -> Finding:
    title, summary = _culprit_words(c)
    return Finding(
        "hang_verdict", Severity.CRITICAL, title, summary, _REMEDIATION[c.cls],
        ranks=tuple(c.ranks), hosts=_names(job.who, c.ranks, "host"), gpus=_names(job.who, c.ranks, "bus_id"),
        metrics=c.metrics, evidence=c.evidence, gpu_seconds_lost=c.lost, key=f"stuck_{c.cls}",
        kind=STUCK_RANK.name, when=_when(c.metrics), cost=_basis(c.metrics, c.evidence), process_group=c.groups,
        victims=tuple(sorted({e["rank"] for e in c.evidence if e["role"] == "victim"})),
        confidence="high" if job.watchdog is None or c.agreement.get("watchdog_agrees") is not False else "medium",
    )


_REMEDIATION = {
    "device": "Check the named ranks' GPUs first (dmesg Xid / ECC / fallen off the bus, nvidia-smi -q) and the kernel "
              "ahead of the collective on their stream; drain the node if the GPU is faulty; then restart from the "
              "last checkpoint.",
    "host": "Look at the named ranks' host thread: py-spy dump --pid, faulthandler, the dump's stack frames "
            "(TORCH_NCCL_TRACE_CPP_STACK=1), its dataloader, locks, the GIL and exceptions swallowed on that rank; "
            "check the host for OOM kills and hung tasks.",
}


def _cost(job: _Job, blocked: pl.DataFrame) -> tuple[dict[str, MetricValue], float | None]:
    """GPUs x (kill - last progress): progress stopped when the first blocked collective was enqueued; the watchdog
    kills at the first of their timeouts (never before the dumps' latest recorded time)."""
    timed = blocked.filter(pl.col("created_ns").is_not_null()) if "created_ns" in blocked.columns else blocked.head(0)
    if timed.height == 0:
        return {}, None
    start = int(timed["created_ns"].min())  # type: ignore[arg-type]
    deadline = timed.select((pl.col("created_ns") + pl.col("timeout_ns")).min()).item()
    kill = max(int(deadline) if deadline is not None else start, job.latest_ns or start)
    metrics: dict[str, MetricValue] = {"hang_start_ns": start, "time_ns": kill, "ran_ms": (kill - start) // 1_000_000}
    if not job.gpus or kill <= start:
        return metrics, None
    return metrics, round(job.gpus * (kill - start) / 1e9, 3)


def _when(metrics: dict[str, MetricValue]) -> When:
    start, kill = metrics.get("hang_start_ns"), metrics.get("time_ns")
    if isinstance(start, int) and isinstance(kill, int):
        return When.span(start, kill, "from the enqueue of the first blocked collective (Flight Recorder) to the "
                                      "watchdog's kill (its timeout, or the dumps' latest recorded time)")
    return When.unknown("the dumps hold no time for the blocked collective")


def _basis(metrics: dict[str, MetricValue], evidence: tuple[dict[str, Any], ...]) -> CostBasis:
    """A hang found in the dumps killed the job: when (the watchdog's kill) and for how long the others waited."""
    start, kill = metrics.get("hang_start_ns"), metrics.get("time_ns")
    known = isinstance(start, int) and isinstance(kill, int)
    return CostBasis(fatal=True, died_ns=kill if known else None,  # type: ignore[arg-type]
                     hung_s=(kill - start) / 1e9 if known else None,  # type: ignore[operator]
                     waiting_ranks=sum(e["role"] == "victim" for e in evidence) or None)


_EVIDENCE_ROWS = 12  # culprit rows, and as many victim rows


def _evidence(v: hang.HangVerdict, ranks: list[int], blocked: pl.DataFrame) -> tuple[dict[str, Any], ...]:
    """The culprits' rows (one per group they are voted stuck in), earliest first by when the group's blocked
    collective was enqueued (progress stopped there; groups without a time last), then by rank and the blocked
    sequence number; then the ranks waiting for them by rank, each in the group it was blocked in earliest. At most
    ``_EVIDENCE_ROWS`` of each, the same whatever the order of the dumps' rows."""
    order = ["_t", "rank", "_seq", "pg_name"]
    pgs = v.groups.filter(pl.col("rank").is_in(ranks) & pl.col("role").is_in(["device", "host"])).join(
        _blocked_at(blocked), on="pg_name", how="left").sort(order, nulls_last=True)
    culprit = pgs.select(pl.col("rank"), pl.lit("culprit").alias("role"), "pg_name", "pg_desc", "last_enqueued",
                         "last_completed", pl.col("role").alias("state"))
    waiting = v.groups.join(pgs.select("pg_name", pl.col("rank").alias("waited_for"), "_t", "_seq"), on="pg_name")
    victims = (waiting.filter(~pl.col("rank").is_in(ranks) & (pl.col("role") == "waiting"))
               .sort("rank", "_t", "_seq", "pg_name", "waited_for", nulls_last=True)
               .unique("rank", keep="first", maintain_order=True)
               .select("rank", pl.lit("victim").alias("role"), "pg_name", "pg_desc", "last_enqueued",
                       "last_completed", pl.col("role").alias("state"), "waited_for"))
    return tuple(culprit.head(_EVIDENCE_ROWS).to_dicts()) + tuple(victims.head(_EVIDENCE_ROWS).to_dicts())


def _blocked_at(blocked: pl.DataFrame) -> pl.DataFrame:
    """pg_name -> when its blocked collective was first enqueued (``_t``, ns; null when the dumps do not say) and its
    sequence number (``_seq``)."""
    if "pg_name" not in blocked.columns:  # no group is blocked
        return pl.DataFrame(schema={"pg_name": pl.String, "_t": pl.Int64, "_seq": pl.Int64})
    return blocked.select("pg_name", pl.col("created_ns").cast(pl.Int64).alias("_t"),
                          pl.col("seq").cast(pl.Int64).alias("_seq"))


def _agreement_metrics(job: _Job, ranks: list[int]) -> dict[str, MetricValue]:
    if job.watchdog is None:
        return {}
    wd = job.watchdog.culprit_ranks()
    return {"watchdog_culprits": _ranks(wd) or None, "watchdog_agrees": set(wd) == set(ranks) if wd else None}


def _agreement_text(m: dict[str, MetricValue]) -> str:
    if not m:
        return ""
    if m["watchdog_agrees"] is None:
        return " The watchdog's counters in the logs name no culprit on their own."
    if m["watchdog_agrees"]:
        return " The watchdog's counters in the logs give the same verdict."
    return f" The watchdog's counters in the logs name rank(s) {m['watchdog_culprits']} instead."


def _stacks_text(s: pl.DataFrame) -> str:
    if s.height == 0 or not s["outlier"].any():
        return ""
    odd = s.filter(pl.col("outlier"))
    first: list[str] = odd["stack"][0].to_list()
    frame = first[0] if first else "?"
    return (f" Stacks: rank(s) {_ranks(odd['rank'].to_list())} differ from the majority "
            f"({s['n_same'].max()!s} rank(s)); e.g. `{frame}`.")


def _undecided_words(undecided: pl.DataFrame, missing: list[int]) -> tuple[str, str]:
    """The undecided groups (pg_name, pg_desc, missing) in words: title and summary."""
    groups = "; ".join(f"{r['pg_desc'] or 'group'} (PG {r['pg_name']}) lacks {_ranks(r['missing'])}"
                       for r in undecided.head(6).iter_rows(named=True))
    return (f"Hang verdict undecided: the dumps of rank(s) {_ranks(missing)} are missing",
            f"Cannot decide who is stuck in {undecided.height} process group(s): {groups}. A rank without a dump "
            "(or log) is never named a culprit; the missing rank may be the one the others wait for.")


def _undecided_finding(job: _Job) -> Finding:
    undecided = job.verdict.undecided
    missing = sorted(set(undecided.explode("missing")["missing"].drop_nulls().to_list()))
    title, summary = _undecided_words(undecided, missing)
    return Finding(
        "hang_verdict", Severity.WARNING, title, summary,
        "Collect every rank's Flight Recorder dump (TORCH_NCCL_DUMP_ON_TIMEOUT=1 / TORCH_FR_DUMP_TEMP_FILE on "
        "storage every rank can write), or its logs, and analyze again.",
        key="undecided", confidence="medium", kind=UNDECIDED.name,
        when=When.unknown("Flight Recorder dumps carry no time of their own"),
        process_group=",".join(sorted(str(g) for g in undecided["pg_name"].drop_nulls().unique())) or None,
        metrics={"missing_ranks": _ranks(missing), "undecided_groups": undecided.height},
        evidence=tuple(undecided.with_columns(pl.col("missing").cast(pl.List(pl.String)).list.join(","))
                       .head(10).to_dicts()),
    )


_MISMATCH_TEXT = {
    "state": ("Their entries for it are not completed (or not started) where their peers' are: their GPU work, or "
              "the watchdog's view of it, stopped there (fr_trace's COLLECTIVE_STATE_MISMATCH).",
              "Check the named ranks' GPUs (Xid, ECC, nvidia-smi) and the kernels ahead of the collective on their "
              "stream; the stuck-rank verdict says whether they are the culprits."),
}
_MISMATCH_DEFAULT = (
    "Ranks that disagree wait on each other forever.",
    "Find the code path that makes these ranks issue a different collective, size or dtype (uneven batches, "
    "data-dependent shapes, a branch taken on some ranks) and make every rank issue the same.")


def _mismatch_findings(mm: pl.DataFrame) -> list[Finding]:
    if mm.height == 0:
        return []
    return [_mismatch_finding(str(kind), g) for (kind,), g in mm.group_by("kind", maintain_order=True)]


def _mismatch_finding(kind: str, g: pl.DataFrame) -> Finding:
    """One finding per class: a state mismatch is what a stuck rank looks like (a warning beside the verdict), the
    others are the code's own errors."""
    ranks = sorted(set(g.explode("ranks")["ranks"].to_list()))
    first = g.row(0, named=True)
    why, remedy = _MISMATCH_TEXT.get(kind, _MISMATCH_DEFAULT)
    return Finding(
        "hang_verdict", Severity.WARNING if kind == "state" else Severity.CRITICAL,
        f"Collective {kind.replace('_', ' ')} mismatch between ranks",
        f"In {first['pg_desc'] or 'group'} (PG {first['pg_name']}) collective #{first['seq']}: rank(s) "
        f"{_ranks(first['ranks'])} have {kind.replace('_', ' ')} {first['value']} where the others have "
        f"{first['majority']} ({g.height} such collective(s)). {why}",
        remedy, ranks=tuple(ranks), key=f"mismatch_{kind}", confidence="medium" if kind == "state" else "high",
        kind=MISMATCH.name, when=When.unknown("Flight Recorder dumps carry no time of their own"),
        process_group=",".join(sorted(str(p) for p in g["pg_name"].drop_nulls().unique())) or None,
        metrics={"kind": kind, "collectives": g.height, "seq": first["seq"], "pg_name": first["pg_name"]},
        evidence=tuple(g.with_columns(pl.col("ranks").cast(pl.List(pl.String)).list.join(",")).head(10).to_dicts()),
    )
