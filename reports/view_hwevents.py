"""Hardware and host events on the job's timeline, per host and GPU, with the NCCL timeout and the last step.

Events: kernel-log records of hardware and host kinds (Xid, SXid, ECC, NVLink, AER, PCIe link, fallen off
the bus, GSP, thermal, MCE, EDAC, OOM, lockups, IB port, reboots; ``kernel_events``) and the conditions of
``nvidia-smi -q`` snapshots (clock-event / throttle reasons active, uncorrectable ECC, pending row remap,
reset required; ``gpu_health``); failed or warning ``dcgmi`` checks are listed (they carry no time). A lane
is ``host:bus-id`` when the line names the GPU's PCI address, else the host.

Marks, wall clock (UTC): the NCCL timeout (``nccl_timeout`` findings: when the watchdog fired and when the
timed-out collective started) and the end of the last step every traced rank completed. Records placed
only by a monotonic (since boot) stamp are drawn on their own axis, seconds since boot.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import polars as pl
from forensics.reports.figures import Figure
from forensics.reports.labels import esc
from forensics.reports.view import View, layout

if TYPE_CHECKING:
    from forensics.facts.context import JobContext
    from forensics.pipeline import Analysis

HW_KINDS = ("xid", "sxid", "fabric_manager", "gsp", "fallen_off_bus", "ecc", "nvlink", "aer", "ghes", "pcie_link",
            "ib_port", "mlx5", "netdev_carrier", "cpu_thermal", "edac", "mce", "oom", "hung_task", "soft_lockup",
            "hard_lockup", "boot")
MAX_POINTS_PER_LANE_KIND = 200
EVENT_SCHEMA = {"lane": pl.String, "kind": pl.String, "wall_ns": pl.Int64, "mono_ns": pl.Int64, "message": pl.String}
NO_EVENTS = "no hardware or host event in the kernel logs, nvidia-smi or dcgmi outputs (or none given)"
CAPTION = ("Look for a GPU or host event just before the NCCL timeout or the last completed step: that GPU's host is "
           "where the job broke; events long before are background.")


def iso(ns: int | None) -> str | None:
    """Unix ns as an ISO-8601 UTC string with µs (what plotly's date axis reads)."""
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _lane(bus: str) -> pl.Expr:
    return pl.when(pl.col(bus).is_null()).then(pl.col("host")).otherwise(pl.col("host") + ":" + pl.col(bus))


def kernel_log_events(ctx: JobContext) -> pl.DataFrame:
    """lane, kind (xid as ``xid 79``), wall_ns, mono_ns, message of the hardware/host kernel-log records."""
    ke = ctx.frames["kernel_events"].lazy().filter(pl.col("kind").cast(pl.String).is_in(HW_KINDS))
    src_host = ctx.sources.lazy().select(pl.col("path").alias("source"), pl.col("host").alias("_shost"))
    ke = ke.join(src_host, on="source",
                 how="left").with_columns(pl.coalesce("host", "_shost").fill_null("?").alias("host"))
    kind = pl.when(pl.col("xid").is_not_null()).then(pl.col("kind").cast(pl.String) + " "
                                                     + pl.col("xid").cast(pl.String))
    return ke.select(_lane("pci_bus_id").alias("lane"), kind.otherwise(pl.col("kind").cast(pl.String)).alias("kind"),
                     "wall_ns", "mono_ns", "message").cast(EVENT_SCHEMA).collect()  # type: ignore[arg-type]


def health_events(ctx: JobContext) -> pl.DataFrame:
    """The same columns for nvidia-smi snapshot conditions (one row per GPU and condition)."""
    h = ctx.frames["gpu_health"].lazy().with_columns(pl.col("host").fill_null("?"))
    conds = {
        "throttle": pl.col("clock_reasons_active").list.len().fill_null(0) > 0,
        "ecc uncorrectable": (pl.sum_horizontal(pl.col("^ecc_volatile_.*_ue$").fill_null(0)) > 0),
        "row remap pending": pl.col("remap_pending").fill_null(False),
        "reset required": pl.col("reset_required").fill_null(False) | pl.col("drain_and_reset").fill_null(False),
    }
    parts = [h.filter(cond).select(
        _lane("pci_bus_id").alias("lane"), pl.lit(name).alias("kind"), pl.col("snapshot_ns").alias("wall_ns"),
        pl.lit(None, pl.Int64).alias("mono_ns"),
        (pl.lit(f"nvidia-smi: {name} ")
         + pl.col("clock_reasons_active").list.join(", ").fill_null("")).alias("message"),
    ) for name, cond in conds.items()]
    return pl.concat([p.cast(EVENT_SCHEMA) for p in parts], how="vertical").collect()  # type: ignore[arg-type]


def job_marks(analysis: Analysis) -> list[tuple[int, str]]:
    """(wall ns, label): the NCCL timeouts (fired, and the collective's start) and the end of the last step every
    traced rank completed."""
    marks: list[tuple[int, str]] = []
    for f in analysis.findings:
        died = f.cost.died_ns
        if f.cost.fatal and died is not None:
            marks.append((died, "NCCL timeout"))
            if f.when.start_ns is not None and f.when.start_ns < died:
                marks.append((f.when.start_ns, "timed-out collective began"))
    steps = analysis.frames["steps"].filter(pl.col("rank").is_not_null())
    if steps.height:
        last = int(steps.group_by("rank").agg(pl.col("step").max())["step"].min())  # type: ignore[arg-type]
        end = int(steps.filter(pl.col("step") == last)["end_ns"].max())  # type: ignore[arg-type]
        marks.append((end, f"last completed step ({last})"))
    return sorted(set(marks))


def _scatter(ev: pl.DataFrame, x: str, marks: list[tuple[int, str]]) -> Figure:
    fig = Figure()
    lanes = sorted(ev["lane"].unique().to_list())
    # ties in time in a fixed order (lane, message): the same page every run
    capped = ev.sort(x, "lane", "message", nulls_last=True, maintain_order=True).group_by(
        "lane", "kind", maintain_order=True).head(MAX_POINTS_PER_LANE_KIND)
    for kind in sorted(capped["kind"].unique().to_list()):
        part = capped.filter(pl.col("kind") == kind)
        xs = [iso(v) for v in part[x].to_list()] if x == "wall_ns" else (part[x] / 1e9).round(6).to_list()
        fig.add_scatter(x=xs, y=[esc(v) for v in part["lane"].to_list()], mode="markers", name=esc(kind),
                        text=[esc(m)[:200] for m in part["message"].fill_null("").to_list()],
                        marker=dict(size=10, symbol="diamond"), hovertemplate="%{y}<br>%{x}<br>%{text}<extra></extra>")
    for t, label in marks:
        fig.add_shape(type="line", x0=iso(t), x1=iso(t), y0=0, y1=1, yref="paper",
                      line=dict(color="#b00020", dash="dot"))
        fig.add_annotation(x=iso(t), y=1, yref="paper", text=esc(label), showarrow=False, yanchor="bottom",
                           textangle=-20)
    layout(fig, height=min(1200, max(260, 30 * len(lanes) + 140)),
           xaxis_title="wall clock (UTC)" if x == "wall_ns" else "seconds since boot (the log has no wall-clock stamp)")
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=[esc(v) for v in lanes[::-1]],
                     showticklabels=len(lanes) <= 40)
    return fig


