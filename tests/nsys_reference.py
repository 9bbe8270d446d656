"""nsys' own `cuda_gpu_kern_sum`, `gpu_gaps` and `gpu_time_util` re-computed from OUR frames with Polars,
following the algorithm described in ../shared/research/nsys.md §1b (not nsys code), so tests can
compare our frames with the golden CSVs NVIDIA's tools wrote for the same files."""

from __future__ import annotations

import polars as pl

GPU_CLASSES = ("compute", "comm", "memcpy", "memset")


def kern_sum(kernels: pl.DataFrame) -> pl.DataFrame:
    k = kernels.filter(pl.col("class").is_in(["compute",
                                              "comm"])).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("d"))
    total = k["d"].sum()
    return k.group_by(pl.col("name").cast(pl.String)).agg(  # names are Categorical in the frames
        pl.col("d").sum().alias("total"),
        pl.len().alias("instances"),
        pl.col("d").mean().alias("avg"),
        pl.col("d").median().alias("med"),
        pl.col("d").min().alias("min"),
        pl.col("d").max().alias("max"),
    ).with_columns((pl.col("total") / total * 100).alias("pct"))


def gpu_ops(kernels: pl.DataFrame, overhead: pl.DataFrame) -> pl.DataFrame:
    """Kernels, memcpy, memset per (source, device), plus profiler overhead clipped to the device's span."""
    ops = kernels.filter(pl.col("class").is_in(GPU_CLASSES)).select("source", "device", "start_ns", "end_ns")
    span = ops.group_by("source", "device").agg(pl.col("start_ns").min().alias("lo"),
                                                pl.col("end_ns").max().alias("hi"))
    ov = (
        overhead.select("source", "device", "start_ns", "end_ns")
        .join(span, on=["source", "device"])
        .with_columns(pl.max_horizontal("start_ns", "lo").alias("start_ns"),
                      pl.min_horizontal("end_ns", "hi").alias("end_ns"))
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .select("source", "device", "start_ns", "end_ns")
    )
    return pl.concat([ops, ov])


def gaps(ops: pl.DataFrame, threshold_ns: int) -> pl.DataFrame:
    """Idle intervals: starts and ends sorted independently per GPU; gap_i = start[i] - end[i-1]."""
    starts = ops.select("source", "device", "start_ns").sort("source", "device", "start_ns").with_columns(
        pl.int_range(pl.len()).over("source", "device").alias("i"))
    ends = ops.select("source", "device", "end_ns").sort("source", "device", "end_ns").with_columns(
        (pl.int_range(pl.len()).over("source", "device") + 1).alias("i"))
    return (
        starts.join(ends, on=["source", "device", "i"])
        .with_columns((pl.col("start_ns") - pl.col("end_ns")).alias("duration"), pl.col("end_ns").alias("gap_start"))
        .filter(pl.col("duration") > threshold_ns)
        .select("source", "device", "gap_start", "duration")
    )


def time_util(ops: pl.DataFrame, chunks: int = 30, threshold_pct: float = 50.0) -> pl.DataFrame:
    """Per GPU: split [first start, last end] into `chunks` chunks of ceil(span/chunks) ns, % of each
    chunk covered by ops (concurrent ops add up), chunks below the threshold, consecutive ones merged
    with a duration-weighted mean."""
    span = ops.group_by("source", "device").agg(pl.col("start_ns").min().alias("lo"),
                                                pl.col("end_ns").max().alias("hi"))
    span = span.with_columns((((pl.col("hi") - pl.col("lo")) + chunks - 1) // chunks).alias("size"))
    grid = span.with_columns(pl.int_ranges(0, chunks).alias("c")).explode("c").with_columns(
        (pl.col("lo") + pl.col("c") * pl.col("size")).alias("c_lo"),
        pl.min_horizontal(pl.col("lo") + (pl.col("c") + 1) * pl.col("size"), pl.col("hi")).alias("c_hi"),
    ).filter(pl.col("c_hi") > pl.col("c_lo"))
    # Each op touches the chunks from (start-lo)//size to (end-lo)//size.
    o = ops.join(span, on=["source", "device"]).with_columns(
        pl.int_ranges((pl.col("start_ns") - pl.col("lo")) // pl.col("size"),
                      pl.min_horizontal((pl.col("end_ns") - pl.col("lo")) // pl.col("size"),
                                        pl.lit(chunks - 1)) + 1).alias("c")
    ).explode("c").drop("lo", "hi", "size")
    busy = o.join(grid, on=["source", "device", "c"]).with_columns(
        (pl.min_horizontal("end_ns", "c_hi") - pl.max_horizontal("start_ns", "c_lo")).clip(lower_bound=0).alias("b")
    ).group_by("source", "device", "c").agg(pl.col("b").sum())
    util = grid.join(busy, on=["source", "device", "c"], how="left").with_columns(
        (pl.col("b").fill_null(0) / (pl.col("c_hi") - pl.col("c_lo")) * 100).alias("pct"),
        (pl.col("c_hi") - pl.col("c_lo")).alias("dur"),
    ).sort("source", "device", "c")
    low = util.filter(pl.col("pct") < threshold_pct).with_columns(
        (pl.col("c") - pl.col("c").shift(1).over("source",
                                                 "device") != 1).fill_null(True).cum_sum().over("source",
                                                                                                "device").alias("run")
    )
    return low.group_by("source", "device", "run").agg(
        ((pl.col("pct") * pl.col("dur")).sum() / pl.col("dur").sum()).alias("pct"),
        pl.col("dur").sum().alias("duration"),
        pl.col("c_lo").min().alias("start"),
    ).drop("run").sort("source", "device", "start")
