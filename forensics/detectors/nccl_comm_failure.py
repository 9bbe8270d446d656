"""NCCL communication failures: the immediate errors that end a job within seconds (not a watchdog timeout).

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity, When
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.facts.context import JobContext
from forensics.facts.job_year import job_year, placed
from forensics.facts.nccl_setup import evidence, where

IB_STATUS = {
    4: "local protection error (IBV_WC_LOC_PROT_ERR): memory registration / GDR problem",
    5: "work request flushed (IBV_WC_WR_FLUSH_ERR): the QP was already in error",
    9: "remote invalid request (IBV_WC_REM_INV_REQ_ERR)",
    10: "remote access error (IBV_WC_REM_ACCESS_ERR)",
    12: "transport retry counter exceeded (IBV_WC_RETRY_EXC_ERR): link, route or GID problem",
    13: "RNR retry counter exceeded (IBV_WC_RNR_RETRY_EXC_ERR): the peer is not posting receives",
}
NCCL_RESULT = {2: "ncclSystemError", 3: "ncclInternalError", 6: "ncclRemoteError", 1: "ncclUnhandledCudaError"}
#: failure kinds of nccl_events -> (class, whether it is usually a consequence of an earlier error)
KINDS: dict[str, tuple[str, bool]] = {
    "ib_async": ("NIC hardware error (IB async event)", False),
    "ib_completion": ("network error (IB work completion)", False),
    "ofi_error": ("network error (AWS OFI / EFA provider)", False),
    "socket_closed": ("remote peer closed the connection", False),
    "net_recv_failed": ("remote peer reset the connection", False),
    "connect_failed": ("could not connect to the peer", False),
    "remote_error": ("remote process exited or network error (ncclRemoteError)", False),
    "proxy_error": ("proxy connect/accept failed", False),
    "call_failed": ("verbs call failed", True),
    "nccl_tests_failure": ("nccl-tests stopped on an NCCL error", True),
}
#: failure kinds whose peer is the far end of one of the reporting host's network connections
_NET_PEER_KINDS = frozenset({"socket_closed", "net_recv_failed", "connect_failed", "ib_completion", "ofi_error",
                             "proxy_error"})
_TEXT_CLASS = (
    (r"remote process exited|network error", "remote process exited or network error (ncclRemoteError)"),
    (r"system error", "system error (ncclSystemError)"),
    (r"internal error", "internal error (ncclInternalError)"),
    (r"cuda error", "CUDA error (ncclUnhandledCudaError)"),
)


@dataclass(frozen=True)
class NcclCommFailureConfig:
    """What counts as one failure."""

    max_evidence: int = setting(12, unit="rows", low=1, doc="error lines kept as evidence, first in time first")


def _failures(ctx: JobContext) -> pl.DataFrame:
    """Every immediate-error line of the job with its class, whether it is a consequence and a sort key."""
    ev = placed(ctx.frames["nccl_events"], job_year(ctx.frames)).filter(pl.col("kind").is_in(list(KINDS)))
    ev = ev.with_columns(
        pl.col("kind").replace_strict({k: v[0] for k, v in KINDS.items()}, default=None).alias("error_class"),
        pl.col("kind").replace_strict({k: v[1] for k, v in KINDS.items()}, default=False).alias("consequence"))
    ev = ev.with_columns(_text_class(pl.col("error_class")), _status_consequence())
    pt = ctx.frames["collective_timeouts"].filter(pl.col("kind") == "nccl_error") \
        if ctx.frames.has("collective_timeouts") else pl.DataFrame()
    if pt.height:
        pt = pt.select("source", "host", "rank", "line", "message", pl.lit("nccl_error").alias("kind"),
                       pl.lit(True).alias("consequence"))
        pt = pt.with_columns(_text_class(pl.lit("NCCL error raised to PyTorch")))
        ev = pl.concat([ev, pt], how="diagonal_relaxed")
    # a CUDA error reported through NCCL (`unhandled cuda error`) is the GPU's, not the connection's (nccl_timeout)
    ev = ev.filter(~pl.col("error_class").str.starts_with("CUDA error").fill_null(False))
    if "time_ns" not in ev.columns:
        ev = ev.with_columns(pl.lit(None, pl.Int64).alias("time_ns"))
    return ev.sort(pl.col("time_ns"), "consequence", "source", "line", nulls_last=True, maintain_order=True)


def _text_class(default: pl.Expr) -> pl.Expr:
    """The class a remote_error / nccl-tests / PyTorch line's own text names (ncclRemoteError, ...)."""
    text = pl.col("message").str.to_lowercase()
    textual = pl.col("kind").is_in(["remote_error", "nccl_tests_failure", "nccl_error"])
    named = [pl.when(textual & text.str.contains(rx)).then(pl.lit(cls)) for rx, cls in _TEXT_CLASS]
    return pl.coalesce(*named, default).alias("error_class")


