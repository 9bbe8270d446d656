"""Coverage: the ranks a job has against the ranks with data, as the trace detectors report them."""

from __future__ import annotations

import pytest

from forensics.facts.context import JobContext
from forensics.facts.coverage import Coverage, coverage, rank_list
from tests.detectors.partial_inputs import only_ranks
from tests.frame_builders import dp_job


@pytest.mark.parametrize("ranks,text", [([], ""), ([3], "3"), ([5, 0, 1, 2, 7], "0-2, 5, 7"), ([4, 4, 5], "4-5")])
def test_rank_list(ranks, text):
    assert rank_list(ranks) == text


@pytest.mark.parametrize("with_data,steps,level", [
    (range(8), 5, "high"),
    (range(8), 1, "medium"),  # one step (or a whole-trace window): not enough for high
    (range(4), 5, "medium"),  # half the ranks
    (range(3), 5, "low"),
    ([0], 5, "low"),  # a lone rank of eight
])
def test_confidence_from_ranks_with_data_and_steps(with_data, steps, level):
    assert Coverage(expected=tuple(range(8)), with_data=tuple(with_data), steps=steps).confidence() == level


def test_a_single_rank_job_is_not_a_lone_rank():
    cov = Coverage(expected=(0,), with_data=(0,), steps=3)
    assert not cov.lone_rank and cov.confidence() == "high" and cov.sentence() == ""


def test_expected_ranks_come_from_the_job_metadata_not_the_traces():
    frames, _ = dp_job(n_ranks=6, steps=3)
    full = coverage(JobContext(frames))
    assert (full.expected, full.with_data, full.missing, full.steps) == (tuple(range(6)), tuple(range(6)), (), 3)
    part = coverage(JobContext(only_ranks(frames, {1, 4})))
    assert (part.with_data, part.missing) == ((1, 4), (0, 2, 3, 5))
    assert part.metrics() == {"ranks_expected": 6, "ranks_with_data": 2, "ranks_without_data": "0, 2-3, 5"}
