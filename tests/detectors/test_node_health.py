"""node_health: host-side faults from kernel logs. Triggers (one finding per host episode, severity by
consequence, joined to the job's hosts, ranks and profiled window), clean logs and the skip. The real
samples (EDAC UE, CPU throttling, OOM, lockups, IB port at boot) are in tests/test_kernel_log_facts.py."""

from __future__ import annotations

import polars as pl

from forensics.base.findings import Severity
from forensics.base.frames import JobFrames
from forensics.detectors import run_detectors
from forensics.facts.context import JobContext
from tests.kernlog_helpers import T0, detect, kernel_frame
from tests.kernlog_helpers import journal as _log

S = 10**9


def _kernel(text: str, source: str = "logs/kern.log") -> pl.DataFrame:
    return kernel_frame(text, source)


def _ranks(rows: list[tuple[int, str, int]]) -> pl.DataFrame:
    return pl.DataFrame([{"rank": r, "host": h, "pid": p} for r, h, p in rows], schema_overrides={"rank": pl.Int32})


def _nh(text: str, ranks: pl.DataFrame | None = None, source: str = "logs/kern.log", **settings: str):
    frames = {"kernel_events": _kernel(text, source)} | ({"ranks": ranks} if ranks is not None else {})
    return detect(frames, "node_health", **settings)


def _one(findings, category: str):
    hits = [f for f in findings if f.metrics["category"] == category]
    assert len(hits) == 1, [(f.title, f.metrics["category"]) for f in findings]
    return hits[0]


# --- triggers ------------------------------------------------------------------------------------


def test_triggers_hung_task_in_gpfs_names_the_storage_client_and_is_not_a_gpu_finding():
    text = (
        "[2000.0] INFO: task python:4242 blocked for more than 120 seconds.\n"
        "[2000.1] Call Trace:\n"
        "[2000.1]  cxiWaitEventWait+0x1f0/0x2d0 [mmfslinux]\n"
        "[2000.1]  _ZN6ThCond12internalWaitEP16KernelSynchStatejPv+0x5a/0x2a0 [mmfs26]\n"
    )
    (x,) = _nh(text)
    assert x.detector == "node_health" and x.gpus == () and x.severity is Severity.WARNING  # 120 s < 600 s
    assert x.metrics["storage_client"] == "mmfslinux" and x.metrics["stack_modules"] == "mmfslinux,mmfs26"
    assert x.metrics["actions"] == "INVESTIGATE_STORAGE" and x.metrics["blocked_s"] == 120.0
    assert x.metrics["training_process_blocked"] is True and x.metrics["first_mono_s"] == 2000.0
    assert detect({"kernel_events": _kernel(text)}) == []  # gpu_hw_error: not a GPU fault


def test_triggers_hung_task_whose_stack_is_folded_into_the_report_by_a_stampless_syslog():
    text = ("Mar  1 10:00:00 n1 kernel: INFO: task python3:4242 blocked for more than 120 seconds.\n"
            "      Not tainted 5.15.0 #1\n"
            "  nfs_wait_bit_killable+0x1e/0x90 [nfs]\n"
            "  rpc_wait_bit_killable+0x1e/0x90 [sunrpc]\n"
            "Mar  1 10:00:05 n1 kernel: INFO: task jbd2/sda1-8:412 blocked for more than 120 seconds.\n")
    (x,) = _nh(text, source="n1/kern.log")  # two reports 5 s apart on one host: one episode
    assert x.metrics["storage_client"] == "nfs" and x.metrics["stack_modules"] == "nfs,sunrpc"
    assert x.metrics["processes"] == "python3,jbd2/sda1-8" and x.metrics["events"] == 2 and x.hosts == ("n1",)


def test_triggers_lustre_hang_of_the_trainer_long_enough_to_trip_nccl_is_critical():
    # the kernel re-reports the same task every 120 s: 4 reports span 360 s + the first 120 s = 480 s
    lines = [("n3", 120.0 * i, f"INFO: task pt_main_thread:777 blocked for more than {120 * (i + 1)} seconds.")
             for i in range(4)]
    lines += [("n3", 120.0 * i + 0.1, "  ll_file_io_generic+0x2a0/0x5e0 [lustre]") for i in range(4)]
    text = _log(sorted(lines, key=lambda r: r[1]))
    (x,) = _nh(text, _ranks([(3, "n3", 777), (2, "n3", 776)]))
    assert x.metrics["blocked_s"] == 480.0 and x.severity is Severity.WARNING  # below hung_critical_s = 600
    assert x.ranks == (3,) and x.metrics["storage_client"] == "lustre"
    (y,) = _nh(text, _ranks([(3, "n3", 777)]), hung_critical_s="480")
    assert y.severity is Severity.CRITICAL and y.hosts == ("n3",)
    assert y.metrics["first_wall_ns"] == T0 and y.metrics["last_wall_ns"] == T0 + 360 * S


