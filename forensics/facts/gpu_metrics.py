"""SM-active (and the other sampled GPU counters) from the ``gpu_metrics`` frame, over time windows.

Nsight Systems' ``--gpu-metrics-device`` samples hardware counters per GPU. A sample at time t_i
with value v_i (a percentage) describes the interval [t_i, t_{i+1}) up to the next sample of the
same GPU (as nsys' own ``gpu_metric_util_map`` recipe reads them: "the timeline [rawTimestamp,
rawTimestamp + 1/frequency] shows the metric value at rawTimestamp"); the last sample of a GPU
covers nothing. The averages here are time-weighted over exactly that piecewise-constant signal,
clipped to the window asked for; ``covered_ns`` says how much of the window the samples covered
(time before a GPU's first sample or after its last one is not covered).

Detectors (``busy_wait``) use :func:`sm_active_in_windows` to replace the blocks-per-SM estimate of
SM occupancy by measured SM-active when the job was profiled with GPU metrics; see docs/nsys.md.
"""

from __future__ import annotations

import polars as pl

from forensics.base.frames import JobFrames

_KEYS = ("source", "device")


def has_metric(frames: JobFrames, metric: str = "sm_active") -> bool:
    """True when some source recorded this counter (a non-null sample)."""
    return frames.has("gpu_metrics") and frames["gpu_metrics"][metric].drop_nulls().len() > 0


def _integral(samples: pl.DataFrame, metric: str) -> pl.DataFrame:
    """Per GPU: sample times t, value v (fraction 0..1) of [t, next t), and F(t) = integral up to t."""
    s = (
        samples.filter(pl.col(metric).is_not_null())
        .select(*_KEYS, pl.col("timestamp_ns").alias("t"), (pl.col(metric) / 100.0).alias("v"))
        .unique(subset=[*_KEYS, "t"], keep="first")
        .sort(*_KEYS, "t")
        .with_columns(pl.col("t").shift(-1).over(_KEYS).alias("t_next"))
    )
    piece = ((pl.col("t_next") - pl.col("t")).fill_null(0) * pl.col("v"))
    return s.with_columns(
        (piece.cum_sum() - piece).over(_KEYS).alias("F"),
        pl.col("t").min().over(_KEYS).alias("t_first"),
        pl.col("t").max().over(_KEYS).alias("t_last"),
    )


def sm_active_in_windows(frames: JobFrames, windows: pl.DataFrame, metric: str = "sm_active") -> pl.DataFrame:
    """``windows`` (columns source, device, start_ns, end_ns; any others are kept) with two columns added:
    ``<metric>`` = time-weighted mean fraction (0..1) over the covered part of the window, null when
    no sample covers it, and ``<metric>_covered_ns``.

    ``source`` + ``device`` identify the GPU (``kernels`` rows carry both), so a window taken from a
    kernel gets the counters of the GPU it ran on.
    """
    out_cols = [metric, f"{metric}_covered_ns"]
    if not has_metric(frames, metric) or windows.height == 0:
        return windows.with_columns(pl.lit(None, pl.Float64()).alias(out_cols[0]),
                                    pl.lit(None, pl.Int64()).alias(out_cols[1]))
    g = _integral(frames["gpu_metrics"], metric).with_columns(pl.col("device").cast(pl.Int32))
    w = windows.with_row_index("_w").with_columns(pl.col("device").cast(pl.Int32))
    bounds = g.group_by(_KEYS).agg(pl.col("t_first").first(), pl.col("t_last").first())
    w = w.join(bounds, on=list(_KEYS), how="left").with_columns(
        pl.max_horizontal("start_ns", "t_first").alias("_a"), pl.min_horizontal("end_ns", "t_last").alias("_b")
    )

    def at(col: str, name: str) -> pl.DataFrame:
        # F(x) = F(t_i) + v_i * (x - t_i) for the last sample t_i <= x.
        q = w.filter(pl.col("_b") > pl.col("_a")).select("_w", *_KEYS, pl.col(col).alias("x")).sort("x")
        right = g.select(*_KEYS, "t", "v", "F").sort("t")
        j = q.join_asof(right, left_on="x", right_on="t", by=list(_KEYS), strategy="backward", check_sortedness=False)
        return j.select("_w", (pl.col("F") + pl.col("v") * (pl.col("x") - pl.col("t"))).alias(name))

    covered = pl.when(pl.col("_b") > pl.col("_a")).then(pl.col("_b") - pl.col("_a")).otherwise(0).cast(pl.Int64)
    w = (
        w.join(at("_a", "_Fa").join(at("_b", "_Fb"), on="_w"), on="_w", how="left")
        .with_columns(covered.alias(out_cols[1]))
        .with_columns(
            pl.when(pl.col(out_cols[1]) > 0).then((pl.col("_Fb") - pl.col("_Fa")) / pl.col(out_cols[1]))
            .alias(out_cols[0])
        )
    )
    return w.sort("_w").drop("_w", "t_first", "t_last", "_a", "_b", "_Fa", "_Fb")
