"""Slow network links, localised by intersection: the host (and NIC) common to every slow communicator.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._step_metrics import gpu_seconds, in_profile, ms
from forensics.facts.context import JobContext


@dataclass(frozen=True)
class SlowLinkConfig:
    """When a communicator is slow, when its common host is named, and the severity of the finding."""

    slow_ratio: float = setting(1.3, unit="ratio", low=1.0,
                                doc="a communicator is slow when its transfers take this many times the lower "
                                    "quartile of comparable communicators")
    min_excess_us: float = setting(20.0, unit="us", low=0.0,
                                   doc="and at least this much longer per call (latency-bound jitter is no slow link)")
    max_normal_share: float = setting(0.2, unit="fraction of communicators", low=0.0, high=1.0,
                                      doc="the suspect may be in at most this share of normal communicators "
                                          "(of those through it)")
    critical_impact: float = setting(0.15, unit="fraction of step", low=0.0, high=1.0,
                                     doc="extra transfer time per step above which a localised slow link is critical")


#: evidence rows: one per slow communicator, up to this many (the count is in the metrics)
GROUPS_CAP = 32

_REMEDY = ("Test this node's network: ibstat / port counters (symbol errors, link downs, speed and width), the "
           "NIC's PCIe link (lspci -vv), cables and transceivers, NIC firmware; run nccl-tests between it and a "
           "healthy node, and drain it if its bandwidth stays low.")
_REMEDY_UNLOCALISED = ("The slow communicators share no host: compare their placement (switch, rack, rail) for a "
                       "shared link, and run nccl-tests between the hosts of each slow communicator.")


def _members(ctx: JobContext) -> pl.DataFrame:
    """pg_key, rank, host: the ranks with data in each communicator."""
    k = ctx.match.kernels
    return k.filter(pl.col("matched") | pl.col("is_p2p")).select("pg_key", "rank", "host").unique().drop_nulls()


def _per_op(ctx: JobContext, members: pl.DataFrame) -> pl.DataFrame:
    """Per communicator and (collective, size): median transfer, its comparables' lower quartile (``ref``)
    and how many calls; communicators on one host and classes with fewer than two members are dropped."""
    inst = ctx.match.instances
    k = ctx.match.kernels
    # Pipeline send/recv are not matched; the shortest one of a (group, size) is the bare transfer.
    p2p = (
        k.filter(pl.col("is_p2p"))
        .group_by("pg_key", "pg_type", "bytes")
        .agg(pl.lit("p2p").alias("collective"), pl.col("transfer_ns").min(), pl.len().alias("calls"))
    )
    coll = inst.group_by("pg_key", "pg_type", "collective", "bytes").agg(
        pl.col("transfer_ns").median(), pl.len().alias("calls")
    )
    cols = ["pg_key", "pg_type", "collective", "bytes", "transfer_ns", "calls"]
    rows = pl.concat([coll.select(cols), p2p.select(cols)], how="vertical_relaxed")
    shape = members.group_by("pg_key").agg(pl.col("rank").n_unique().alias("n_ranks"),
                                            pl.col("host").n_unique().alias("n_hosts"))
    cls = ["pg_type", "collective", "bytes", "n_ranks", "n_hosts"]
    rows = rows.join(shape, on="pg_key").filter((pl.col("n_hosts") >= 2) & pl.col("transfer_ns").is_not_null())
    return rows.with_columns(
        # Lower quartile: a slow host may sit in half of the comparable communicators.
        pl.col("transfer_ns").quantile(0.25, "lower").over(cls).alias("ref"),
        pl.col("pg_key").n_unique().over(cls).alias("n_comparable"),
    ).filter(pl.col("n_comparable") >= 2)


def _judge(per_op: pl.DataFrame, cfg: SlowLinkConfig) -> pl.DataFrame:
    """Per communicator: transfers summed over its (collective, size) rows against their references."""
    g = per_op.group_by("pg_key", "pg_type").agg(
        pl.col("collective").unique().sort().str.join(",").alias("collectives"),
        pl.col("n_ranks").first(),
        pl.col("transfer_ns").sum().alias("tx"),
        pl.col("ref").sum(),
        ((pl.col("transfer_ns") - pl.col("ref")) * pl.col("calls")).sum().alias("_excess_total"),
        pl.col("calls").sum(),
    )
    return g.with_columns(
        (pl.col("tx") / pl.col("ref")).alias("ratio"),
        (pl.col("_excess_total") / pl.col("calls")).alias("excess_ns"),
    ).with_columns(
        ((pl.col("ratio") >= cfg.slow_ratio) & (pl.col("excess_ns") >= cfg.min_excess_us * 1e3)).alias("slow")
    ).drop("_excess_total").sort("pg_key")


def rank_nics(ctx: JobContext) -> pl.DataFrame:
    """rank, host, nic: the network devices each rank's NCCL connections use (``mlx5_3:1``; the device
    index when the log lists no name), from the ``via NET/<net>/<i>`` lines and the process's device list."""
    ch = ctx.frames["nccl_channels"].filter((pl.col("transport") == "NET") & pl.col("nic").is_not_null())
    if ch.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32(), "host": pl.String(), "nic": pl.String()})
    ident = ctx.identity.select("host", "pid", "cuda_dev",
                                pl.col("rank").alias("_irank")).unique(["host", "pid", "cuda_dev"])
    ch = ch.join(ident, on=["host", "pid", "cuda_dev"],
                 how="left").with_columns(pl.coalesce("rank", "_irank").alias("rank"))
    net = ctx.frames["nccl_net"].filter(pl.col("kind").is_in(["ib", "socket"]) & pl.col("index").is_not_null())
    names = net.select("host", "pid", pl.col("index").alias("nic"),
                       pl.when(pl.col("port").is_not_null())
                       .then(pl.concat_str([pl.col("name"), pl.col("port").cast(pl.String)], separator=":"))
                       .otherwise(pl.col("name")).alias("_name")).unique(["host", "pid", "nic"])
    by_host = names.group_by("host", "nic").agg(pl.col("_name").first().alias("_hname"))
    out = ch.select("rank", "host", "pid", "nic").unique().join(names, on=["host", "pid", "nic"], how="left")
    out = out.join(by_host, on=["host", "nic"], how="left")
    nic = pl.coalesce("_name", "_hname", pl.concat_str([pl.lit("NIC "), pl.col("nic").cast(pl.String)]))
    return out.select(pl.col("rank").cast(pl.Int32), "host", nic.alias("nic")).drop_nulls().unique().sort("rank", "nic")


