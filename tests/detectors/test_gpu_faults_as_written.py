"""GPU faults read the way the driver wrote them (issue 15 item 5): 'caused by previous Xid N' chains,
NVLink5 payloads, AER on the function the nvidia driver owns, RmInitAdapter and fallen-off-the-bus lines
with their bus id. Each excerpt is built from the driver's and the kernel's own message formats; every
expectation is read off the excerpt."""

from __future__ import annotations

import orjson
import polars as pl
from forensics.parsers.kernel_log import parse_text
from forensics.parsers.nvidia_smi import parse_text as smi_text

from forensics.base.findings import Severity
from tests.detectors.test_gpu_hw_error import _kernel, _log
from tests.kernlog_helpers import detect

NETIR_FATAL = ("NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x016415c6 0x00000000 0x00000000 0x00000000 0x00000000 "
               "0x00000000)")
RLW_NONFATAL = ("RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000 0x00000000 0x00000000 "
                "0x00000000)")


def _xid(bus: str, xid: int, text: str, pid: int | None = None) -> str:
    who = f"pid={pid}, name=python3, " if pid is not None else ""
    return f"NVRM: Xid (PCI:{bus}): {xid}, {who}{text}"


# --- "caused by previous Xid N" -------------------------------------------------------------------

def test_xid45_chain_without_its_root_line_is_one_nvlink5_finding_not_four_application_faults():
    # the ring buffer lost the Xid 149: four GPUs' channels torn down "caused by previous Xid 149"
    buses = ("0000:1b:00", "0000:2b:00", "0000:3b:00", "0000:4b:00")
    text = _log([("gb1", 1.0 + i * 0.001, _xid(b, 45, "Ch 00000001 caused by previous Xid 149", 3000 + i))
                 for i, b in enumerate(buses)])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.metrics["category"] == "nvlink5" and x.metrics["root_xid"] == 149
    assert x.gpus == tuple(f"{b}.0" for b in buses)
    assert x.metrics["events"] == 4 and x.metrics["caused_by_xid"] == 149
    assert x.metrics["root_xid_in_log"] is False
    assert not x.title.startswith("Application-level")
    # channels killed by an NVLink fault: the processes on those GPUs died of infrastructure
    assert x.metrics["severity_level"] == "HIGH" and x.severity is Severity.CRITICAL


