"""Collective timeouts, hangs and desyncs: PyTorch ProcessGroupNCCL watchdog, NCCL RAS, fatal NCCL errors.

What it detects:
    Watchdog and blocking-wait timeouts with the collective (OpType, SeqNum, NumelIn), the timeout and
    how long it actually ran; desynchronisation (ranks at the same SeqNum in different collectives or
    sizes, and `TORCH_NCCL_DESYNC_DEBUG` reports naming the rank that never joined); ranks that never
    issued the collective (last enqueued < SeqNum) versus ranks stuck inside it; NCCL RAS reports of
    missing / dead processes and mismatched op counts, with node, process and GPU; and the CUDA
    failure that killed a communicator (`Cuda failure '...'` in NCCL).

Why it matters:
    A timeout costs the whole job: every rank waits for the slowest, then the job dies or restarts from
    a checkpoint. The rank that timed out is usually not the culprit; the one that never arrived is.

How it measures:
    collective_timeouts (PyTorch lines) grouped by (process group, SeqNum); nccl_events for RAS and
    CUDA failures. Culprits: ranks named by a desync report; else ranks whose last enqueued work is
    below the timed-out SeqNum; else the few ranks of the world communicator (size from NCCL init
    lines) that report no timeout while the others do; else, for a desync, the ranks in the minority
    collective; otherwise the
    ranks that reported the timeout are listed as reporters, not culprits (confidence lowered).

What to do:
    Desync: find the code path that issues a different collective on some ranks (data-dependent
    branches, uneven batches, exceptions swallowed on one rank). Never-issued: that rank is stuck before
    the collective (dataloader, host code, an earlier hang). Stuck inside: check that rank's GPU and
    links (dmesg Xid, nccl_transport findings). Enable TORCH_NCCL_TRACE_BUFFER_SIZE (flight recorder)
    and TORCH_NCCL_DESYNC_DEBUG=1 to get stack traces of the next hang.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from forensics.context import JobContext
from forensics.detectors import Skip, detector
from forensics.detectors._nccl import evidence, job, where
from forensics.findings import Finding, Severity
from forensics.settings import setting


@dataclass(frozen=True)
class NcclTimeoutConfig:
    """Thresholds of the timeout checks."""

    late_detection_ratio: float = setting(2.0, unit="ratio", low=1.0,
                                          doc="ran-for / Timeout(ms) above this means the watchdog noticed the hang late")
    max_silent_fraction: float = setting(0.25, unit="fraction of communicator", low=0.0, high=1.0,
                                         doc="silent ranks are named culprits only up to this share of the communicator")


@detector("nccl_timeout", settings=NcclTimeoutConfig, requires_any=("collective_timeouts", "nccl_events"))
def detect(ctx: JobContext, cfg: NcclTimeoutConfig) -> list[Finding]:
    frames = ctx.frames
    ct = frames["collective_timeouts"]
    ev = frames["nccl_events"]
    ras = ev.filter(pl.col("kind").is_in(["ras_missing", "ras_dead", "ras_outlier"])
                    | ((pl.col("kind") == "ras_group") & (pl.col("level") == "WARN")))
    ras_ok = ev.filter((pl.col("kind") == "ras_group") & (pl.col("level") == "INFO"))
    cuda = ev.filter(pl.col("kind") == "cuda_failure")
    if ct.height == 0 and ras.height == 0 and cuda.height == 0:
        raise Skip("no PyTorch watchdog/timeout lines, NCCL RAS errors or fatal NCCL errors in the logs")
    j = job(frames)
    out: list[Finding] = []

    timeouts = ct.filter(pl.col("kind").is_in(["watchdog_timeout", "blocking_wait"]))
    status = ct.filter(pl.col("kind") == "pg_status")
    desync = ct.filter(pl.col("kind") == "desync")
    if timeouts.height or status.height:
        per_seq = (timeouts.group_by("seq", maintain_order=True)
                   .agg(pl.col("op_type").unique().sort(), pl.col("numel_in").unique().drop_nulls().sort(),
                        pl.col("rank").unique().drop_nulls().sort()))
        never = status.filter(pl.col("last_enqueued") < pl.col("seq"))
        stuck = status.filter((pl.col("last_enqueued") >= pl.col("seq")) & (pl.col("last_completed") < pl.col("seq")))
        reporters = sorted(set(timeouts["rank"].drop_nulls().to_list()) | set(status["rank"].drop_nulls().to_list()))
        seqs = sorted(set(timeouts["seq"].drop_nulls().to_list()) | set(status["seq"].drop_nulls().to_list()))
        ops = sorted(set(timeouts["op_type"].drop_nulls().to_list()))
        timeout_ms = timeouts["timeout_ns"].drop_nulls()
        ran_ms = timeouts["ran_ns"].drop_nulls()
        ratio = (ran_ms.max() / timeout_ms.max()) if ran_ms.len() and timeout_ms.len() else None
        culprits = sorted(set(desync["lagging_rank"].drop_nulls().to_list()) | set(never["rank"].drop_nulls().to_list()))
        # ranks of the world communicator that reported nothing while the others timed out
        silent: list[int] = []
        if j.nranks and reporters and not culprits:
            silent = sorted(set(range(j.nranks)) - set(reporters))
            if not silent or len(silent) > cfg.max_silent_fraction * j.nranks:
                silent = []
            culprits = silent
        text = (f"{len(reporters)} rank(s) ({', '.join(map(str, reporters[:16]))}) report a timed-out collective "
                f"({', '.join(ops) or 'op not printed'}; SeqNum {', '.join(map(str, seqs[:6]))})")
        if timeout_ms.len():
            text += f" after Timeout(ms)={int(timeout_ms.max()) // 1_000_000}"
        if ratio is not None and ratio >= cfg.late_detection_ratio:
            text += (f"; it ran {int(ran_ms.max()) // 1_000_000} ms = {ratio:.1f}x the timeout, i.e. the job hung "
                     f"about {ran_ms.max() / 3.6e12:.1f} h before the watchdog acted")
        if never.height:
            text += (f"; rank(s) {', '.join(map(str, sorted(set(never['rank'].drop_nulls().to_list()))))} never issued it "
                     "(last enqueued < SeqNum)")
        if stuck.height:
            text += (f"; rank(s) {', '.join(map(str, sorted(set(stuck['rank'].drop_nulls().to_list()))))} issued it and "
                     "are stuck inside (enqueued >= SeqNum > completed)")
        if silent:
            text += (f"; rank(s) {', '.join(map(str, silent))} of the {j.nranks}-rank communicator reported no "
                     "timeout: they never reached the collective (or their logs are missing)")
        if ras_ok.height and not ras.height:
            text += "; NCCL RAS reported every communicator OK at the time, which does not rule out a hang"
        named = j.ident.filter(pl.col("rank").is_in(culprits or reporters))
        c_hosts = tuple(sorted(set(named["host"].drop_nulls().to_list())))
        c_gpus = tuple(sorted(set(named["bus_id"].drop_nulls().to_list())))
        out.append(Finding(
            "nccl_timeout", Severity.CRITICAL, "NCCL collective timed out", text + ".",
            "Find the rank that did not arrive (desync report, flight recorder dump, the rank with the lowest "
            "last-enqueued work); check its host for GPU/NIC errors; enable TORCH_NCCL_TRACE_BUFFER_SIZE and "
            "TORCH_NCCL_DESYNC_DEBUG=1.",
            ranks=tuple(culprits or reporters), hosts=c_hosts, gpus=c_gpus,
            key="timeout:" + ",".join(map(str, seqs[:4])),
            confidence="high" if (culprits and not silent) else "medium",
            metrics={"reporting_ranks": len(reporters), "culprit_ranks": ",".join(map(str, culprits)) or None,
                     "timeout_ms": int(timeout_ms.max()) // 1_000_000 if timeout_ms.len() else None,
                     "ran_over_timeout": round(ratio, 2) if ratio is not None else None,
                     "seq": seqs[0] if seqs else None},
            evidence=evidence(pl.concat([timeouts, status], how="vertical"),
                              ("rank", "kind", "pg", "seq", "op_type", "numel_in", "last_enqueued", "last_completed", "line")),
        ))
        # desync: one SeqNum, different collectives or sizes on different ranks
        split = per_seq.filter((pl.col("op_type").list.len() > 1) | (pl.col("numel_in").list.len() > 1))
        if split.height or desync.height:
            rows = timeouts.join(split.select("seq"), on="seq") if split.height else timeouts.head(0)
            groups = rows.group_by("seq", "op_type", "numel_in").agg(pl.col("rank").unique().sort())
            minority: list[int] = []
            for (_seq,), g in groups.group_by("seq"):
                g = g.with_columns(pl.col("rank").list.len().alias("n")).sort("n")
                if g.height > 1 and g["n"][0] < g["n"][-1]:
                    minority += g["rank"][0].to_list()
            names = sorted(set(desync["lagging_rank"].drop_nulls().to_list())) or sorted(minority)
            desc = "; ".join(f"SeqNum {r['seq']}: rank(s) {', '.join(map(str, r['rank']))} in {r['op_type']} "
                             f"(NumelIn {r['numel_in']})" for r in groups.sort("seq", "op_type").iter_rows(named=True))
            out.append(Finding(
                "nccl_timeout", Severity.CRITICAL, "Ranks desynchronised: different collectives at the same SeqNum",
                (desc or "a desync report names the rank that did not join") + ". The ranks issued different "
                "collectives (code-path divergence), so they wait on each other forever; this is not a network fault.",
                "Find the branch that makes some ranks issue a different collective (conditional logging/eval, uneven "
                "data, an exception caught on one rank) and make every rank issue the same sequence.",
                ranks=tuple(names or sorted(set(rows["rank"].drop_nulls().to_list()))), key="desync",
                confidence="high" if names else "medium",
                evidence=evidence(groups.with_columns(pl.col("rank").cast(pl.List(pl.String)).list.join(",")),
                                  ("seq", "op_type", "numel_in", "rank")) + evidence(desync, ("rank", "lagging_rank", "seq", "line")),
            ))

    if ras.height:
        nodes = sorted(set(ras["peer"].drop_nulls().to_list()))
        ranks = tuple(sorted(set(ras["rank"].drop_nulls().to_list())))
        errors = sorted(set(m.split(":")[0] for m in ras.filter(pl.col("kind") == "ras_missing")["message"].to_list()))
        groups = ras.filter(pl.col("kind") == "ras_group")["message"].to_list()
        out.append(Finding(
            "nccl_timeout", Severity.CRITICAL, "NCCL RAS reports missing or inconsistent ranks",
            f"RAS: {'; '.join(groups) or 'errors'}"
            + (f"; {', '.join(errors)} on node(s) {', '.join(nodes)}" if nodes else "")
            + ". A rank that stops reporting is dead, hung before the collective, or unreachable.",
            "Inspect the named process/GPU on that node (is it alive? stuck in host code? GPU errors?); an outlier "
            "node with a different process count points at a launcher/config mistake.",
            ranks=ranks, hosts=tuple(nodes), key="ras", confidence="high",
            metrics={"ras_error_lines": ras.height},
            evidence=evidence(ras, ("line", "kind", "peer", "code", "message")),
        ))

    if cuda.height:
        ranks, hosts, gpus = where(cuda, j.ident)
        out.append(Finding(
            "nccl_timeout", Severity.CRITICAL, "A CUDA error aborted NCCL",
            f"NCCL hit `{cuda['message'][0]}` on {', '.join(hosts) or 'a rank'}: the communicator is dead and peers "
            "see resets or timeouts as a consequence.",
            "Debug the CUDA fault on that GPU first (compute-sanitizer, CUDA_LAUNCH_BLOCKING=1, dmesg Xid); "
            "network errors on other ranks are secondary.",
            ranks=ranks, hosts=hosts, gpus=gpus, key="cuda_failure", confidence="high",
            evidence=evidence(cuda, ("host", "pid", "cuda_dev", "line", "file_line", "message")),
        ))
    return out
