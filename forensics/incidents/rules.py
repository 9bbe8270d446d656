"""The causal rules as data (:data:`RULES`) and the kinds they name.

A rule links a cause kind to the consequence kinds it explains when the evidence it names holds (same GPU or
rank, same host, a waiter waiting for the culprit, one communicator), in the time order it asks for, within its
window; it says what to do with a finding whose time is unknown. Kinds are what detectors declare
(:class:`forensics.base.findings.FindingKind`): a rule never names a detector, so a new detector whose findings
are of a kind a rule names is linked with no change here. docs/incidents.md's tables are generated from this
module (:func:`rules_markdown`, :func:`kinds_markdown`; ``forensics docs --check``).
"""

from __future__ import annotations

from dataclasses import dataclass

from forensics.base.findings import Finding
from forensics.detectors import declared_kinds, load_all
from forensics.detectors import kind_of as declared_kind

#: the stage of a finding whose kind no detector declares: after every declared one, so nothing links to it
UNDECLARED_STAGE = 99


def stage_of(f: Finding) -> int:
    """The stage of the kind a finding's detector declared for it (a rule links a lower stage to a higher one)."""
    kind = declared_kind(f)
    return UNDECLARED_STAGE if kind is None else kind.tier


LINKS: dict[str, str] = {
    "gpu_or_rank": "the consequence names the cause's GPU (PCI bus id) or one of its ranks",
    "waited_for": "the consequence's ranks waited for one of the cause's ranks (its typed `waited_for`), "
                  "or name the same culprit rank",
    "host": "both name the same host (a host fault explains only findings on that host)",
    "communicator": "they share a rank or a host (one communicator), or the cause is job-wide",
    "faulted_rank": "every rank of the consequence is one of the cause's ranks (or, for a cause naming a GPU but no "
                    "rank, every GPU of the consequence is the cause's): what happened on the faulted rank itself, "
                    "not on others that merely share a communicator",
    "same_job": "always (one analysis is one job): the job's first failure or its cancellation explains what came "
                "after",
    "gpu_rank_or_host": "they name the same GPU, rank or host",
}
ORDERS: dict[str, str] = {
    "cause_first": "the cause happened before the consequence ended (a fault after the timeout is not its "
                   "cause) and, with a window, started at most the window before the consequence started",
    "any": "the two describe the same period (a hang and its waiters, a setting and what it slows), so neither has "
           "to start first; but where both times are known they must overlap or the cause come first: a cause that "
           "started after its consequence ended is refused",
    "near": "the two are one event recorded twice (a CUDA error and the driver's Xid for it): their times lie "
            "within the window of each other, either first",
}
UNKNOWN_TIME: dict[str, str] = {
    "refuse": "a finding whose time is unknown is not linked",
    "place_only": "a finding whose time is unknown is linked by place alone, at low confidence, and the link says so",
    "standing": "the cause is a setting that holds for the whole run, so its own time is not asked (the link says "
                "so); a consequence whose time is unknown is not linked",
}


@dataclass(frozen=True)
class Rule:
    """One causal link: ``cause`` (detector:kind) explains ``consequence`` when ``link`` holds."""

    name: str
    causes: tuple[str, ...]
    consequences: tuple[str, ...]
    link: str
    order: str
    window_s: float | None
    confidence: str
    why: str
    unknown_time: str = "refuse"
    xids: tuple[int, ...] = ()  # when set, the consequence must report one of these Xids (its typed ``xids``)


#: Xids an application's own CUDA error makes the driver log: graphics engine exception (13), MMU fault (31), GPU
#: stopped processing (43), preemptive cleanup (45)
APP_XIDS = (13, 31, 43, 45)

