"""Checkpoint-save lines (parsers/frameworks.py -> `checkpoints`), read from a rank's output whatever else it holds,
and the work they bound in a fatal incident's cost."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from forensics.parsers.frameworks import parse
from forensics.parsers.result import ParseContext

from forensics.base import frames as fr
from forensics.incidents import JobFacts, correlate, job_facts
from tests.test_incidents import WINDOW, timeout, xid79

S = 1_000_000_000


def _ns(*a: int, frac_ns: int = 0) -> int:
    return int(datetime(*a, tzinfo=timezone.utc).timestamp()) * S + frac_ns


def _rows(tmp_path: Path, *lines: str) -> list[dict]:
    f = tmp_path / "rank0.log"
    f.write_text("\n".join(lines) + "\n")
    df = parse(f, ParseContext(tmp_path, "rank0.log")).frames.get("checkpoints", fr.empty("checkpoints"))
    assert df.schema == fr.schema("checkpoints")
    return [{k: v for k, v in r.items() if k != "source"} for r in df.to_dicts()]


def _row(line: int, **kw) -> dict:
    base = dict(host=None, rank=None, line=line, time_ns=None, stamp=None, iteration=None, step=None, epoch=None,
                path=None, framework=None)
    return base | kw


CASES = [
    ("[2024-03-14 09:00:00] saving checkpoint at iteration     100 to /ckpt/mlm in torch format",
     _row(1, time_ns=_ns(2024, 3, 14, 9, 0, 0), iteration=100, path="/ckpt/mlm", framework="megatron")),
    ("  successfully saved checkpoint from iteration     100 to /ckpt/mlm [ t 1/1, p 1/1 ]",
     _row(1, iteration=100, path="/ckpt/mlm", framework="megatron")),
    ("[2024-03-14 09:05:00,250] [INFO] [logging.py:96:log_dist] [Rank 0] Saving model checkpoint: "
     "/ckpt/ds/global_step200/mp_rank_00_model_states.pt",
     _row(1, rank=0, time_ns=_ns(2024, 3, 14, 9, 5, 0, frac_ns=250_000_000), step=200,
          path="/ckpt/ds/global_step200/mp_rank_00_model_states.pt", framework="deepspeed")),
    ("[Rank 3] Saving model checkpoint", _row(1, rank=3, framework="deepspeed")),
    ("Epoch 3, global step 400: 'val_loss' reached 0.51 (best 0.51), saving model to "
     "'/ckpt/pl/epoch=3-step=400.ckpt' as top 1",
     _row(1, step=400, epoch=3, path="/ckpt/pl/epoch=3-step=400.ckpt", framework="lightning")),
    ("2024-03-14T09:06:00Z Saving latest checkpoint...",
     _row(1, time_ns=_ns(2024, 3, 14, 9, 6, 0), framework="lightning")),
    ("[I0314 09:07:00.5 checkpoint.py:10] Checkpoint saved to /ckpt/dcp/step_500 at step 500",
     _row(1, stamp="0314 09:07:00.5", step=500, path="/ckpt/dcp/step_500", framework="generic")),
]


@pytest.mark.parametrize("line,want", CASES, ids=[w["framework"] + str(i) for i, (_, w) in enumerate(CASES)])
def test_each_format_gives_exact_fields(tmp_path, line, want):
    assert _rows(tmp_path, line) == [want]


def test_failures_and_loads_are_not_saves(tmp_path):
    assert _rows(tmp_path, "Failed to save checkpoint to /x", "Loading checkpoint from /y",
                 "WARNING: could not save checkpoint", "checkpointing every 100 steps") == []


def test_pathological_line_is_linear(tmp_path):
    # a long line of near-matches must not blow up (no backtracking): it simply parses
    rows = _rows(tmp_path, "saved checkpoint " + "to " * 50_000 + "x" * 100_000)
    assert len(rows) == 1 and rows[0]["framework"] == "generic"


MEGATRON = "[2024-03-14 09:00:00] saving checkpoint at iteration     100 to /ckpt/mlm in torch format"
NCCL_INIT = ("n1:100:100 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 5 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 "
             "commId 0xa - Init COMPLETE")
TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nRuntimeError: boom"


def _load(tmp_path: Path, text: str) -> tuple[dict, pl.DataFrame]:
    """(the file's sources row, the job's checkpoints frame) of a run folder holding one file, out.log."""
    from forensics.pipeline import load

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "out.log").write_text(text + "\n")
    sources, frames = load(tmp_path / "run", workers=1)
    assert sources.height == 1
    return sources.row(0, named=True), frames["checkpoints"]


def _times(ck: pl.DataFrame) -> list[tuple[int | None, int | None, str]]:
    return ck.select("rank", "time_ns", "framework").rows()


def test_an_output_with_checkpoint_saves_and_nothing_else_is_read(tmp_path):
    src, ck = _load(tmp_path, f"epoch 1 loss 2.3\n{MEGATRON}\n[Rank 3] Saving model checkpoint\nLoading checkpoint")
    assert (src["kind"], src["status"]) == ("framework_log", "ok")
    assert src["message"] == "2 checkpoint save(s) (deepspeed 1, megatron 1)"
    assert _times(ck) == [(None, _ns(2024, 3, 14, 9, 0, 0), "megatron"), (3, None, "deepspeed")]


def test_an_nccl_log_is_read_for_checkpoint_saves_by_their_own_parser(tmp_path):
    # the NCCL parser makes no checkpoints frame; the frameworks scan gives the row the file's rank
    src, ck = _load(tmp_path, f"{NCCL_INIT}\n{MEGATRON}")
    assert (src["kind"], src["rank"]) == ("nccl_log", 5)
    assert src["message"].endswith("; also read for checkpoint saves: 1 checkpoint save(s) (megatron 1)")
    assert _times(ck) == [(5, _ns(2024, 3, 14, 9, 0, 0), "megatron")]
    from forensics.parsers import nccl_log

    alone = nccl_log.parse(tmp_path / "run" / "out.log", ParseContext(tmp_path / "run", "out.log"))
    assert "checkpoints" not in alone.frames and alone.frames["nccl_comms"].height == 1


def test_a_job_log_is_read_for_checkpoint_saves(tmp_path):
    src, ck = _load(tmp_path, f"{MEGATRON}\n{TRACEBACK}")
    assert (src["kind"], src["status"]) == ("job_log", "ok")
    assert _times(ck) == [(None, _ns(2024, 3, 14, 9, 0, 0), "megatron")]


def test_an_output_without_saves_is_not_a_framework_log(tmp_path):
    src, ck = _load(tmp_path, "epoch 1 loss 2.3\nFailed to save checkpoint to /x\nLoading checkpoint from /y")
    assert (src["kind"], src["status"]) == ("unknown", "ignored") and ck.height == 0


T0 = _ns(2026, 3, 14, 9, 0, 0)


def _cost(facts: JobFacts, fault: int | None = T0, died: int = T0 + 900 * S) -> tuple[float, str]:
    _, inc = correlate([xid79(t=fault), timeout(t=died)], facts)
    return inc[0].gpu_hours_lost, inc[0].cost_method


def test_checkpoint_before_the_fault_adds_gpus_times_the_gap():
    gpus, gap_s = 16, 1234
    base, _ = _cost(JobFacts(gpus, WINDOW))
    got, how = _cost(JobFacts(gpus, WINDOW, (T0 - 5000 * S, T0 - gap_s * S), 2))
    assert got == pytest.approx(gpus * (900 + gap_s) / 3600, abs=1e-6)
    assert got - base == pytest.approx(gpus * gap_s / 3600, abs=1e-6)
    assert "checkpoint save at 08:39:26" in how and f"{gpus * gap_s:.1f} GPU-s" in how


def test_checkpoint_after_the_fault_is_ignored():
    gpus, gap_s = 8, 60
    got, how = _cost(JobFacts(gpus, WINDOW, (T0 - gap_s * S, T0 + 10 * S), 2))
    assert got == pytest.approx(gpus * (900 + gap_s) / 3600, abs=1e-6)
    only_after, how2 = _cost(JobFacts(gpus, WINDOW, (T0 + 10 * S,), 1))
    assert only_after == pytest.approx(gpus * 900 / 3600, abs=1e-6)
    assert "no timed checkpoint save before the fault" in how2


def test_no_checkpoint_line_leaves_the_cost_unchanged():
    got, how = _cost(JobFacts(8, WINDOW))
    assert got == pytest.approx(8 * 900 / 3600, abs=1e-6)
    assert how.endswith("work since the last checkpoint not counted (no checkpoint line read)")
    untimed, how2 = _cost(JobFacts(8, WINDOW, (), 3))
    assert untimed == got and "3 checkpoint line(s) read, none with a wall-clock time" in how2


def test_job_facts_place_glog_stamps_with_the_job_year():
    ck = pl.DataFrame([_row(1, stamp="0314 08:59:00.5", framework="generic", source="a.log"),
                       _row(2, time_ns=T0 - 3600 * S, framework="megatron", source="a.log")])
    steps = fr.conform("steps", pl.DataFrame({"start_ns": [T0]}))
    frames = fr.JobFrames({"checkpoints": fr.conform("checkpoints", ck), "steps": steps},
                          present={"checkpoints", "steps"})
    facts = job_facts(frames, 8, 8)
    assert facts.checkpoints_ns == (T0 - 3600 * S, T0 - 60 * S + 500_000_000)
    assert facts.checkpoint_lines == 2


def test_xid79_sample_counts_the_work_since_its_checkpoint():
    import json

    from forensics.pipeline import analyze

    root = Path(__file__).resolve().parents[1] / "sample_traces"
    truth = json.loads((root / "xid79.truth.json").read_text())
    (ck,) = truth["checkpoints"]
    a = analyze(root / "xid79")
    to = next(f for f in a.findings if f.detector == "nccl_timeout" and f.metrics.get("ran_ms"))
    inc = next(i for i in a.incidents if to.id in i.findings)
    gpus = len(truth["ranks"])
    start = to.metrics["time_ns"] - int(to.metrics["ran_ms"] / 1e3 * 1e9)  # the hang's start: no kernel-log fault time
    assert ck["wall_ns"] <= start
    want_s = gpus * (to.metrics["ran_ms"] / 1e3) + gpus * (start - ck["wall_ns"]) / 1e9
    assert inc.gpu_hours_lost == pytest.approx(want_s / 3600, abs=1e-6)
    assert "checkpoint save at 09:00:00" in inc.cost_method
