"""GPU and fabric hardware errors from kernel logs, nvidia-smi and DCGM, one finding per incident.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

# The detector's parts, one job per module (this module composes them):
# - config: the detector's settings (GpuHwErrorConfig);
# - incident: an incident being assembled, the per-host book of them, the passes that merge them;
# - kernel: one handler per kernel-log event kind (the state machine, as a dispatch table);
# - xid, memory: Xid payloads; GHES and MCE memory errors;
# - aer: PCIe AER lines -> error records -> link-loss, uncorrected and corrected-burst incidents;
# - health: ``nvidia-smi -q`` and ``dcgmi diag`` -> incidents;
# - render: incidents -> findings.
# Kernel-event normalisation and placement are job facts (forensics.facts.kernel_events, .placement).

from __future__ import annotations

from forensics.base.findings import Finding
from forensics.base.xid_catalog import LEVELS, POLICIES, max_level
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.detectors._fault_kinds import GPU_FAULT, NIC_FAULT, PLATFORM_ERROR
from forensics.detectors.gpu_hw_error.config import GpuHwErrorConfig
from forensics.detectors.gpu_hw_error.health import diag_incidents, smi_incidents
from forensics.detectors.gpu_hw_error.incident import Incident, mark_fleet_patterns
from forensics.detectors.gpu_hw_error.kernel import kernel_incidents
from forensics.detectors.gpu_hw_error.render import GPU_EVENT, to_finding, with_benign
from forensics.facts.context import JobContext
from forensics.facts.kernel_events import prepare_events

DOC = DetectorDoc(
    summary=(
        "GPU and fabric hardware errors from kernel logs, nvidia-smi and DCGM, one finding per incident."
    ),
    detects=(
        "NVIDIA Xids (graded by the Xid catalog, ``forensics/base/data/xid_catalog.csv``), NVSwitch SXids and"
        " fabric-manager errors, GSP timeouts, GPUs fallen off the bus or failing to initialize "
        "(``RmInitAdapter failed``), ECC / row-remap events, NVLink and NVLink5 faults, PCIe AER and GHES "
        "errors, and segfaults of training processes; plus the persistent GPU state in ``nvidia-smi -q`` "
        "(pending or failed row remaps, SRAM/DRAM uncorrectable errors, reset required, HW slowdown / power "
        "brake) and ``dcgmi diag`` failures. Host-side faults (EDAC, OOM kills, hung tasks, lockups, NIC link"
        " flaps, CPU thermal throttling, filesystem errors) are node_health's."
    ),
    matters=(
        "Most unexpected interruptions of large training runs are hardware (Llama 3: ~78% of 419, led by "
        "faulty GPUs and HBM). A dead or sick GPU or link explains a hang, a crash or a straggler better than"
        " any software setting, and it must be drained or reset before the job is restarted."
    ),
    measures=(
        "Lines are grouped into incidents, not counted: events on the same GPU closer than ``incident_gap_s``"
        " form one incident (application-class Xids separately from hardware ones); sympathetic lines (Xid "
        "43/45, Xid 154's recovery action, Xid 3, GSP lines, AER recovery, devices on the same PCI slot) join"
        " the incident they follow; Xid 45 \"caused by previous Xid N\" joins the incident of Xid N (opened "
        "from the 45 when N's own line is not in the log), the incident rooted in the earliest Xid the driver"
        " named, and a hardware root whose channels were torn down is HIGH at least; a fatal PCIe AER is "
        "pinned on the function the nvidia driver owns (its driver name in the line, else a bus id known as a"
        " GPU from nvidia-smi, NCCL or the driver's lines, else no GPU: the errant device is named); a fatal "
        "PCIe AER followed within ``aer_xid_window_s`` by Xid 79 is one \"PCIe link loss\" incident, with "
        "corrected AER on that port in the preceding ``precursor_window_s`` as precursors; Xid 45 caused by "
        "an NVLink5 Xid on several GPUs is one node-level NVLink incident; the same throttle reason on at "
        "least half of a node's GPUs is one node-level finding. Severity comes from the catalog under "
        "``policy`` (default / strict / lenient, which disagree on Xids 63, 92, 109, 121), refined by the "
        "payload (NVLink5 unit and fatality, Xid 154 action). Benign lines (boot noise, INIT->ACTIVE link "
        "training, corrected AER below ``corrected_aer_min_count`` per ``corrected_aer_window_s``, allowed "
        "SXids) make no finding but are counted in ``benign_events`` of every finding. GPUs are joined to "
        "ranks through ``nccl_comms`` bus ids, ``gpu_health`` index order + ``ranks.device``, and the Xid's "
        "pid; monotonic-only stamps are placed on the wall clock only when the log carries a boot time."
    ),
    todo=(
        "Follow the finding's action: RESTART_APP for application Xids (fix the code first), RESET_GPU "
        "(``nvidia-smi -r`` or reboot), REBOOT_NODE, DRAIN_NODE before restarting the job, RMA_CANDIDATE (run"
        " ``dcgmi diag -r 3`` and open an RMA if confirmed), INSPECT_PCIE / INSPECT_LINK (reseat, cables, "
        "riser, BMC SEL), CHECK_COOLING / CHECK_POWER, INVESTIGATE_SW / INVESTIGATE_STORAGE."
    ),
)


@detector("gpu_hw_error", doc=DOC, settings=GpuHwErrorConfig, requires_any=("kernel_events", "gpu_health", "gpu_diag"),
          kinds=(GPU_FAULT, PLATFORM_ERROR, NIC_FAULT, GPU_EVENT), view="hw-events")
def detect(ctx: JobContext, cfg: GpuHwErrorConfig) -> list[Finding]:
    if cfg.policy not in POLICIES:
        raise Skip(f"unknown policy {cfg.policy!r}; use one of {', '.join(POLICIES)}")
    frames = ctx.frames
    place = ctx.placement
    benign: dict[str | None, int] = {}  # lines that prove nothing, per host: counted in every finding
    incidents: list[Incident] = []
    if frames.has("kernel_events"):
        incidents += kernel_incidents(prepare_events(ctx.kernel_events), cfg, benign, place.gpu_buses())
    if frames.has("gpu_health"):
        incidents += smi_incidents(frames["gpu_health"], cfg, benign, place)
    if frames.has("gpu_diag"):
        incidents += diag_incidents(frames["gpu_diag"], benign, place)
    mark_fleet_patterns(incidents, cfg.fleet_min_hosts)
    for inc in incidents:  # a process that crashed matters when it is a rank
        if inc.kind == "segfault" and place.ranks_for(inc.host, None, inc.ranks_pid):
            inc.level = max_level(inc.level, "WARNING")
    findings = [to_finding(inc, cfg, place) for inc in incidents if LEVELS[inc.level] >= LEVELS["WARNING"]]
    for inc in incidents:
        if LEVELS[inc.level] < LEVELS["WARNING"]:
            benign[inc.host] = benign.get(inc.host, 0) + len(inc.events)
    # benign counts are final only now: refresh them in every finding
    return [with_benign(f, benign) for f in findings]