def _status_consequence() -> pl.Expr:
    """A flushed work request (status 5) follows an error already on that queue pair."""
    return (pl.col("consequence") | ((pl.col("kind") == "ib_completion") & (pl.col("code") == 5))).alias("consequence")


def _return_codes(ctx: JobContext) -> list[str]:
    """The ncclResult_t names of the error trail (`file.cc:123 -> 6`)."""
    tr = ctx.frames["nccl_events"].filter((pl.col("kind") == "error_trace") & pl.col("code").is_not_null())
    return [NCCL_RESULT.get(c, f"ncclResult {c}") for c in sorted(set(tr["code"].to_list())) if c]


def _peer_place(ctx: JobContext, peer: str | None, hosts: list[str]) -> str | None:
    """The host an address or host name of a peer belongs to, when the logs print it."""
    if not peer:
        return None
    bare = re.sub(r"<\d+>$", "", peer).split("%")[0]
    for h in hosts:
        if bare == h or bare.split(".")[0] == h:
            return h
    net = ctx.frames["nccl_net"].filter(pl.col("host").is_not_null())
    # interface addresses (bootstrap, sockets) and the IB list's OOB interface (`; OOB eth0:10.0.0.1<0>`)
    addrs = pl.concat([
        net.select("host", "address"),
        net.filter(pl.col("kind") == "ib").select("host", pl.col("detail").str.split_exact(":", 1)
                                                  .struct.field("field_1").alias("address")),
    ]).drop_nulls().with_columns(pl.col("address").str.replace(r"<\d+>$", "")).unique()
    hit = addrs.filter(pl.col("address") == bare)["host"]
    return str(hit[0]) if hit.len() else None


def _net_reach(ctx: JobContext, ident: pl.DataFrame, host: str | None) -> str | None:
    """The one other host every NET connection of ``host`` leads to (its remote side: the sender of a `[receive]`
    line, the receiver of a `[send]` line, placed by the job's rank -> host identities), or None when they lead to
    several hosts, to a rank no identity places, or nowhere. A network peer of that host can only be that host."""
    ch = ctx.frames["nccl_channels"].filter((pl.col("transport") == "NET") & pl.col("host").eq_missing(host))
    if host is None or not ch.height:
        return None
    remote = ch.select(pl.when(pl.col("direction") == "receive").then(pl.col("src_rank"))
                       .otherwise(pl.col("dst_rank")).cast(pl.Int32()).alias("rank")).unique()
    placed_on = ident.filter(pl.col("rank").is_not_null()).select(pl.col("rank").cast(pl.Int32()), "host").unique()
    hosts = remote.join(placed_on, on="rank", how="left")["host"]
    reach = set(hosts.to_list())
    return str(next(iter(reach))) if len(reach) == 1 and None not in reach and host not in reach else None


def _comm(ctx: JobContext, first: dict) -> tuple[str | None, int | None]:
    """The failing process's communicator (commId, else pointer) and its size."""
    key = (first.get("host"), first.get("pid"), first.get("cuda_dev"))
    comms = ctx.frames["nccl_comms"].filter(
        (pl.col("origin") == "init") & pl.col("host").eq_missing(key[0]) & pl.col("pid").eq_missing(key[1])
        & pl.col("cuda_dev").eq_missing(key[2]) & (pl.col("line") <= (first.get("line") or 0)))
    if not comms.height:
        return None, None
    last = comms.row(-1, named=True)
    return str(last["comm_id"] or last["comm"]), last["nranks"]