RULES: tuple[Rule, ...] = (
    Rule("scheduler_stop_ends_job", ("scheduler_stop",),
         ("app_failure", "nccl_raised", "stuck_rank", "collective_mismatch", "timeout", "desync", "missing_rank",
          "cuda_failure", "transport_failure", "comm_failure", "gpu_fault", "host_fault", "platform_error", "nic_fault",
          "gpu_event", "spin_wait"),
         "same_job", "cause_first", None, "high",
         "a job the scheduler cancelled (time limit, preemption) is torn down: what fails after that is not a fault"),
    Rule("first_failure_kills_job", ("app_failure",),
         ("timeout", "desync", "missing_rank", "cuda_failure", "transport_failure", "comm_failure", "nccl_raised",
          "spin_wait", "stuck_rank", "collective_mismatch"),
         "same_job", "cause_first", None, "high",
         "the first rank to fail stops taking part: the others raise NCCL errors or time out in their next "
         "collective and spin until the watchdog", "place_only"),
    Rule("app_error_is_the_xid", ("app_failure",), ("gpu_event",), "gpu_rank_or_host", "near", 120.0, "high",
         "a GPU event (an application Xid 13, 31, 43, 45) on the rank's GPU or host at the time of its CUDA error is "
         "that error, seen by the driver: the code is at fault, not the GPU", xids=APP_XIDS),
    Rule("stuck_rank_hangs_job", ("stuck_rank",), ("timeout", "spin_wait", "nccl_raised"), "same_job", "any", None,
         "medium", "the rank whose stack is elsewhere (data loader, I/O, a lock) never reaches the collective the "
         "others wait in", "place_only"),
    Rule("gpu_fault_kills_rank", ("gpu_fault",), ("timeout", "desync", "missing_rank", "cuda_failure", "stuck_rank"),
         "gpu_or_rank", "cause_first", None, "high",
         "a GPU that fell off the bus or hit a fatal Xid stops its rank; its peers hang in NCCL until the watchdog",
         "place_only"),
    Rule("fault_idles_its_rank", ("gpu_fault", "host_fault", "timeout", "desync", "missing_rank", "cuda_failure"),
         ("idle_gpu",), "faulted_rank", "cause_first", None, "high",
         "the faulted rank's host waits on a GPU that never answers (a synchronize or .item() on the lost device), "
         "so its GPU idles from the fault on: a consequence of the fault, not a slowdown of its own", "place_only"),
    Rule("gpu_fault_stalls_peers", ("gpu_fault",), ("spin_wait", "slow_rank"),
         "waited_for", "cause_first", None, "medium",
         "peers of a failing GPU's rank spin in NCCL waiting for it"),
    Rule("host_fault_slows_or_kills", ("host_fault", "platform_error", "nic_fault"),
         ("slow_rank", "timeout", "desync", "missing_rank", "transport_failure", "stuck_rank"),
         "host", "cause_first", 3600.0, "medium",
         "a storage hang, host memory error, OOM kill or NIC fault stalls or kills the ranks on that host",
         "place_only"),
    Rule("host_fault_kills_rank", ("host_fault",),
         ("timeout", "desync", "missing_rank", "cuda_failure", "spin_wait", "stuck_rank"),
         "gpu_or_rank", "cause_first", None, "high",
         "the OOM killer or a hang stopped a rank's process; its peers wait for it in NCCL until the watchdog",
         "place_only"),
    Rule("nic_fault_slows_link", ("nic_fault",), ("slow_transfers",),
         "host", "cause_first", None, "high",
         "a NIC that flapped, fell back to a lower speed or logs errors on the host common to every slow "
         "communicator is why they are slow (a degraded link stays degraded: no time window)", "place_only"),
    Rule("fault_breaks_peer_connection", ("gpu_fault", "host_fault", "nic_fault", "cuda_failure"), ("comm_failure",),
         "host", "cause_first", 3600.0, "medium",
         "a GPU, host or NIC fault (or a CUDA error) on the peer's side (the failure names the peer's host when an "
         "address of the logs places it) or on the reporting host kills a process or link; NCCL on the other side "
         "reports the closed connection or remote error within seconds", "place_only"),
    Rule("comm_failure_raised_to_python", ("comm_failure",), ("nccl_raised",), "communicator", "cause_first", 600.0,
         "high", "the NCCL error a rank raised to Python is the communication failure NCCL logged, as PyTorch saw it: "
         "one failure, rooted at the logged error (or at what explains that)", "place_only"),
    Rule("fault_slows_collectives", ("gpu_fault", "host_fault"), ("exposed_communication", "slow_transfers"),
         "communicator", "cause_first", None, "medium",
         "a GPU or host fault on a rank (or its host) slows every communicator through it from the fault on: the "
         "links through it are slow and more of the collectives is exposed; a consequence of the fault, not a "
         "slowdown of its own"),
    Rule("missing_rank_times_out_others", ("desync", "missing_rank", "cuda_failure", "transport_failure",
                                           "stuck_rank", "collective_mismatch"),
         ("timeout",), "communicator", "any", None, "high",
         "a rank that never joins (dead, desynchronised, unreachable) makes the others' collective time out",
         "place_only"),
    Rule("hang_stalls_peers", ("timeout", "desync", "missing_rank", "stuck_rank", "collective_mismatch"),
         ("spin_wait",),
         "waited_for", "any", None, "high",
         "ranks stuck in the hung collective spin inside NCCL kernels", "place_only"),
    Rule("straggler_stalls_peers", ("slow_rank",), ("spin_wait", "exposed_communication"),
         "waited_for", "any", None, "high",
         "the peers of a slow rank wait for it inside their collectives"),
    Rule("slow_link_stalls_peers", ("slow_transfers",), ("spin_wait", "exposed_communication"),
         "communicator", "any", None, "medium",
         "every member of a communicator through a slow link waits for its transfers, so more of them is exposed"),
    Rule("slow_stage_bubbles_pipeline", ("slow_rank",), ("pipeline",),
         "waited_for", "any", None, "high",
         "a pipeline stage that computes longer than the others makes the other stages idle in the pipeline"),
    Rule("degraded_transport_slows_comm", ("degraded_transport",), ("exposed_communication", "spin_wait", "slow_rank"),
         "communicator", "any", None, "medium",
         "Socket instead of IB, GDR off or SHM/P2P off make collectives slower, so more of them is exposed",
         "standing"),
    Rule("forced_algorithm_slows_comm", ("forced_algorithm",), ("exposed_communication",),
         "communicator", "any", None, "medium",
         "a forced NCCL_ALGO / NCCL_PROTO slower than NCCL's choice makes collectives slower", "standing"),
)