def test_triggers_edac_ce_rate_info_below_and_warning_above_ue_critical():
    burst = [("n1", 10.0 + i, "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 "
              "(channel:1 slot:0 page:0x1 offset:0x0 grain:32 syndrome:0x0)") for i in range(12)]
    (ce,) = _nh(_log(burst))
    # 12 CEs within a minute: the rate is counted over at least one hour -> 12/h >= 10/h
    assert ce.severity is Severity.WARNING and ce.metrics["ce_count"] == 12 and ce.metrics["ce_per_hour"] == 12.0
    assert ce.metrics["dimm"] == "CPU_SrcID#0_MC#0_Chan#1_DIMM#0" and ce.metrics["ue_count"] == 0
    # "3 CE" every hour for 4 h (a 1 h gap keeps it one episode): 15 CEs / 4 h = 3.75/h
    slow = [("n1", 3600.0 * h,
             "EDAC MC0: 3 CE memory read error on DIMM_A1 (channel:0 slot:0 page:0x2)") for h in range(5)]
    (x,) = _nh(_log(slow), incident_gap_s="3600")
    assert x.metrics["ce_count"] == 15 and x.metrics["ce_per_hour"] == 3.75 and x.severity is Severity.INFO
    assert _one(_nh(_log(slow), incident_gap_s="3600", ce_warning_per_hour="3.5"), "edac").severity is Severity.WARNING
    ue = [("n1", 5.0, "EDAC MC1: 1 UE memory read error on DIMM_B2 (channel:2 slot:0 page:0x3)")]
    (u,) = _nh(_log(ue))
    assert u.severity is Severity.CRITICAL and u.confidence == "high" and "DRAIN_NODE" in u.metrics["actions"]


def test_triggers_oom_kill_of_a_rank_is_critical_and_names_the_rank():
    text = _log([
        ("n2", 50.0,
         "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0"),
        ("n2", 50.1, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=job1,mems_allowed=0-1,"
                     "oom_memcg=/slurm/uid_1000/job_1,task_memcg=/slurm/uid_1000/job_1/step_0,task=python3,pid=3001,uid"
                     "=1000"),
        ("n2", 50.1, "Memory cgroup out of memory: Killed process 3001 (python3) total-vm:98765432kB, "
                     "anon-rss:41943040kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:100kB oom_score_adj:0"),
        ("n2", 50.4, "oom_reaper: reaped process 3001 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB"),
    ])
    (x,) = _nh(text, _ranks([(0, "n1", 2000), (6, "n2", 3001), (7, "n2", 3002)]))
    assert x.severity is Severity.CRITICAL and x.ranks == (6,) and x.hosts == ("n2",)
    assert x.metrics["pid"] == 3001 and x.metrics["anon_rss_gb"] == 40.0
    assert x.metrics["constraint"] == "CONSTRAINT_MEMCG"
    assert x.metrics["fault_wall_ns"] == T0 + 50 * S and x.metrics["events"] == 4
    assert x.metrics["ranks_on_host"] == "6,7" and "cgroup OOM" in x.remediation
    # a python3 victim with no rank known is still the trainer by its name
    (y,) = _nh(text)
    assert y.severity is Severity.CRITICAL and y.ranks == () and y.metrics["training_process"] is True
    (z,) = _nh(text, trainer_processes="^torchrun$")
    assert z.severity is Severity.WARNING


def test_triggers_filesystem_read_only_is_critical_io_errors_a_warning():
    text = _log([
        ("n1", 1.0,
         "blk_update_request: I/O error, dev sdb, sector 2048 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0"),
        ("n1", 1.5, "Buffer I/O error on dev sdb, logical block 256, lost async page write"),
        ("n1", 2.0, "EXT4-fs error (device sda1): ext4_journal_check_start:83: comm python3: Detected aborted journal"),
        ("n1", 2.1, "EXT4-fs (sda1): Remounting filesystem read-only"),
    ])
    found = _nh(text)
    by_dev = {f.metrics["device"]: f for f in found}
    assert set(by_dev) == {"sdb", "sda1"}
    assert by_dev["sda1"].severity is Severity.CRITICAL and by_dev["sda1"].metrics["read_only_or_shutdown"] is True
    assert by_dev["sda1"].metrics["filesystem"] == "EXT4-fs" and by_dev["sda1"].metrics["events"] == 2
    assert by_dev["sdb"].severity is Severity.WARNING and by_dev["sdb"].metrics["events"] == 2