def _operation(ctx: JobContext, first: dict) -> str | None:
    """What the line or the error trail names (Connect, Send/Recv, ...), else the process's last collective."""
    msg = str(first.get("message") or "")
    m = re.search(r"operation[= ](\w+)", msg) or re.search(r"\((Send|Recv|Read|Write)\)", msg)
    if m:
        return m.group(1)
    calls = ctx.frames["nccl_calls"].filter(
        (pl.col("kind") == "coll") & pl.col("host").eq_missing(first.get("host"))
        & pl.col("pid").eq_missing(first.get("pid")) & (pl.col("line") <= (first.get("line") or 0)))
    if calls.height:
        return str(calls["op"][-1])
    if "proxy" in msg.lower() or "accept" in msg.lower():
        return "connection setup"
    return None


COMM_FAILURE = FindingKind(
    "comm_failure", "NCCL failed at once on a connection (closed or reset by the peer, remote/system/internal "
    "error, IB or OFI provider error): not a watchdog timeout", Role.FAULT,
    "Look at the first error and the peer it names: a peer that exited points to its own failure.", stage=2)
DOC = DetectorDoc(
    summary=(
        "NCCL communication failures: the immediate errors that end a job within seconds (not a watchdog timeout)."
    ),
    detects=(
        "NCCL's own errors on a connection, as NCCL and PyTorch's C++ layer log them: a peer that closed or "
        "reset the connection (`Connection closed by remote peer`, `Call to recv from / send to ... failed : "
        "Connection reset by peer` in the `Net : ` (<= 2.18) and `socketProgressOpt: ` (2.19+) wordings, also "
        "as PyTorch prints NCCL's last error without its envelope), a connect to a peer that failed (`Net : "
        "Connect to` / `socketStartConnect: Connect to`), `remote process exited or there was a network error` "
        "(ncclRemoteError), proxy "
        "connect/accept failures (res 2 = ncclSystemError, 3 = ncclInternalError), AWS OFI / EFA provider "
        "errors (`Request ... completed with error. RC: 103. Error: 4126 (Unresponsive receiver ...)`, an "
        "address vector or endpoint that cannot be set up), InfiniBand completion errors (status 12 retry "
        "exceeded, 4 local protection, ...), HCA async events (`local catastrophic error`) and failed verbs "
        "calls, nccl-tests stopping on an NCCL error, and PyTorch's `NCCL error in: ... ProcessGroupNCCL.cpp` "
        "lines (2.4+: `Process group watchdog thread terminated with exception: NCCL error: ...`). "
        "One finding per job, anchored on the first error in time across ranks (the earliest time any line "
        "carries, else the first line of the first file)."
    ),
    matters=(
        "These are not hangs: NCCL returned an error and the job died. The first error names where to look "
        "(the reporting rank, the peer it could not reach, the communicator and the operation); the errors "
        "after it on other ranks are mostly consequences. A peer that closed the connection usually died of "
        "something else (a GPU fault, an OOM kill, a scheduler kill), which the incident puts first."
    ),
    measures=(
        "``nccl_events`` rows of the failure kinds (with ``time_ns`` where the line carries a wall-clock "
        "time), ``error_trace`` return codes (6 ncclRemoteError, 2 ncclSystemError, 3 ncclInternalError) and "
        "``collective_timeouts`` rows of kind ``nccl_error``. The peer comes from the line (address, host, "
        "EFA address or instance id) and is placed on a host when an address or host name of the logs matches "
        "it, or, for a network error whose address the logs do not print, when every NET connection of the "
        "reporting host leads to ranks of one other host (its channel lines, placed by the rank identities). "
        "The communicator is the failing process's (``nccl_comms``); the operation is what the line or "
        "the error trail names (Connect, Send/Recv, communicator init) or the last collective the process "
        "logged."
    ),
    todo=(
        "Look at the first error and at the peer it names before blaming the network: a peer that exited "
        "points to that rank's own failure (the incident's root); an unresponsive EFA receiver with a "
        "reachable address points to security-group rules (inbound and outbound, self-referencing); IB status "
        "12 on one host to its cable, switch port or GID; status 4 to memory registration (nvidia-peermem / "
        "DMA-BUF); a catastrophic HCA error to draining the host."
    ),
)


