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


def test_a_member_lists_id_is_the_first_8_bytes_of_a_blake2b_hash_of_its_ranks():
    import hashlib

    from forensics.base.frames import pg_id

    for ranks, text in (([0, 1], b"0,1"), ([], b""), (list(range(4096)), ",".join(map(str, range(4096))).encode())):
        assert pg_id(ranks) == int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)
    assert pg_id(None) is None and pg_id([0, 1]) != pg_id([1, 0])


def test_frames_parquet_carries_the_schema_version_and_the_members_join(tmp_path):
    from forensics.base.errors import UsageError
    from forensics.pipeline import load_frames_output
    from tests.conftest import ROOT, run_cli

    out = tmp_path / "frames"
    res = run_cli("frames", str(ROOT / "sample_traces" / "pp_small_m"), "--out", str(out), "-q")
    assert res.returncode == 0, res.stderr
    assert f"frame schema {fr.SCHEMA_VERSION}" in res.stdout and fr.SCHEMA_VERSION == 4
    for name in ("kernels", "comms", "process_groups", "sources"):
        assert pl.read_parquet_metadata(out / f"{name}.parquet")[fr.PARQUET_VERSION_KEY] == str(fr.SCHEMA_VERSION)
    kernels, pgs = pl.read_parquet(out / "kernels.parquet"), pl.read_parquet(out / "process_groups.parquet")
    assert "pg_ranks" not in kernels.columns
    assert kernels.schema["name"] == pl.Categorical()  # schema 3: names stored once (docs/frames.md: cast to String)
    comm = kernels.filter(pl.col("class") == "comm")
    joined = comm.join(pgs.select("pg_id", "pg_ranks").unique("pg_id"), on="pg_id", how="left")
    # every comm kernel of the simulated pipeline names its group's members, and each list is its group's size
    assert comm["pg_id"].null_count() == 0 and joined["pg_ranks"].null_count() == 0
    assert (joined["pg_ranks"].list.len() == joined["group_size"]).all()
    back = load_frames_output(out)
    assert back["kernels"].equals(kernels)
    pl.read_parquet(out / "kernels.parquet").write_parquet(out / "kernels.parquet")  # no version: schema 1
    with pytest.raises(UsageError, match="frame schema 1"):
        load_frames_output(out)