def test_triggers_nic_link_flaps_and_a_link_left_down():
    text = _log([
        ("n4", 0.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT"),
        ("n4", 1.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE"),
        ("n4", 500.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN"),
        ("n4", 502.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE"),
        ("n4", 600.0, "ixgbe 0000:01:00.0 eth0: NIC Link is Up 10 Gbps, Flow Control: RX/TX"),
        ("n4", 700.0, "ixgbe 0000:01:00.0 eth0: NIC Link is Down"),
        ("n4", 701.0, "veth3f2a1b0: Lost carrier"),
        ("n4", 702.0, "veth3f2a1b0: Gained carrier"),
        ("n4", 703.0, "veth3f2a1b0: Lost carrier"),
    ])
    found = _nh(text)
    by_dev = {f.metrics["device"]: f for f in found}
    assert set(by_dev) == {"mlx5_5 port 1", "eth0"}  # veth is a container interface, not a NIC
    ib = by_dev["mlx5_5 port 1"]
    assert ib.severity is Severity.WARNING and ib.metrics["flaps"] == 1 and ib.metrics["last_state"] == "ACTIVE"
    assert ib.metrics["bus_id"] == "0000:ab:00.0" and ib.metrics["first_wall_ns"] == T0 + 500 * S
    eth = by_dev["eth0"]
    assert eth.severity is Severity.CRITICAL and eth.metrics["last_state"] == "DOWN"
    assert _nh(text, link_flap_min="2") == [eth]  # the IB port flapped once; eth0 once and stayed down: below 2


def test_triggers_nfs_server_not_responding_and_rcu_stall():
    text = _log([
        ("n5", 10.0, "nfs: server filer01 not responding, still trying"),
        ("n5", 70.0, "nfs: server filer01 OK"),
        ("n5", 80.0, "rcu: INFO: rcu_sched self-detected stall on CPU"),
    ])
    found = _nh(text)
    nfs, rcu = _one(found, "storage"), _one(found, "lockup")
    assert nfs.severity is Severity.WARNING and nfs.metrics["server"] == "filer01" and nfs.metrics["recovered"] is True
    assert rcu.severity is Severity.WARNING and rcu.metrics["rcu_stall"] == 1 and rcu.metrics["soft_lockup"] == 0


def test_triggers_host_from_the_file_path_and_place_on_the_profiled_window():
    text = "[  10.0] INFO: task jbd2/sda1-8:412 blocked for more than 120 seconds.\n"
    ranks = _ranks([(0, "node01", 11), (1, "node02", 12)])
    (x,) = _nh(text, ranks, source="node02/dmesg.txt")
    assert x.hosts == ("node02",) and x.ranks == () and x.metrics["ranks_on_host"] == "1"
    assert x.metrics["time_placed"] is False and "not placed on the job timeline" in x.summary
    steps = pl.DataFrame({"rank": [1], "host": ["node02"], "step": [1], "start_ns": [T0], "end_ns": [T0 + 100 * S]},
                         schema_overrides={"rank": pl.Int32})
    lines = _log([("node02", 40.0, "INFO: task jbd2/sda1-8:412 blocked for more than 120 seconds.")])
    (y,) = detect({"kernel_events": _kernel(lines), "ranks": ranks, "steps": steps}, "node_health")
    assert y.metrics["in_profiled_window"] is True and y.metrics["seconds_from_profile_end"] == -60.0


# --- clean ---------------------------------------------------------------------------------------


def test_clean_boot_noise_and_recoveries_make_no_finding():
    text = _log([
        ("n1", 0.0, "Linux version 6.5.0 (build@host) #1 SMP"),
        ("n1", 1.0, "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Opts: (null)"),
        ("n1", 2.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT"),
        ("n1", 3.0, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE"),
        ("n1", 3.5, "ixgbe 0000:01:00.0 eth0: NIC Link is Up 10 Gbps, Flow Control: RX/TX"),
        ("n1", 4.0, "docker0: Gained carrier"),
        ("n1", 5.0, "CPU3: Package temperature/speed normal"),
        ("n1", 6.0,
         "mlx5_core 0000:ab:00.0: mlx5_pcie_event:301:(pid 1): PCIe slot advertised sufficient power (27W)."),
        ("n1", 7.0, "nfs: server filer01 OK"),
        ("n1", 8.0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."),
    ])
    assert _nh(text, _ranks([(0, "n1", 1)])) == []


# --- skip ----------------------------------------------------------------------------------------


def test_skipped_without_kernel_logs():
    findings, skipped = run_detectors(JobContext(JobFrames({})), only=["node_health"])
    assert findings == [] and len(skipped) == 1 and "kernel_events" in skipped[0].reason