@dataclass(frozen=True)
class _Failure:
    """What one job's communication failure measured: every error line, the first (primary) one and what it names."""

    fails: pl.DataFrame  # every error line, first in time first
    first: dict[str, Any]  # the first error (the first primary one when there is one)
    primary: bool  # the first error is not itself a consequence of an earlier one
    codes: list[str]  # ncclResult_t names of the error trail
    peer: str | None
    peer_host: str | None
    peer_how: str | None  # how the peer was placed on peer_host: "address" (the logs print it) or "net" (_net_reach)
    comm: str | None  # the failing process's communicator (commId, else pointer)
    comm_ranks: int | None
    op: str | None
    where: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]  # ranks, hosts, GPUs of every error line
    reporter: tuple[int | None, str | None]  # the first error's rank and host

    @property
    def error_class(self) -> str:
        cls = str(self.first["error_class"])
        if self.first["kind"] == "ib_completion" and self.first.get("code") is not None:
            cls += f": status {self.first['code']} = {IB_STATUS.get(int(self.first['code']), 'see ibv_wc_status')}"
        return cls


def _measure(ctx: JobContext, fails: pl.DataFrame) -> _Failure:
    j = ctx.nccl
    primary = fails.filter(~pl.col("consequence"))
    first = (primary if primary.height else fails).row(0, named=True)
    peer = first.get("peer")
    comm, size = _comm(ctx, first)
    f_where = where(pl.DataFrame([first]).select([c for c in ("host", "pid", "cuda_dev", "rank") if c in first]),
                    j.ident)
    every = where(fails, j.ident)
    peer_host, how = _peer_place(ctx, peer, j.hosts), "address"
    if peer_host is None and peer and first["kind"] in _NET_PEER_KINDS:
        peer_host, how = _net_reach(ctx, j.ident, first.get("host")), "net"
    return _Failure(fails, first, bool(primary.height), _return_codes(ctx), peer, peer_host,
                    how if peer_host else None, comm, size, _operation(ctx, first), every,
                    _reporter(f_where, every, j.ident))


def _reporter(first: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]],
              every: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]],
              ident: pl.DataFrame) -> tuple[int | None, str | None]:
    """The first error's rank and host. NCCL's last error is printed bare under PyTorch's rank-prefixed exception
    (`[rank5]:... NCCL error` / `Last error:` / `socketProgressOpt: ...`): when the line names no process, the one
    rank (and host) of all the failure's lines is its reporter; with several, it stays unknown."""
    rank = first[0][0] if first[0] else (every[0][0] if len(every[0]) == 1 else None)
    host = first[1][0] if first[1] else (every[1][0] if len(every[1]) == 1 else None)
    if host is None and rank is not None and not first[0]:
        hosts = ident.filter(pl.col("rank") == rank)["host"].drop_nulls().unique()
        host = str(hosts[0]) if hosts.len() == 1 else None
    return rank, host


def _summary(m: _Failure) -> str:
    """The measured failure in words."""
    rank, host = m.reporter
    who = f"rank {rank}" if rank is not None else "a process"
    comm = f"{m.comm} ({m.comm_ranks} ranks)" if m.comm else None
    said = [f"First error: {who}{f' on {host}' if host else ''}, {m.error_class}",
            f"peer {m.peer}" + _peer_words(m) if m.peer else "",
            f"communicator {comm}" if comm else "", f"operation {m.op}" if m.op else "",
            f"NCCL returned {', '.join(m.codes)}" if m.codes else "",
            f"{m.fails.height} error line(s)" + _on_hosts(m)]
    return "; ".join(p for p in said if p) + (". NCCL failed at once (not a watchdog timeout); later errors on other "
                                              "ranks are mostly its consequences.")


