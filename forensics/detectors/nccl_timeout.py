"""Collective timeouts, hangs and desyncs: PyTorch ProcessGroupNCCL watchdog, NCCL RAS, fatal NCCL errors.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import polars as pl

from forensics.base.findings import CostBasis, Finding, FindingKind, Role, Severity, When
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.facts import hang
from forensics.facts.context import JobContext
from forensics.facts.job_year import job_year, placed
from forensics.facts.nccl_setup import JobNccl, evidence, where
from forensics.parsers.timestamps import earliest_glog_ns

TIMEOUT = FindingKind(
    "timeout", "ranks report a collective that timed out (watchdog or blocking wait): the job hung and was killed",
    Role.HANG,
    "Find the rank that did not arrive (desync report, flight recorder dump, the rank with the lowest "
    "last-enqueued work); check its host for GPU/NIC errors; enable TORCH_NCCL_TRACE_BUFFER_SIZE and "
    "TORCH_NCCL_DESYNC_DEBUG=1.")
DESYNC = FindingKind(
    "desync", "ranks issued different collectives (or sizes) at the same SeqNum, or a desync report names the rank "
    "that never joined", Role.HANG,
    "Find the branch that makes some ranks issue a different collective (conditional logging/eval, uneven "
    "data, an exception caught on one rank) and make every rank issue the same sequence.", stage=1)
MISSING_RANK = FindingKind(
    "missing_rank", "NCCL RAS reports ranks missing, dead or inconsistent in a communicator", Role.HANG,
    "Inspect the named process/GPU on that node (is it alive? stuck in host code? GPU errors?); an outlier "
    "node with a different process count points at a launcher/config mistake.", stage=1)
CUDA_FAILURE = FindingKind(
    "cuda_failure", "a CUDA error inside NCCL killed a communicator", Role.FAULT,
    "Debug the CUDA fault on that GPU first (compute-sanitizer, CUDA_LAUNCH_BLOCKING=1, dmesg Xid); "
    "network errors on other ranks are secondary.", stage=1)

def _event_span(rows: pl.DataFrame, what: str) -> When:
    """From the first to the last of ``rows`` (nccl_events) that carries a time (its own stamp, glog stamps placed
    with the job's year); unknown when none does."""
    t = rows["time_ns"].drop_nulls()
    if t.len() == 0:
        return When.unknown(f"the {what} lines carry no wall-clock stamp (nor a glog stamp with the job's year)")
    lo, hi = int(cast(int, t.min())), int(cast(int, t.max()))
    return When.span(lo, hi, f"the {what} lines' own stamps (read as UTC when they name no zone)")


@dataclass(frozen=True)
class NcclTimeoutConfig:
    """Thresholds of the timeout checks."""

    late_detection_ratio: float = setting(2.0, unit="ratio", low=1.0,
                                          doc="ran-for / Timeout(ms) above this means the watchdog noticed the hang "
                                              "late")
    max_silent_fraction: float = setting(0.25, unit="fraction of communicator", low=0.0, high=1.0,
                                         doc="silent ranks are named culprits only up to this share of the "
                                             "communicator")


@dataclass
class _Logs:
    """The lines every check reads."""

    j: JobNccl
    ct: pl.DataFrame  # collective_timeouts
    ras: pl.DataFrame  # RAS errors
    ras_ok: pl.DataFrame  # RAS "all OK" lines
    cuda: pl.DataFrame  # CUDA failures inside NCCL
    year: int | None = None  # the job's year, for glog stamps that omit it

    @property
    def timeouts(self) -> pl.DataFrame:
        return self.ct.filter(pl.col("kind").is_in(["watchdog_timeout", "blocking_wait"]))

    @property
    def status(self) -> pl.DataFrame:
        return self.ct.filter(pl.col("kind") == "pg_status")

    @property
    def desync(self) -> pl.DataFrame:
        return self.ct.filter(pl.col("kind") == "desync")


@dataclass
class _Timeout:
    """Who reported the timed-out collective, who never issued it, who is stuck in it."""

    reporters: list[int]
    seqs: list[int]
    ops: list[str]
    timeout_ns: pl.Series  # the watchdog's `Timeout(ms)`, in ns
    ran_ns: pl.Series  # how long the collective had run when it was caught
    never: pl.DataFrame  # last enqueued < SeqNum
    stuck: pl.DataFrame  # enqueued >= SeqNum > completed
    culprits: list[int]
    silent: list[int] = field(default_factory=list)
    died_ns: int | None = None  # the earliest watchdog stamp (the job's year completes it)
    pgs: list[int] = field(default_factory=list)  # process groups of the timeout and status lines
    hosts: list[str] = field(default_factory=list)  # of the culprits (else the reporters)
    gpus: list[str] = field(default_factory=list)
    voted: dict[str, list[int]] = field(default_factory=dict)  # class -> ranks, from the counters' vote

    @property
    def ran_ms(self) -> int | None:
        return int(cast(int, self.ran_ns.max())) // 1_000_000 if self.ran_ns.len() else None

    @property
    def ratio(self) -> float | None:
        if not (self.ran_ns.len() and self.timeout_ns.len()):
            return None
        return cast(float, self.ran_ns.max()) / cast(float, self.timeout_ns.max())


def _timeout(t: _Logs, cfg: NcclTimeoutConfig) -> _Timeout:
    timeouts, status, j = t.timeouts, t.status, t.j
    never = status.filter(pl.col("last_enqueued") < pl.col("seq"))
    out = _Timeout(
        reporters=sorted(set(timeouts["rank"].drop_nulls().to_list()) | set(status["rank"].drop_nulls().to_list())),
        seqs=sorted(set(timeouts["seq"].drop_nulls().to_list()) | set(status["seq"].drop_nulls().to_list())),
        ops=sorted(set(timeouts["op_type"].drop_nulls().to_list())),
        timeout_ns=timeouts["timeout_ns"].drop_nulls(), ran_ns=timeouts["ran_ns"].drop_nulls(), never=never,
        stuck=status.filter((pl.col("last_enqueued") >= pl.col("seq")) & (pl.col("last_completed") < pl.col("seq"))),
        culprits=sorted(set(t.desync["lagging_rank"].drop_nulls().to_list())
                        | set(never["rank"].drop_nulls().to_list())),
    )
    if not out.culprits and status.height:
        # every rank printed its counters, none is below the SeqNum: the per-group vote (forensics.facts.hang)
        verdict = hang.vote(hang.counters_from_watchdog(t.ct))
        out.voted = {c: verdict.culprit_ranks(c) for c in ("device", "host") if verdict.culprit_ranks(c)}
        out.culprits = verdict.culprit_ranks()
    # ranks of the world communicator that reported nothing while the others timed out
    if j.nranks and out.reporters and not out.culprits:
        silent = sorted(set(range(j.nranks)) - set(out.reporters))
        if not silent or len(silent) > cfg.max_silent_fraction * j.nranks:
            silent = []
        out.silent = out.culprits = silent
    named = j.ident.filter(pl.col("rank").is_in(out.culprits or out.reporters))
    out.hosts = sorted(set(named["host"].drop_nulls().to_list()))
    out.gpus = sorted(set(named["bus_id"].drop_nulls().to_list()))
    out.died_ns = earliest_glog_ns(timeouts["message"].drop_nulls().to_list(), t.year)
    out.pgs = sorted(set(pl.concat([timeouts["pg"], status["pg"]]).drop_nulls().to_list()))
    return out


def _ranks_text(df: pl.DataFrame) -> str:
    return ", ".join(map(str, sorted(set(df["rank"].drop_nulls().to_list()))))


def _timeout_text(t: _Logs, o: _Timeout, cfg: NcclTimeoutConfig) -> str:
    text = (f"{len(o.reporters)} rank(s) ({', '.join(map(str, o.reporters[:16]))}) report a timed-out collective "
            f"({', '.join(o.ops) or 'op not printed'}; SeqNum {', '.join(map(str, o.seqs[:6]))})")
    if o.timeout_ns.len():
        text += f" after Timeout(ms)={int(o.timeout_ns.max()) // 1_000_000}"  # type: ignore[arg-type]
    ratio = o.ratio
    if ratio is not None and ratio >= cfg.late_detection_ratio:
        ran_ms = int(o.ran_ns.max()) // 1_000_000  # type: ignore[arg-type]
        text += (f"; it ran {ran_ms} ms = {ratio:.1f}x the timeout, i.e. the job hung "
                 f"about {o.ran_ns.max() / 3.6e12:.1f} h before the watchdog acted")  # type: ignore[operator]
    if o.never.height:
        text += f"; rank(s) {_ranks_text(o.never)} never issued it (last enqueued < SeqNum)"
    if o.stuck.height:
        text += f"; rank(s) {_ranks_text(o.stuck)} issued it and are stuck inside (enqueued >= SeqNum > completed)"
    for cls, ranks in o.voted.items():
        text += (f"; the watchdog counters' vote names rank(s) {', '.join(map(str, ranks))} stuck on the {cls} "
                 f"({'enqueued work not completing' if cls == 'device' else 'stopped enqueuing'})")
    if o.silent:
        text += (f"; rank(s) {', '.join(map(str, o.silent))} of the {t.j.nranks}-rank communicator reported no "
                 "timeout: they never reached the collective (or their logs are missing)")
    if t.ras_ok.height and not t.ras.height:
        text += "; NCCL RAS reported every communicator OK at the time, which does not rule out a hang"
    return text


def check_timeout(t: _Logs, cfg: NcclTimeoutConfig) -> list[Finding]:
    """Ranks that report a timed-out collective, and the ranks that did not arrive."""
    if not (t.timeouts.height or t.status.height):
        return []
    return [_timeout_finding(t, _timeout(t, cfg), cfg)]


def _timeout_finding(t: _Logs, o: _Timeout, cfg: NcclTimeoutConfig) -> Finding:
    """The measured timeout in words, with its typed facts."""
    ratio, died, ran_ms = o.ratio, o.died_ns, o.ran_ms
    return Finding(
        "nccl_timeout", Severity.CRITICAL, "NCCL collective timed out", _timeout_text(t, o, cfg) + ".",
        TIMEOUT.remediation, kind=TIMEOUT.name, when=_hang_span(died, ran_ms),
        cost=CostBasis(fatal=True, died_ns=died, hung_s=None if ran_ms is None else ran_ms / 1e3,
                       waiting_ranks=len(o.reporters)),
        process_group=",".join(map(str, o.pgs)) or None,
        ranks=tuple(o.culprits or o.reporters), hosts=tuple(o.hosts), gpus=tuple(o.gpus),
        key="timeout:" + ",".join(map(str, o.seqs[:4])),
        confidence="high" if (o.culprits and not o.silent) else "medium",
        metrics={"reporting_ranks": len(o.reporters), "culprit_ranks": ",".join(map(str, o.culprits)) or None,
                 "timeout_ms": int(o.timeout_ns.max()) // 1_000_000  # type: ignore[arg-type]
                 if o.timeout_ns.len() else None,
                 "ran_over_timeout": round(ratio, 2) if ratio is not None else None,
                 "seq": o.seqs[0] if o.seqs else None,
                 "ran_ms": ran_ms, "time_ns": died},
        evidence=evidence(pl.concat([t.timeouts, t.status], how="vertical"),
                          ("rank", "kind", "pg", "seq", "op_type", "numel_in", "last_enqueued", "last_completed",
                           "line")),
    )


def _hang_span(logged: int | None, ran_ms: int | None) -> When:
    """From the hung collective's start (the watchdog's stamp minus how long it ran) to the watchdog's stamp."""
    if logged is None:
        return When.unknown("the watchdog lines' stamps carry no year and the job's year is unknown")
    if ran_ms is None:
        return When.span(logged, logged, "the watchdog line's stamp (how long the collective ran is not logged)")
    return When.span(logged - ran_ms * 1_000_000, logged, "the watchdog line's stamp minus the collective's run time")


def _minority(groups: pl.DataFrame) -> list[int]:
    """Per SeqNum, the ranks of the smallest (op, size) group when the groups differ in size."""
    minority: list[int] = []
    for (_seq,), g in groups.group_by("seq", maintain_order=True):
        g = g.with_columns(pl.col("rank").list.len().alias("n")).sort("n")
        if g.height > 1 and g["n"][0] < g["n"][-1]:
            minority += g["rank"][0].to_list()
    return minority


@dataclass(frozen=True)
class _Desync:
    """What a desynchronised collective measured: per SeqNum the (op, size) groups and their ranks, the ranks
    named as not joining (desync reports, else the minority group), the timeout lines involved, its time."""

    groups: pl.DataFrame  # seq, op_type, numel_in, rank (list)
    named: list[int]
    rows: pl.DataFrame  # the timeout lines of the split SeqNums
    reports: pl.DataFrame  # desync report lines
    when: When


def _desync(t: _Logs) -> _Desync | None:
    """One SeqNum, different collectives or sizes on different ranks (or a desync report); None when neither."""
    timeouts, desync = t.timeouts, t.desync
    if not (timeouts.height or t.status.height):
        return None
    per_seq = (timeouts.group_by("seq", maintain_order=True)
               .agg(pl.col("op_type").unique().sort(), pl.col("numel_in").unique().drop_nulls().sort(),
                    pl.col("rank").unique().drop_nulls().sort()))
    split = per_seq.filter((pl.col("op_type").list.len() > 1) | (pl.col("numel_in").list.len() > 1))
    if not (split.height or desync.height):
        return None
    rows = timeouts.join(split.select("seq"), on="seq") if split.height else timeouts.head(0)
    groups = (rows.group_by("seq", "op_type", "numel_in").agg(pl.col("rank").unique().sort())
              .sort("seq", "op_type", "numel_in", nulls_last=True))
    named = sorted(set(desync["lagging_rank"].drop_nulls().to_list())) or sorted(_minority(groups))
    return _Desync(groups, named, rows, desync, _desync_span(t, rows))


def _desync_finding(d: _Desync) -> Finding:
    """The measured desync in words, with its typed facts."""
    desc = "; ".join(f"SeqNum {r['seq']}: rank(s) {', '.join(map(str, r['rank']))} in {r['op_type']} "
                     f"(NumelIn {r['numel_in']})" for r in d.groups.sort("seq", "op_type").iter_rows(named=True))
    return Finding(
        "nccl_timeout", Severity.CRITICAL, "Ranks desynchronised: different collectives at the same SeqNum",
        (desc or "a desync report names the rank that did not join") + ". The ranks issued different "
        "collectives (code-path divergence), so they wait on each other forever; this is not a network fault.",
        DESYNC.remediation, kind=DESYNC.name, when=d.when,
        ranks=tuple(d.named or sorted(set(d.rows["rank"].drop_nulls().to_list()))), key="desync",
        confidence="high" if d.named else "medium",
        evidence=evidence(d.groups.with_columns(pl.col("rank").cast(pl.List(pl.String)).list.join(",")),
                          ("seq", "op_type", "numel_in", "rank"))
        + evidence(d.reports, ("rank", "lagging_rank", "seq", "line")),
    )


def check_desync(t: _Logs, cfg: NcclTimeoutConfig) -> list[Finding]:
    """One SeqNum, different collectives or sizes on different ranks."""
    d = _desync(t)
    return [] if d is None else [_desync_finding(d)]


def _desync_span(t: _Logs, rows: pl.DataFrame) -> When:
    """The desynchronised collective's lines (and desync reports): the same clock as the timeout's."""
    lines = pl.concat([rows["message"], t.desync["message"]]).drop_nulls().to_list()
    ran_ns = rows["ran_ns"].drop_nulls()
    return _hang_span(earliest_glog_ns(lines, t.year),
                      int(cast(int, ran_ns.max())) // 1_000_000 if ran_ns.len() else None)


@dataclass(frozen=True)
class _Ras:
    """What NCCL RAS reported: its group summaries, the error classes of missing ranks, the nodes named."""

    groups: tuple[str, ...]
    errors: tuple[str, ...]
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    lines: int
    when: When
    evidence: tuple[dict, ...]


def measure_ras(t: _Logs) -> _Ras | None:
    ras = t.ras
    if not ras.height:
        return None
    missing = ras.filter(pl.col("kind") == "ras_missing")["message"].to_list()
    return _Ras(tuple(ras.filter(pl.col("kind") == "ras_group")["message"].to_list()),
                tuple(sorted(set(m.split(":")[0] for m in missing))),
                tuple(sorted(set(ras["peer"].drop_nulls().to_list()))),
                tuple(sorted(set(ras["rank"].drop_nulls().to_list()))), ras.height, _event_span(ras, "RAS error"),
                evidence(ras, ("line", "kind", "peer", "code", "message")))


def _ras_words(r: _Ras) -> tuple[str, str]:
    return ("NCCL RAS reports missing or inconsistent ranks",
            f"RAS: {'; '.join(r.groups) or 'errors'}"
            + (f"; {', '.join(r.errors)} on node(s) {', '.join(r.nodes)}" if r.nodes else "")
            + ". A rank that stops reporting is dead, hung before the collective, or unreachable.")


def check_ras(t: _Logs, cfg: NcclTimeoutConfig) -> list[Finding]:
    """NCCL RAS: ranks missing, dead or outliers."""
    r = measure_ras(t)
    if r is None:
        return []
    title, summary = _ras_words(r)
    return [Finding(
        "nccl_timeout", Severity.CRITICAL, title, summary, MISSING_RANK.remediation, kind=MISSING_RANK.name,
        when=r.when, ranks=r.ranks, hosts=r.nodes, key="ras", confidence="high", metrics={"ras_error_lines": r.lines},
        evidence=r.evidence,
    )]


@dataclass(frozen=True)
class _Cuda:
    """The first CUDA error NCCL logged, and where."""

    message: str
    place: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]  # ranks, hosts, GPUs
    when: When
    evidence: tuple[dict, ...]


def measure_cuda(t: _Logs) -> _Cuda | None:
    cuda = t.cuda
    if not cuda.height:
        return None
    return _Cuda(cuda["message"][0], where(cuda, t.j.ident), _event_span(cuda, "CUDA failure"),
                 evidence(cuda, ("host", "pid", "cuda_dev", "line", "file_line", "message")))


def _cuda_words(c: _Cuda) -> tuple[str, str]:
    return ("A CUDA error aborted NCCL",
            f"NCCL hit `{c.message}` on {', '.join(c.place[1]) or 'a rank'}: the communicator is dead and peers "
            "see resets or timeouts as a consequence.")


def check_cuda(t: _Logs, cfg: NcclTimeoutConfig) -> list[Finding]:
    """A CUDA error inside NCCL: the root of the peers' resets and timeouts."""
    c = measure_cuda(t)
    if c is None:
        return []
    title, summary = _cuda_words(c)
    ranks, hosts, gpus = c.place
    return [Finding(
        "nccl_timeout", Severity.CRITICAL, title, summary, CUDA_FAILURE.remediation, kind=CUDA_FAILURE.name,
        when=c.when, ranks=ranks, hosts=hosts, gpus=gpus, key="cuda_failure", confidence="high", evidence=c.evidence,
    )]


CHECKS: tuple[Callable[[_Logs, NcclTimeoutConfig], list[Finding]], ...] = (check_timeout, check_desync, check_ras,
                                                                           check_cuda)


DOC = DetectorDoc(
    summary=(
        "Collective timeouts, hangs and desyncs: PyTorch ProcessGroupNCCL watchdog, NCCL RAS, fatal NCCL "
        "errors."
    ),
    detects=(
        "Watchdog and blocking-wait timeouts with the collective (OpType, SeqNum, NumelIn), the timeout and "
        "how long it actually ran; desynchronisation (ranks at the same SeqNum in different collectives or "
        "sizes, and `TORCH_NCCL_DESYNC_DEBUG` reports naming the rank that never joined); ranks that never "
        "issued the collective (last enqueued < SeqNum) versus ranks stuck inside it; NCCL RAS reports of "
        "missing / dead processes and mismatched op counts, with node, process and GPU; and the CUDA failure "
        "that killed a communicator (`Cuda failure '...'` in NCCL)."
    ),
    matters=(
        "A timeout costs the whole job: every rank waits for the slowest, then the job dies or restarts from "
        "a checkpoint. The rank that timed out is usually not the culprit; the one that never arrived is."
    ),
    measures=(
        "collective_timeouts (PyTorch lines) grouped by (process group, SeqNum); nccl_events for RAS and CUDA"
        " failures, placed in time by their lines' own stamps (``time_ns``; glog stamps with the job's year), "
        "unknown when they carry none. Culprits: ranks named by a desync report; else ranks whose last enqueued "
        "work is below the timed-out SeqNum; else the per-group vote over the watchdog's last enqueued / last "
        "completed counters (forensics.facts.hang: stuck on the device or on the host); else the few ranks of "
        "the world communicator (size from NCCL init lines) that "
        "report no timeout while the others do; else, for a desync, the ranks in the minority collective; "
        "otherwise the ranks that reported the timeout are listed as reporters, not culprits (confidence "
        "lowered)."
    ),
    todo=(
        "Desync: find the code path that issues a different collective on some ranks (data-dependent "
        "branches, uneven batches, exceptions swallowed on one rank). Never-issued: that rank is stuck before"
        " the collective (dataloader, host code, an earlier hang). Stuck inside: check that rank's GPU and "
        "links (dmesg Xid, nccl_transport findings). Enable TORCH_NCCL_TRACE_BUFFER_SIZE (flight recorder) "
        "and TORCH_NCCL_DESYNC_DEBUG=1 to get stack traces of the next hang."
    ),
)


@detector("nccl_timeout", doc=DOC, settings=NcclTimeoutConfig, requires_any=("collective_timeouts", "nccl_events"),
          kinds=(TIMEOUT, DESYNC, MISSING_RANK, CUDA_FAILURE), view="hw-events")
def detect(ctx: JobContext, cfg: NcclTimeoutConfig) -> list[Finding]:
    frames = ctx.frames
    year = job_year(frames)
    ct, ev = frames["collective_timeouts"], placed(frames["nccl_events"], year)
    ras = ev.filter(pl.col("kind").is_in(["ras_missing", "ras_dead", "ras_outlier"])
                    | ((pl.col("kind") == "ras_group") & (pl.col("level") == "WARN")))
    ras_ok = ev.filter((pl.col("kind") == "ras_group") & (pl.col("level") == "INFO"))
    cuda = ev.filter(pl.col("kind") == "cuda_failure")
    if ct.height == 0 and ras.height == 0 and cuda.height == 0:
        raise Skip("no PyTorch watchdog/timeout lines, NCCL RAS errors or fatal NCCL errors in the logs")
    t = _Logs(ctx.nccl, ct, ras, ras_ok, cuda, year)
    return [f for check in CHECKS for f in check(t, cfg)]