@dataclass(frozen=True)
class _Suspect:
    host: str
    ranks: tuple[int, ...]
    rank_level: bool  # the slow communicators share these ranks (one rail), not only the host
    nics: tuple[str, ...]
    normal_through: int


def _localise(judged: pl.DataFrame, members: pl.DataFrame, nics: pl.DataFrame,
              cfg: SlowLinkConfig) -> _Suspect | None:
    """The one host in every slow communicator (and the ranks on it they all share), when the communicators
    through it are consistently slow; None when there is no single common host."""
    mem = members.filter(pl.col("pg_key").is_in(judged["pg_key"].implode()))
    slow_keys = judged.filter(pl.col("slow"))["pg_key"].to_list()
    groups = {key: set(df["rank"].to_list()) for (key,), df in mem.partition_by("pg_key", as_dict=True).items()}
    host_of = dict(mem.select("rank", "host").unique("rank").iter_rows())
    common = set.intersection(*({host_of[r] for r in groups[key]} for key in slow_keys))
    if len(common) != 1:
        return None
    (h,) = common
    on_h = [{r for r in groups[key] if host_of[r] == h} for key in slow_keys]
    shared = set.intersection(*on_h)
    unit = shared or set.union(*on_h)

    def through(key: str) -> bool:
        return bool(groups[key] & shared) if shared else any(host_of[r] == h for r in groups[key])

    normal = [key for key in judged.filter(~pl.col("slow"))["pg_key"].to_list() if through(key)]
    if len(normal) > cfg.max_normal_share * (len(normal) + len(slow_keys)):
        return None
    nic_of: dict[int, set[str]] = {}
    for r, nic in nics.filter(pl.col("host") == h).select("rank", "nic").iter_rows():
        nic_of.setdefault(int(r), set()).add(str(nic))
    # A NIC is named when every slow communicator's ranks on this host use it.
    per_group = [set().union(*(nic_of.get(r, set()) for r in ranks)) for ranks in (on_h if not shared else [shared])]
    nic_set = set.intersection(*per_group) if per_group else set()
    return _Suspect(h, tuple(sorted(unit)), bool(shared), tuple(sorted(nic_set)), len(normal))


def _impact(ctx: JobContext, per_op: pl.DataFrame, slow_keys: list[str]) -> tuple[float, float, int]:
    """Extra transfer of the slow communicators' matched collectives over their reference:
    (GPU-ns over all members, wall-ns per step, steps)."""
    ref = per_op.filter(pl.col("pg_key").is_in(slow_keys)).select("pg_key", "collective", "bytes", "ref")
    extra = ctx.match.instances.join(ref, on=["pg_key", "collective", "bytes"]).with_columns(
        (pl.col("transfer_ns") - pl.col("ref")).clip(lower_bound=0).alias("extra")
    )
    n_steps = max(1, ctx.match.kernels["step"].drop_nulls().n_unique())
    if extra.height == 0:
        return 0.0, 0.0, n_steps
    gpu = float((extra["extra"] * extra["n_ranks"]).sum())
    # Collectives of one rank run one after the other, but those of different groups overlap: the step
    # is at least as late as its largest extra.
    wall = float(extra.group_by("step").agg(pl.col("extra").max())["extra"].sum()) / n_steps
    return gpu, wall, n_steps