def rules_markdown() -> str:
    """The rules table of docs/incidents.md, generated from :data:`RULES`."""
    lines = ["| rule | cause | consequence | linking evidence | time order | unknown time | window | confidence | why "
             "|",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in RULES:
        window = f"{r.window_s:.0f} s" if r.window_s else "-"
        lines.append(f"| `{r.name}` | {', '.join(f'`{c}`' for c in r.causes)} | "
                     f"{', '.join(f'`{c}`' for c in r.consequences)} | {r.link}: {LINKS[r.link]}{_xids(r)} | "
                     f"{r.order}: {ORDERS[r.order]} | {r.unknown_time}: {UNKNOWN_TIME[r.unknown_time]} | {window} | "
                     f"{r.confidence} | {r.why} |")
    return "\n".join(lines)


def _xids(r: Rule) -> str:
    return f"; and the consequence reports Xid {', '.join(map(str, r.xids))}" if r.xids else ""


def kinds_markdown() -> str:
    """The kinds table of docs/incidents.md, generated from the detectors' declarations."""
    registry = load_all()
    lines = ["| kind | role | stage | declared by | meaning | default remediation |", "|---|---|---|---|---|---|"]
    for name, kind in sorted(declared_kinds().items(), key=lambda kv: (kv[1].tier, kv[0])):
        by = ", ".join(f"`{d}`" for d, spec in registry.items() if any(k.name == name for k in spec.kinds))
        lines.append(f"| `{name}` | {kind.role.value} | {kind.tier} | {by} | {kind.meaning} | {kind.remediation} |")
    return "\n".join(lines)
