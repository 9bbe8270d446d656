"""gpu_hw_error's parts: the handler table covers the parser's kinds, placement goes through the identity frame."""

from __future__ import annotations

import polars as pl

from forensics.base.frames import KERNEL_EVENT_KINDS, JobFrames
from forensics.detectors.gpu_hw_error.kernel import HANDLERS
from forensics.facts.host_events import HOST_KINDS
from forensics.facts.identity import job_identities
from forensics.facts.placement import Placement
from tests.detectors.nccl_fixtures import frames_from

# kinds that prove nothing about a fault on their own (identity, driver banners, boot, unparsed lines)
# (`context`: stack traces, read by node_health for the module a hung task is blocked in)
SILENT = {"gpu_identity", "driver_load", "nvrm_other", "boot", "unknown", "context"}


def test_every_kernel_event_kind_has_a_handler_or_is_silent_on_purpose():
    assert set(HANDLERS) <= set(KERNEL_EVENT_KINDS)  # no handler for a kind the parser never writes
    # host-side kinds are node_health's, never gpu_hw_error's (no double report)
    assert not set(HANDLERS) & set(HOST_KINDS) and set(HOST_KINDS) <= set(KERNEL_EVENT_KINDS)
    assert set(KERNEL_EVENT_KINDS) - set(HANDLERS) - set(HOST_KINDS) == SILENT


def test_placement_names_ranks_by_bus_id_device_index_and_pid(tmp_path):
    text = ("n1:300:1 [1] NCCL INFO ncclCommInitRank comm 0x1 rank 5 nranks 8 cudaDev 1 busId 3b000 commId 0xa"
            " - Init COMPLETE\n")
    f = frames_from(tmp_path, text)
    ranks = pl.DataFrame({"rank": [4], "host": ["n1.cluster"], "pid": [299], "device": [0]},
                         schema_overrides={"rank": pl.Int32, "device": pl.Int32})
    smi = pl.DataFrame({"host": ["n1", "n1"], "source": ["n1/smi.txt"] * 2, "gpu_index": [0, 1],
                        "pci_bus_id": ["0000:1b:00.0", "0000:3b:00.0"]})
    frames = JobFrames({n: f[n] for n in f.present} | {"ranks": ranks, "gpu_health": smi})
    place = Placement(frames, job_identities(frames))
    assert place.known_hosts == ["n1"]  # trace host (short) = the log host
    assert place.ranks_for("n1", "0000:3b:00.0", set()) == {5}  # the NCCL init line's bus id
    assert place.ranks_for("n1", "0000:1b:00.0", set()) == {4}  # nvidia-smi index 0 = the trace's device 0
    assert place.ranks_for("n1", None, {300, 299}) == {4, 5}  # pids of the log and the trace
    assert place.ranks_for("n2", "0000:3b:00.0", {300}) == set()  # another host
    assert place.ranks_by_host == {"n1": {4}} and place.traced_ranks == {4}
    assert place.host_for(None, "logs/n1/dmesg.txt") == "n1"  # the known host the path names
