"""forensics.tables.step_breakdown_table: the per-rank aggregate the reports render."""

from __future__ import annotations

import pytest

from forensics.context import JobContext
from forensics.frames import JobFrames
from forensics.tables import step_breakdown_table
from tests.frame_builders import MS, dp_job


def test_per_rank_medians_match_the_builder():
    # 20 ms compute, 2 ms all-reduce; rank 3's host stalls 10 ms each step: the others wait 10 ms for it.
    frames, truth = dp_job(n_ranks=4, steps=3, compute_ns=20 * MS, tx_ns=2 * MS, host_delay={3: 10 * MS})
    t = step_breakdown_table(JobContext(frames))
    assert t["rank"].to_list() == [0, 1, 2, 3]
    row = {r["rank"]: r for r in t.iter_rows(named=True)}
    assert row[0]["step_ms"] == pytest.approx(truth.step_ns[(0, 1)] / 1e6, abs=1e-3)
    assert row[0]["compute_ms"] == 20.0 and row[0]["exposed_comm_ms"] == 2.0 and row[0]["comm_wait_ms"] == 10.0
    # Host-bound in its window: from the step start to the late launch call, 10 ms - 5 us launch latency.
    assert row[3]["comm_wait_ms"] == 0.0 and row[3]["host_bound_ms"] == pytest.approx(9.995, abs=1e-6)
    assert row[0]["wait"] == pytest.approx(10 / 32.1, abs=1e-3)


def test_whole_trace_without_steps_and_empty_without_kernels():
    frames, _ = dp_job(n_ranks=2, steps=2, compute_ns=20 * MS, tx_ns=2 * MS)
    t = step_breakdown_table(JobContext(JobFrames({"kernels": frames["kernels"], "cpu_ops": frames["cpu_ops"]})))
    # One window per rank from its first kernel start to its last kernel end: 2 x (20 ms + 2 ms) + 0.1 ms gap.
    assert t["steps"].to_list() == [1, 1] and t["step_ms"].to_list() == [44.1, 44.1]
    assert t["compute_ms"].to_list() == [40.0, 40.0]
    assert step_breakdown_table(JobContext(JobFrames({}))).height == 0