def _evidence(slow: pl.DataFrame, members: pl.DataFrame) -> tuple[dict, ...]:
    hosts = members.group_by("pg_key").agg(pl.col("host").unique().sort().str.join(",").alias("hosts"))
    rows = slow.join(hosts, on="pg_key", how="left").sort("ratio", "pg_key", descending=[True, False])
    return tuple(
        {"pg": r["pg_key"], "pg_type": r["pg_type"], "collectives": r["collectives"], "ranks": r["n_ranks"],
         "hosts": r["hosts"], "transfer_ms": ms(r["tx"]), "reference_ms": ms(r["ref"]),
         "ratio": round(float(r["ratio"]), 3)}
        for r in rows.head(GROUPS_CAP).iter_rows(named=True)
    )


def _step_ns(ctx: JobContext) -> float:
    steps = ctx.steps
    med = steps["step_ns"].median() if steps.height else None
    return float(med) if med is not None else 0.0  # type: ignore[arg-type]


SLOW_LINK = FindingKind(
    "slow_transfers", "communicators whose transfers run far below their peers' bandwidth, localised to a link, "
    "host or NIC where the evidence allows", Role.SLOWDOWN,
    "Inspect the link, NIC or host common to the slow communicators (cables, NIC errors, PCIe width).")


DOC = DetectorDoc(
    summary=(
        "Slow network links, localised by intersection: the host (and NIC) common to every slow communicator."
    ),
    detects=(
        "A NIC, cable or switch port that moves data slower than its peers. Every communicator (process "
        "group) whose traffic goes through it is slow, and the others of the same shape are not: the host "
        "(with its ranks and, when the NCCL init lines give it, its NIC such as ``mlx5_3:1``) common to all "
        "slow communicators is named in one finding, with each slow communicator as evidence. Hosts that are "
        "only in some of the slow communicators are their innocent partners and are not named."
    ),
    matters=(
        "One slow NIC slows every collective that crosses it, so every rank of every group through that node "
        "waits; the job runs at the pace of its slowest link. The symptom (slow collectives everywhere) "
        "points at no one; the intersection of the slow groups does."
    ),
    measures=(
        "Per communicator (the trace's process group) and per (collective, message size): the median transfer"
        " time of its matched instances (:mod:`forensics.facts.collectives`: the duration of the last member "
        "to arrive, so waiting for late ranks is not counted), and for pipeline groups the bare send/recv "
        "transfer (their shortest kernel). Only communicators spanning two or more hosts are compared, each "
        "with the others of the same type, collective, size, member count and host count (at least two of "
        "them); the reference is their lower quartile. A communicator is slow when its transfers (summed over"
        " its collectives and sizes) take at least ``slow_ratio`` times the reference and at least "
        "``min_excess_us`` longer per call. The members of the slow ones are intersected: ranks -> hosts. "
        "When exactly one host is in every slow communicator it is the suspect; when the slow communicators "
        "also share ranks on it, those ranks (their GPUs' NIC rail) are the suspect, and their NICs are read "
        "from the NCCL logs (``via NET/IB/i`` connection lines, ``NET/IB : Using [i]mlx5_i:1`` device lists)."
        " The suspect is named only if at most ``max_normal_share`` of the communicators through it are "
        "normal (a slow link slows every group through it). Slow communicators without a single common host "
        "are reported at info, naming no host. Impact: the extra transfer time of the slow synchronizing "
        "collectives over the reference (per step the largest, as they run in sequence on each rank), times "
        "their members for the GPU time. A localised slow link is a warning, critical above "
        "``critical_impact`` of the step."
    ),
    todo=(
        "Test the named NIC / node: ``ibstat`` and port counters (symbol errors, link downs, speed and "
        "width), the NIC's PCIe link (``lspci -vv``), cables and transceivers, NIC firmware; run nccl-tests "
        "between it and a healthy node, and drain the node if its bandwidth stays low. Without a named host, "
        "compare the listed communicators' placement (switch, rack) for a shared link."
    ),
)


