"""The incidents a scenario's injected faults should produce (truth.json `incidents`).

Written from the faults the simulator injected, not from what the detectors say. Each expected
incident names its root cause (detector and culprit ranks), the consequences that must be under it,
and those that may be (a detector that fires only above its threshold).
"""

from __future__ import annotations

from typing import Any

# fault kind -> (root detector, consequences that must follow, consequences that may)
ROOTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "compute_straggler": ("straggler", (), ("busy_wait", "exposed_comm")),
    "host_straggler": ("straggler", (), ("busy_wait", "exposed_comm")),
    "collective_timeout": ("nccl_timeout", (), ("busy_wait",)),
    "net_socket": ("nccl_transport", (), ("exposed_comm", "busy_wait", "straggler")),
    "gdr_off": ("nccl_transport", (), ("exposed_comm", "busy_wait", "straggler")),
    "p2p_disabled": ("nccl_transport", (), ("exposed_comm", "busy_wait", "straggler")),
    "nccl_algo_forced": ("nccl_algorithm", (), ("exposed_comm",)),
    "nccl_proto_forced": ("nccl_algorithm", (), ("exposed_comm",)),
    "pipeline_bubbles_small_m": ("pipeline_bubble", (), ()),
    "pipeline_stage_imbalance": ("straggler", ("pipeline_bubble",), ()),
    "input_bound": ("gpu_idle", (), ()),
    "dp_not_overlapped": ("exposed_comm", (), ()),
    "async_tp_serialized": ("exposed_comm", (), ()),
    "slow_nic": ("slow_link", (), ("exposed_comm", "busy_wait")),
    "xid": ("gpu_hw_error", (), ("busy_wait", "straggler")),
    "aer_fatal": ("gpu_hw_error", (), ("busy_wait", "straggler")),
    "gpu_init_failed": ("gpu_hw_error", (), ()),
    "oom_kill": ("node_health", (), ("busy_wait", "straggler")),
    "node_shutdown": ("node_health", (), ("busy_wait", "straggler")),
    "app_death": ("last_words", (), ("busy_wait", "straggler")),
    "scheduler_stop": ("last_words", (), ()),
}
# faults that stop their rank: a collective timeout on that rank is their consequence, not an incident of its own
_KILLERS = ("xid", "aer_fatal", "oom_kill", "node_shutdown", "app_death")
# the root finding's category where the fault kind fixes it
CATEGORY = {"aer_fatal": "aer", "gpu_init_failed": "gpu_init_failed", "node_shutdown": "shutdown"}


def expected_incidents(faults: list[dict[str, Any]], kernel_log: str = "benign") -> list[dict[str, Any]]:
    """One expected incident per independent fault; a GPU fault or an OOM kill absorbs the timeout on its own
    rank, CPU thermal throttling written to the straggler's node (kernel log `throttle`) is its root cause, and
    the NIC link flap written to the slow NIC's node (kernel log `link_flap`) is the slow link's."""
    xid_ranks = {r for f in faults if f["kind"] in _KILLERS for r in f["ranks"]}
    out: list[dict[str, Any]] = []
    for f in faults:
        if f["kind"] not in ROOTS:
            continue  # a fault with no incident of its own
        if f["kind"] == "collective_timeout" and set(f["ranks"]) <= xid_ranks:
            continue  # the Xid on that rank's GPU is the root cause; the timeout is its consequence
        root, must, may = ROOTS[f["kind"]]
        hangs = [g for g in faults if g["kind"] == "collective_timeout" and set(g["ranks"]) & set(f.get("ranks") or ())]
        if f["kind"] in _KILLERS and f["ranks"] and hangs:
            must, may = ("nccl_timeout", "busy_wait"), ("straggler",)
            if any(g.get("params", g).get("host_hang_ms") for g in hangs):
                # the faulted rank's host blocked on its lost GPU: that GPU's idle is the fault's, not a slowdown
                must += ("gpu_idle",)
            if any(g.get("params", g).get("ends") == "comm_error" for g in hangs):
                # the peers' NCCL errors out at once: a communication failure, no watchdog timeout
                must, may = ("nccl_comm_failure",), ("busy_wait", "straggler")
        if f["kind"] == "app_death" and kernel_log == "xid31":
            must = (*must, "gpu_hw_error")  # the application's Xid is the same incident
        host_cause = {("host_straggler", "throttle"): ("cpu_thermal", "straggler"),
                      ("slow_nic", "link_flap"): ("nic_link", "slow_link")}
        if (f["kind"], kernel_log) in host_cause:
            category, consequence = host_cause[(f["kind"], kernel_log)]
            out.append({"root": {"detector": "node_health", "ranks": [], "category": category},
                        "consequences": [consequence], "may_include": list(may), "fatal": False})
            continue
        cat = {"category": CATEGORY[f["kind"]]} if f["kind"] in CATEGORY else {}
        out.append({"root": {"detector": root, "ranks": sorted(f.get("ranks") or []), **cat},
                    "consequences": list(must), "may_include": list(may),
                    "fatal": bool({"nccl_timeout", "nccl_comm_failure"} & {root, *must})})
    return out