def _on_hosts(m: _Failure) -> str:
    hosts = set(m.where[1]) | ({m.reporter[1]} if m.reporter[1] else set())
    return f" on {len(hosts)} host(s)" if hosts else ""


def _peer_words(m: _Failure) -> str:
    if m.peer_how == "net":
        return (f" (host {m.peer_host}: the logs do not print that address, but every network connection of "
                f"{m.reporter[1]} leads to {m.peer_host})")
    return f" (host {m.peer_host})" if m.peer_host else ""


def _finding(m: _Failure, cfg: NcclCommFailureConfig) -> Finding:
    first, (ranks, hosts, gpus) = m.first, m.where
    rank, host = m.reporter
    return Finding(
        "nccl_comm_failure", Severity.CRITICAL,
        f"NCCL communication failure: {str(first['error_class']).split(' (')[0]}", _summary(m),
        _advice(str(first["kind"]), first.get("code"), str(first.get("message") or "")),
        ranks=ranks, hosts=tuple(sorted(set(hosts) | {h for h in (host, m.peer_host) if h})), gpus=gpus,
        key="comm_failure", kind=COMM_FAILURE.name, when=_when(first.get("time_ns")), process_group=m.comm,
        confidence="high" if m.primary else "medium",
        metrics={"events": m.fails.height, "error_class": str(first["error_class"]), "first_kind": str(first["kind"]),
                 "reporting_rank": rank, "reporting_host": host, "peer": m.peer, "peer_host": m.peer_host,
                 **({"peer_placed_by": m.peer_how} if m.peer_how == "net" else {}),
                 "communicator": f"{m.comm} ({m.comm_ranks} ranks)" if m.comm else None, "operation": m.op,
                 "nccl_result": ",".join(m.codes) or None, "time_ns": first.get("time_ns")},
        evidence=evidence(m.fails, ("host", "pid", "cuda_dev", "rank", "line", "time_ns", "kind", "code", "peer",
                                    "message"), cfg.max_evidence),
    )


@detector("nccl_comm_failure", doc=DOC, settings=NcclCommFailureConfig,
          requires_any=("nccl_events", "collective_timeouts"),
          kinds=(COMM_FAILURE,), view="hw-events")
def detect(ctx: JobContext, cfg: NcclCommFailureConfig) -> list[Finding]:
    fails = _failures(ctx)
    if fails.height == 0:
        raise Skip("no NCCL communication error in the logs (remote/system/internal errors, closed connections, "
                   "IB or OFI provider errors)")
    return [_finding(_measure(ctx, fails), cfg)]


def _when(t: object) -> When:
    if isinstance(t, int):
        return When.span(t, t, "the first error line's wall-clock stamp (read as UTC when it names no zone)")
    return When.unknown("the NCCL error lines carry no wall-clock stamp")


def _advice(kind: str, code: object, msg: str) -> str:
    if kind == "ofi_error" and "Unresponsive receiver" in msg:
        return ("The peer's EFA device answered but the handshake failed: check that the security group has "
                "self-referencing inbound AND outbound rules for all traffic, that the peer process is alive, and "
                "the peer's own log for an earlier error.")
    if kind == "ofi_error":
        return "Check the EFA setup (security group rules, fi_info -p efa, the aws-ofi-nccl and libfabric versions)."
    if kind == "ib_completion" and code == 12:
        return ("Check the cable, switch port, routing and GID (NCCL_IB_GID_INDEX) of the first host; drain it if it "
                "repeats.")
    if kind == "ib_completion" and code == 4:
        return "Memory registration failed: check nvidia-peermem / DMA-BUF, NCCL_NET_GDR_LEVEL and ulimit -l."
    if kind == "ib_async":
        return "Drain the host, check the HCA firmware/driver and dmesg for mlx5 errors, and the port state."
    return ("Look for the first failure on the peer (CUDA fault, OOM kill, killed or crashed process) before "
            "blaming the network; then check that every rank can reach the others on the chosen interface.")