@detector("slow_link", doc=DOC, settings=SlowLinkConfig, requires=("kernels",), kinds=(SLOW_LINK,), view="collectives")
def detect(ctx: JobContext, cfg: SlowLinkConfig) -> list[Finding]:
    members = _members(ctx)
    if members.height == 0:
        raise Skip("no matched NCCL collectives or pipeline transfers in the traces")
    if members["host"].n_unique() < 2:
        raise Skip("all traced ranks are on one host: no network link to compare")
    per_op = _per_op(ctx, members)
    if per_op.height == 0:
        raise Skip("no two comparable communicators (same type, collective, size and shape) span several hosts")
    judged = _judge(per_op, cfg)
    slow = judged.filter(pl.col("slow"))
    if slow.height == 0:
        return []
    return in_profile(ctx, [_finding(_measure(ctx, judged, members, per_op, cfg), cfg)])


@dataclass(frozen=True)
class _SlowLinks:
    """The slow communicators against the normal ones, the suspect common to them (None when there is none)
    and what their extra transfer costs."""

    slow_groups: int
    normal_groups: int
    max_ratio: float  # the slowest communicator's transfer over its reference
    saving_ns: float  # extra transfer per step
    frac: float  # ... as a share of the median step
    gpu_ns: float  # extra transfer over all members
    evidence: tuple[dict, ...]
    suspect: _Suspect | None


def _measure(ctx: JobContext, judged: pl.DataFrame, members: pl.DataFrame, per_op: pl.DataFrame,
             cfg: SlowLinkConfig) -> _SlowLinks:
    """The judged communicators' slow ones, their common suspect and their extra transfer."""
    slow = judged.filter(pl.col("slow"))
    gpu_ns, wall, _ = _impact(ctx, per_op, slow["pg_key"].to_list())
    step = _step_ns(ctx)
    return _SlowLinks(
        slow_groups=slow.height, normal_groups=judged.height - slow.height,
        max_ratio=float(slow["ratio"].max()), saving_ns=wall, frac=wall / step if step else 0.0,  # type: ignore[arg-type]
        gpu_ns=gpu_ns, evidence=_evidence(slow, members), suspect=_localise(judged, members, rank_nics(ctx), cfg),
    )


def _finding(m: _SlowLinks, cfg: SlowLinkConfig) -> Finding:
    """The measured slow communicators in words, with their typed facts: localised to a host, or not."""
    metrics = {"slow_groups": m.slow_groups, "normal_groups": m.normal_groups,
               "max_transfer_ratio": round(m.max_ratio, 3), "saving_per_step_ms": ms(m.saving_ns)}
    common: dict[str, Any] = dict(kind=SLOW_LINK.name, evidence=m.evidence, gpu_seconds_lost=gpu_seconds(m.gpu_ns),
                                  fraction_of_step=round(m.frac, 4))
    s = m.suspect
    if s is None:
        title, summary = _unlocalised_words(m)
        return Finding("slow_link", Severity.INFO, title, summary, _REMEDY_UNLOCALISED,
                       metrics={**metrics, "level": "none"}, key="unlocalised", confidence="low", **common)
    title, summary = _localised_words(m, s)
    return Finding(
        "slow_link", Severity.CRITICAL if m.frac >= cfg.critical_impact else Severity.WARNING, title, summary,
        _REMEDY, ranks=s.ranks, hosts=(s.host,),
        metrics={**metrics, "nic": ",".join(s.nics) or None, "level": "rank" if s.rank_level else "host",
                 "normal_through_suspect": s.normal_through},
        key="link", confidence="medium", **common,
    )


def _localised_words(m: _SlowLinks, s: _Suspect) -> tuple[str, str]:
    """(title, summary) naming the host (and NIC) common to every slow communicator."""
    where = f"NIC {', '.join(s.nics)} on host {s.host}" if s.nics else f"host {s.host}"
    who = f"rank(s) {', '.join(map(str, s.ranks))}" if s.rank_level else f"{len(s.ranks)} rank(s)"
    return (f"Slow network on {where}: every slow communicator goes through it", (
        f"{m.slow_groups} communicator(s) move data up to {m.max_ratio:.2f}x slower than comparable ones; {where} "
        f"({who}) is the one host in all of them, and in {s.normal_through} of the {m.normal_groups} normal ones. "
        f"The other hosts of the slow communicators are only their partners. Extra transfer time: about "
        f"{m.frac:.1%} of the step."
    ))


def _unlocalised_words(m: _SlowLinks) -> tuple[str, str]:
    """(title, summary) of slow communicators that share no host."""
    return (f"{m.slow_groups} slow communicator(s) with no host in common", (
        f"{m.slow_groups} communicator(s) move data up to {m.max_ratio:.2f}x slower than comparable ones, but no "
        "single host is in all of them (or the communicators through it are not consistently slow): the cause "
        "cannot be localised from group membership, and no host is blamed."
    ))
