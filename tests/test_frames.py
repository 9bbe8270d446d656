from __future__ import annotations

import polars as pl
import pytest

from forensics.base import frames as fr


def test_every_time_column_is_int64_ns():
    for spec in fr.FRAME_SPECS.values():
        for col in spec.columns:
            if col.name.endswith("_ns"):
                assert col.dtype == pl.Int64, (spec.name, col.name)


def test_conform_orders_casts_and_fills_missing_columns():
    df = pl.DataFrame({"end_ns": [5], "start_ns": [1], "step": [3], "rank": [2]})
    out = fr.conform("steps", df)
    assert out.columns == list(fr.schema("steps"))
    assert out.schema == fr.schema("steps")
    assert out.row(0, named=True) == {"rank": 2, "host": None, "source": None, "step": 3, "start_ns": 1, "end_ns": 5}


def test_conform_rejects_unknown_columns():
    with pytest.raises(ValueError, match="not in the canonical schema"):
        fr.conform("steps", pl.DataFrame({"bogus": [1]}))


def test_jobframes_absent_frame_is_empty_with_schema():
    job = fr.JobFrames({})
    assert job["kernels"].height == 0
    assert job["kernels"].schema == fr.schema("kernels")
    assert not job.has("kernels")