def test_victim_and_peer_chain_folds_into_one_incident_rooted_in_the_earliest_xid():
    # fault injection shape: 149 on the victim, 145 on each GPU, 45s caused by 149 (victim) and 145 (peers), 154
    a, b, c = "0000:1b:00", "0000:2b:00", "0000:3b:00"
    text = _log([
        ("gb1", 10.000, _xid(a, 149, NETIR_FATAL)),
        ("gb1", 10.050, _xid(a, 145, RLW_NONFATAL)),
        ("gb1", 10.060, _xid(b, 145, RLW_NONFATAL)),
        ("gb1", 10.070, _xid(c, 145, RLW_NONFATAL)),
        ("gb1", 10.283, _xid(a, 45, "Ch 00000001 caused by previous Xid 149", 4001)),
        ("gb1", 10.284, _xid(b, 45, "Ch 00000002 caused by previous Xid 145", 4002)),
        ("gb1", 10.285, _xid(c, 45, "Ch 00000003 caused by previous Xid 145", 4003)),
        ("gb1", 10.404, _xid(a, 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")),
    ])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.metrics["root_xid"] == 149 and x.metrics["events"] == 8
    assert x.gpus == (f"{a}.0", f"{b}.0", f"{c}.0")
    assert x.severity is Severity.CRITICAL and x.metrics["recovery_action"] == "GPU Reset Required"


def test_xid45_caused_by_an_application_xid_stays_an_application_finding():
    text = _log([
        ("n1", 1.0, _xid("0000:3b:00", 13, "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Illegal Instruction Encoding", 7)),
        ("n1", 1.2, _xid("0000:3b:00", 45, "Ch 00000009 caused by previous Xid 13", 7)),
    ])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.title.startswith("Application-level Xid 13") and x.severity is Severity.WARNING
    assert x.metrics["events"] == 2


# --- NVLink5 payloads as printed -------------------------------------------------------------------

def _fields(text: str) -> dict:
    ke = parse_text(text, "dmesg.log").frames["kernel_events"]
    return orjson.loads(ke["fields"][0])


def test_nvlink5_payload_with_padded_columns_is_decoded():
    # column-aligned print of newer drivers: two and three spaces between unit, fatality and XC
    f = _fields("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
                "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n")
    assert (f["nvlink_unit"], f["fatal"], f["link"], f["intrinfo"]) == ("NETIR_LINK_EVT", True, 1, "0x021425c6")
    assert f["subcode"] == (0x021425C6 >> 20) & 0x3F == 0x21


def test_nvlink5_payload_pre_r575_spacing_and_short_forms_are_decoded():
    f = _fields("NVRM: Xid (PCI:0000:00:1e): 149, NETIR_LINK_EVT Fatal XC 1 i 2 Link 01 [0x0000000a]\n")
    assert (f["nvlink_unit"], f["fatal"], f["link"], f["xc"], f["instance"], f["intrinfo"]) == \
        ("NETIR_LINK_EVT", True, 1, "XC1", "i2", "0x0000000a")
    g = _fields("NVRM: Xid (PCI:0000:00:1e): 148, NVLPW_CTRL Fatal XC0 i0 Link 05\n")
    assert (g["nvlink_unit"], g["fatal"], g["link"]) == ("NVLPW_CTRL", True, 5) and "intrinfo" not in g
    h = _fields("NVRM: Xid (PCI:0000:00:1e): 146, TLW_RX_PIPE1 Nonfatal XC0 i0 Link 03 (0x00000010 0x00000020)\n")
    assert (h["nvlink_unit"], h["fatal"], h["intrinfo"], h["error_status"]) == ("TLW_RX_PIPE1", False, "0x00000010", "0x00000020")


def test_nvlink5_fatal_link_event_with_padding_is_graded_from_its_payload():
    text = "[ 5.0] NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 " \
           "(0x004525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
    (x,) = detect({"kernel_events": _kernel(text)})
    # sub-code (0x004525c6 >> 20) & 0x3f = 4: a link fault (INVESTIGATE_LINK_SI), not a peer's
    assert x.metrics["severity_level"] == "CRITICAL" and "NETIR_LINK_EVT Fatal" in x.title
    assert x.metrics["catalog_bucket"] == "RESET_GPU (INVESTIGATE_LINK_SI)"


# --- PCIe AER: the function the nvidia driver owns ---------------------------------------------------

AER_AUDIO = [
    # the root port receives the error; the errant function is the GPU's HDMI audio (.1)
    "pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.1",
    "snd_hda_intel 0000:3b:00.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)",
    "snd_hda_intel 0000:3b:00.1:   device [10de:22bb] error status/mask=00004000/00000000",
    "snd_hda_intel 0000:3b:00.1:    [14] CmpltTO                (First)",
]


def test_fatal_aer_is_pinned_on_the_gpu_the_nvidia_driver_owns_not_its_audio_function():
    lines = AER_AUDIO + [
        "nvidia 0000:3b:00.0: AER: can't recover (no error_detected callback)",
        "snd_hda_intel 0000:3b:00.1: AER: can't recover (no error_detected callback)",
        "pcieport 0000:3a:00.0: AER: device recovery failed",
    ]
    text = _log([("n1", 50.0 + i * 0.001, m) for i, m in enumerate(lines)])
    (x,) = detect({"kernel_events": _kernel(text)})
    assert x.gpus == ("0000:3b:00.0",) and x.metrics["aer_port"] == "0000:3a:00.0"
    assert x.metrics["events"] == 7 and x.severity is Severity.CRITICAL
    assert x.metrics["aer_device"] == "0000:3b:00.1 (snd_hda_intel)"


def test_fatal_aer_on_an_audio_function_maps_to_the_gpu_nvidia_smi_knows():
    smi = smi_text("==============NVSMI LOG==============\n\nGPU 00000000:3B:00.0\n    Product Name : NVIDIA H100\n",
                   "n1/nvidia-smi.txt").frames["gpu_health"]
    text = _log([("n1", 50.0 + i * 0.001, m) for i, m in enumerate(AER_AUDIO)])
    (x,) = detect({"kernel_events": _kernel(text, "n1/kern.log"), "gpu_health": smi})
    assert x.gpus == ("0000:3b:00.0",) and x.metrics["aer_device"] == "0000:3b:00.1 (snd_hda_intel)"


def test_fatal_aer_on_a_device_no_gpu_owns_names_no_gpu():
    lines = ["pcieport 0000:5d:00.0: AER: Uncorrected (Fatal) error received: 0000:5e:00.0",
             "nvme 0000:5e:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)",
             "nvme 0000:5e:00.0: AER: can't recover (no error_detected callback)"]
    (x,) = detect({"kernel_events": _kernel(_log([("n1", 5.0, m) for m in lines]))})
    assert x.gpus == () and x.metrics["aer_device"] == "0000:5e:00.0 (nvme)"
    assert x.metrics["events"] == 3


# --- RmInitAdapter failed / fallen off the bus, with their bus id -----------------------------------

def test_rm_init_adapter_failure_of_a_second_gpu_is_its_own_critical_finding():
    text = _log([
        ("n1", 1.0, _xid("0000:1b:00", 79, "GPU has fallen off the bus.", 10)),
        ("n1", 30.0, "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:0x55:2477)"),
        ("n1", 30.1, "NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 1"),
    ])
    found = detect({"kernel_events": _kernel(text)})
    assert sorted(f.gpus for f in found) == [("0000:1b:00.0",), ("0000:3b:00.0",)]
    init = next(f for f in found if f.gpus == ("0000:3b:00.0",))
    assert init.metrics["category"] == "gpu_init_failed" and init.severity is Severity.CRITICAL
    assert init.metrics["events"] == 2 and init.metrics["init_status"] == "0x62:0x55:2477"
    assert init.metrics["device_minor"] == 1


def test_rm_init_adapter_lines_are_parsed_with_bus_id_and_codes():
    ke = parse_text("[  12.5] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1227)\n"
                    "[  12.5] NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 0\n",
                    "dmesg.log").frames["kernel_events"]
    assert ke["kind"].cast(pl.String).to_list() == ["gpu_init_failed", "gpu_init_failed"]
    assert ke["pci_bus_id"].to_list() == ["0000:3b:00.0", "0000:3b:00.0"]
    f0, f1 = (orjson.loads(s) for s in ke["fields"])
    assert f0["init_status"] == "0x26:0xffff:1227" and f1["device_minor"] == 0


def test_fallen_off_the_bus_split_over_three_stamped_lines_keeps_its_bus_id():
    # journalctl prints each printk of the probe-time message as its own stamped record
    text = _log([
        ("n1", 5.000, "NVRM: The NVIDIA GPU 0000:b3:00.0"),
        ("n1", 5.000, "NVRM: (PCI ID: 10de:26b5) installed in this system has"),
        ("n1", 5.001, "NVRM: fallen off the bus and is not responding to commands."),
    ])
    ke = _kernel(text)
    assert ke.filter(pl.col("kind") == "fallen_off_bus")["pci_bus_id"].to_list() == ["0000:b3:00.0"]
    (x,) = detect({"kernel_events": ke})
    assert x.gpus == ("0000:b3:00.0",) and x.metrics["category"] == "fallen_off_bus"
    assert x.severity is Severity.CRITICAL


def test_fatal_aer_on_an_audio_function_maps_to_the_gpu_and_rank_nccl_knows(tmp_path):
    from tests.detectors.nccl_fixtures import frames_from

    nccl = frames_from(tmp_path, "n1:300:300 [1] NCCL INFO ncclCommInitRank comm 0x1 rank 5 nranks 8 cudaDev 1 "
                                 "busId 3b000 commId 0xa - Init COMPLETE\n")
    text = _log([("n1", 50.0 + i * 0.001, m) for i, m in enumerate(AER_AUDIO)])
    (x,) = detect({"kernel_events": _kernel(text), "nccl_comms": nccl["nccl_comms"]})
    assert x.gpus == ("0000:3b:00.0",) and x.ranks == (5,)
