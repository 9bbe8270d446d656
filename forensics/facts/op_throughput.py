"""Achieved FLOP/s per op, input shapes and dtype: the FLOPs of the op calls (:mod:`forensics.base.flops`) over
the GPU time of the kernels they launched, against the device's dense peak."""

from __future__ import annotations

import orjson
import polars as pl

from forensics.base.flops import device_key, dtype_key, op_flops, peak_tflops


def op_throughput(shapes: pl.DataFrame, kernels: pl.DataFrame, cpu_ops: pl.DataFrame,
                  ranks: pl.DataFrame) -> pl.DataFrame:
    """Per op name, input shapes and dtype: calls, FLOPs, GPU time of the kernels the calls launched, achieved
    TFLOP/s and its share of the device's dense peak.

    A kernel belongs to the innermost shaped op open on its launching thread when the launch call began
    (launch -> kernel by correlation id): ``aten::linear`` around ``aten::addmm`` leaves the kernels to the
    ``addmm``, so nothing counts twice. Ops without kernels, or whose FLOPs the shapes do not give, are left out
    (never guessed); ``peak_tflops`` / ``efficiency`` are null for a device or dtype without a known peak.
    """
    if shapes.height == 0:
        return pl.DataFrame(schema=_throughput_schema())
    calls = _launched_kernel_time(shapes, kernels, cpu_ops)
    device = ranks.group_by("rank").agg(pl.col("gpu_name").drop_nulls().first())
    calls = calls.join(device, on="rank", how="left")
    per_shape = calls.group_by("name", "input_dims", "input_types", "gpu_name").agg(
        pl.len().cast(pl.UInt32).alias("calls"), pl.col("kernel_ns").sum(), pl.col("rank").n_unique().alias("ranks")
    )
    rows = [_throughput_row(r) for r in per_shape.iter_rows(named=True)]
    out = pl.DataFrame([r for r in rows if r is not None], schema=_throughput_schema(), orient="row")
    return out.sort(["kernel_ns", "op", "shapes"], descending=[True, False, False])


def _launched_kernel_time(shapes: pl.DataFrame, kernels: pl.DataFrame, cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """Each shaped op call with ``kernel_ns``, the GPU time of the kernels launched inside it (calls with none
    are dropped)."""
    k = kernels.select("rank", "correlation", "start_ns", "end_ns").group_by("rank", "correlation").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("_kns"))
    launches = (
        cpu_ops.select("rank", "tid", "is_launch", "correlation", "start_ns")
        .filter(pl.col("is_launch") & pl.col("correlation").is_not_null())
        .select("rank", "tid", "correlation", pl.col("start_ns").alias("_t"))
        .join(k, on=["rank", "correlation"], how="inner")
        .drop_nulls(["rank", "tid"]).sort("_t")
    )
    ops = shapes.with_row_index("_call").select("_call", "rank", "tid", pl.col("start_ns").alias("_os"),
                                                pl.col("end_ns").alias("_oe")).drop_nulls(["rank", "tid"]).sort("_os")
    hit = launches.join_asof(ops, left_on="_t", right_on="_os", by=["rank", "tid"], strategy="backward",
                             check_sortedness=False).filter(pl.col("_oe") >= pl.col("_t"))
    per_call = hit.group_by("_call").agg(pl.col("_kns").sum().alias("kernel_ns"))
    return shapes.with_row_index("_call").join(per_call, on="_call", how="inner").drop("_call")


# a function, not a constant: importing this module runs no Polars code (`forensics rules`, frames.Dtype)
def _throughput_schema() -> dict[str, type[pl.DataType]]:
    return {
        "op": pl.String, "shapes": pl.String, "dtype": pl.String, "device": pl.String, "ranks": pl.UInt32,
        "calls": pl.UInt32, "gflop_per_call": pl.Float64, "kernel_ns": pl.Int64, "tflops": pl.Float64,
        "peak_tflops": pl.Float64, "efficiency": pl.Float64,
    }


def _throughput_row(r: dict) -> tuple | None:
    """One (op, shapes, dtype, device) group as a row of the throughput table; None without FLOPs or time."""
    dims = orjson.loads(r["input_dims"] or "null") or []
    types = orjson.loads(r["input_types"] or "null") or []
    flops = op_flops(r["name"], [d if isinstance(d, list) else [] for d in dims])
    if flops is None or not r["kernel_ns"]:
        return None
    dtype = next((k for k in (dtype_key(t) for t in types if isinstance(t, str)) if k), None)
    device = device_key(r["gpu_name"])
    tflops = flops * r["calls"] / r["kernel_ns"] / 1e3  # FLOP per ns = GFLOP/s; / 1e3 = TFLOP/s
    peak = peak_tflops(device, dtype)
    return (r["name"], r["input_dims"], dtype, device, r["ranks"], r["calls"], flops / 1e9, r["kernel_ns"],
            tflops, peak, tflops / peak if peak else None)