def _summary(ev: pl.DataFrame) -> pl.DataFrame:
    return ev.group_by("lane", "kind").agg(
        pl.len().alias("count"),
        pl.col("wall_ns").min().map_elements(iso, return_dtype=pl.String).alias("first_utc"),
        pl.col("wall_ns").max().map_elements(iso, return_dtype=pl.String).alias("last_utc"),
        (pl.col("mono_ns").min() / 1e9).round(3).alias("first_since_boot_s"),
        pl.col("message").drop_nulls().first().str.slice(0, 160).alias("first_message"),
    ).sort("lane", "kind")


def hw_events_view(analysis: Analysis) -> View:
    view = View("hw-events", "Hardware and host events per host and GPU", CAPTION)
    ctx = analysis.context
    if all(ctx.frames[n].height == 0 for n in ("kernel_events", "gpu_health", "gpu_diag")):
        view.empty_reason = NO_EVENTS
        return view
    ev = pl.concat([kernel_log_events(ctx), health_events(ctx)], how="vertical")
    diag = ctx.frames["gpu_diag"].filter(pl.col("result").is_in(["fail", "warning", "error"]))
    if ev.height == 0 and diag.height == 0:
        view.empty_reason = NO_EVENTS
        return view
    walled = ev.filter(pl.col("wall_ns").is_not_null())
    if walled.height:
        view.figures.append(_scatter(walled, "wall_ns", job_marks(analysis)))
    mono = ev.filter(pl.col("wall_ns").is_null() & pl.col("mono_ns").is_not_null())
    if mono.height:
        view.figures.append(_scatter(mono, "mono_ns", []))
    if ev.height:
        view.tables.append(("Events per lane and kind", _summary(ev)))
    marks = job_marks(analysis)
    if marks:
        view.tables.append(("Job marks (UTC)", pl.DataFrame({"mark": [m for _, m in marks],
                                                             "utc": [iso(t) for t, _ in marks]})))
    if diag.height:
        view.tables.append(("dcgmi checks that failed or warned", diag.select(
            "host", "tool", "test", "result", "gpu_index", pl.col("message").str.slice(0, 160)).sort("host", "test")))
    return view
