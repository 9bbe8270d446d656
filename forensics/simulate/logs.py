"""Per-rank stdout (NCCL_DEBUG=INFO lines mixed with training output and PyTorch watchdog errors)
and per-node kernel logs (boot noise, benign runtime noise, injected Xid / AER / throttle / link / OOM lines).

Line grammars follow ../shared/research/nccl.md §A and dmesg.md §B and the real files in
../shared/sample_data/{nccl_logs,dmesg}. Every injected kernel-log line is listed in truth.json."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

from forensics.simulate.kineto import EPOCH_NS
from forensics.simulate.model import PCI_BUS_IDS, Job

NIC_BUS_IDS = ("0000:1a:00.0", "0000:3c:00.0", "0000:4d:00.0", "0000:5e:00.0",
               "0000:9c:00.0", "0000:bc:00.0", "0000:cc:00.0", "0000:dc:00.0")
ALGO_ID = {"Tree": 0, "Ring": 1}
PROTO_ID = {"LL": 0, "LL128": 1, "Simple": 2}
JOB_START_S = 150.0  # the job (and NCCL init) started this long before the profiled window
AUDIO_PCI_ID = "10de:22bb"  # the vendor:device of a GPU's HDMI audio function
RM_INIT_STATUS = "0x26:0xffff:1227"  # RmInitAdapter's (initStatus:rmStatus:line) as the driver prints it
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _ver(v: str) -> tuple[int, int, int]:
    parts = [int(x) for x in v.split(".")[:3]]
    return (parts + [0, 0, 0])[0], (parts + [0, 0, 0])[1], (parts + [0, 0, 0])[2]


def _utc(ns: int) -> time.struct_time:
    return time.gmtime(ns // 1_000_000_000)


# ------------------------------------------------------------------------------------ NCCL / stdout
class _RankLog:
    def __init__(self, host: str, pid: int, dev: int, rng: random.Random) -> None:
        self.host, self.pid, self.dev, self.rng = host, pid, dev, rng
        self.lines: list[str] = []

    def info(self, msg: str, tid: int | None = None) -> None:
        self.lines.append(f"{self.host}:{self.pid}:{tid or self.pid} [{self.dev}] NCCL INFO {msg}")

    def raw(self, line: str) -> None:
        self.lines.append(line)


def _comm_ptr(rng: random.Random) -> str:
    return f"0x{rng.randrange(0x55d000000000, 0x55dfffffffff):x}"


def _nccl_init(lg: _RankLog, job: Job, grank: int, world: int, nodes: int, local: int, ip: str, comm_id: str,
               ring: list[int], node_of: Any, is_world: bool, desc: str, rng: random.Random) -> None:
    """The INIT/ENV/NET lines one rank prints when one communicator is created (``ring``: the
    communicator's global ranks in ring order; ``grank``: this rank's global rank)."""
    rank = ring.index(grank)
    major, minor, patch = _ver(job.nccl_version)
    v = (major, minor)
    init_tid = lg.pid + 97 + rng.randrange(0, 40)
    net = job.net
    if is_world:
        _nccl_world_preamble(lg, job, v, rank, ip)
    fn = "ncclCommInitRank" if is_world else "ncclCommSplit"
    ptr = _comm_ptr(rng)
    bus = PCI_BUS_IDS[local].split(":")[1] + "000"
    bus = bus.lstrip("0") or "0"
    for k, val in job.env:
        if k in ("NCCL_ALGO", "NCCL_PROTO"):
            lg.info(f"{k} set by environment to {val}", init_tid)
    if v >= (2, 21):
        lg.info(f"{fn} comm {ptr} rank {rank} nranks {world} cudaDev {local} nvmlDev {local} busId {bus} commId "
                f"{comm_id} - Init START", init_tid)
    lg.info(f"Setting affinity for GPU {local} to {'ffffffff,00000000' if local < 4 else '00000000,ffffffff'}",
            init_tid)
    if net.inter == "IB" and nodes > 1:
        lg.info(f"NET/IB : GPU Direct RDMA {'Enabled' if net.gdr else 'Disabled'} for HCA {local} 'mlx5_{local}'",
                init_tid)
    if v >= (2, 20):
        same = [r for r in ring if node_of(r) == node_of(grank)]
        lg.info(f"comm {ptr} rank {rank} nRanks {world} nNodes {nodes} localRanks {len(same)} localRank "
                f"{same.index(grank)} MNNVL 0", init_tid)
    nch = 16 if nodes == 1 else 8
    gdr = "/GDRDMA" if net.inter == "IB" and net.gdr else ""
    _nccl_channels(lg, job, v, grank, world, local, ring, node_of, nch, init_tid)
    _nccl_init_done(lg, v, fn, ptr, rank, world, local, bus, comm_id, nch, bool(gdr or nodes == 1), init_tid, rng)


def _nccl_world_preamble(lg: _RankLog, job: Job, v: tuple[int, int], rank: int, ip: str) -> None:
    """Version, environment, plugin and network lines printed once per process (world communicator)."""
    net = job.net
    if v <= (2, 21) and rank == 0:
        lg.raw(f"NCCL version {job.nccl_version}+cuda{job.cuda_version}")
    lg.info(("Bootstrap: Using" if v >= (2, 25) else "Bootstrap : Using") + f" eth0:{ip}<0>")
    if v >= (2, 22):
        lg.info(f"NCCL version {job.nccl_version}+cuda{job.cuda_version}")
    lg.info("cudaDriverVersion 12040")
    for k, val in job.env:
        if k == "NCCL_P2P_DISABLE":
            lg.info("NCCL_P2P_LEVEL set by environment to LOC")
        elif k in ("NCCL_IB_DISABLE",):
            lg.info(f"{k} set by environment to {val}.")
    lg.info("NCCL_SOCKET_IFNAME set by environment to eth0")
    _net_plugin_lines(lg, v)
    if net.inter == "IB":
        devs = " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(8))
        lg.info(f"NET/IB : Using {devs} [RO]; OOB eth0:{ip}<0>")
        lg.info("Using network IB")
    else:
        if dict(job.env).get("NCCL_IB_DISABLE") != "1":
            lg.info("NET/IB : No device found.")
        lg.info(f"NET/Socket : Using [0]eth0:{ip}<0>")
        lg.info("Using network Socket")


def _net_plugin_lines(lg: _RankLog, v: tuple[int, int]) -> None:
    """No external net plugin: the wording changed across NCCL versions."""
    if v <= (2, 18):
        lg.info("NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared object "
                "file: No such file or directory")
        lg.info("NET/Plugin : No plugin found, using internal implementation")
    elif v <= (2, 21):
        lg.info("NET/Plugin: No plugin found (libnccl-net.so)")
        lg.info("NET/Plugin: Using internal network plugin.")
    elif v <= (2, 25):
        lg.info("NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.")
    else:
        lg.info("NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.")


def _nccl_channels(lg: _RankLog, job: Job, v: tuple[int, int], grank: int, world: int, local: int, ring: list[int],
                   node_of: Any, nch: int, init_tid: int) -> None:
    """The ring order (rank 0 only) and one connection line per channel to the next (and from an
    off-node previous) rank."""
    net = job.net
    rank = pos = ring.index(grank)
    if pos == 0:
        for ch in range(min(nch, 2)):
            if v >= (2, 23):
                w = len(str(world - 1))
                lg.info(f"Channel {ch:02d}/{nch:02d} :" + "".join(f" {i:{w}d}" for i in range(world)), init_tid)
            else:
                lg.info(f"Channel {ch:02d}/{nch:02d} :" + "".join(f" {i:3d}" for i in range(min(world, 20))), init_tid)
    lg.info("P2P Chunksize set to 524288", init_tid)
    nxt, prv = ring[(pos + 1) % len(ring)], ring[(pos - 1) % len(ring)]
    gdr = "/GDRDMA" if net.inter == "IB" and net.gdr else ""
    netname = "IB" if net.inter == "IB" else "Socket"
    intra = ("P2P/CUMEM/read" if v >= (2, 19) else "P2P/IPC/read") if net.intra == "P2P" else "SHM/direct/direct"
    if world > 1:
        for ch in range(nch):
            if node_of(grank) == node_of(nxt):
                lg.info(f"Channel {ch:02d}/0 : {rank}[{local}] -> {ring.index(nxt)}[{nxt % 8}] via {intra}", init_tid)
            else:
                nic = local if netname == "IB" else 0
                lg.info(f"Channel {ch:02d}/0 : {rank}[{local}] -> {ring.index(nxt)}[{nxt % 8}] [send] via "
                        f"NET/{netname}/{nic}{gdr}", init_tid)
        if node_of(prv) != node_of(grank):
            for ch in range(nch):
                nic = local if netname == "IB" else 0
                lg.info(f"Channel {ch:02d}/0 : {ring.index(prv)}[{prv % 8}] -> {rank}[{local}] [receive] via "
                        f"NET/{netname}/{nic}{gdr}", init_tid)


def _nccl_init_done(lg: _RankLog, v: tuple[int, int], fn: str, ptr: str, rank: int, world: int, local: int, bus: str,
                    comm_id: str, nch: int, gdr_used: bool, init_tid: int, rng: random.Random) -> None:
    """Connected / channel summary / Init COMPLETE / timings lines."""
    if v >= (2, 24):
        lg.info(f"Connected all rings, use ring PXN 0 GDR {1 if gdr_used else 0}", init_tid)
    else:
        lg.info("Connected all rings", init_tid)
    lg.info("Connected all trees", init_tid)
    lg.info(f"threadThresholds 8/8/64 | {8 * world}/8/64 | 512 | 512", init_tid)
    if v >= (2, 20):
        lg.info(f"{nch} coll channels, {nch} collnet channels, 0 nvls channels, {nch} p2p channels, 2 p2p channels per "
                f"peer", init_tid)
    else:
        lg.info(f"{nch} coll channels, 0 nvls channels, {nch} p2p channels, 2 p2p channels per peer", init_tid)
    if v >= (2, 24):
        lg.info("CC Off, workFifoBytes 1048576", init_tid)
    lg.info(f"{fn} comm {ptr} rank {rank} nranks {world} cudaDev {local} nvmlDev {local} busId {bus} commId {comm_id} "
            f"- Init COMPLETE", init_tid)
    if v >= (2, 23):
        tot = 0.4 + rng.random() * 0.6
        lg.info(f"Init timings - {fn}: rank {rank} nranks {world} total {tot:.2f} (kernels 0.15, alloc 0.02, bootstrap "
                f"{tot * 0.2:.2f}, "
                f"allgathers 0.01, topo {tot * 0.3:.2f}, graphs 0.01, connections {tot * 0.2:.2f}, rest 0.01)",
                init_tid)


def _tuning_line(job: Job, coll: dict[str, Any]) -> str:
    major, minor, _ = _ver(job.nccl_version)
    v = (major, minor)
    name = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter"}.get(coll["op"],
                                                                                                       "AllReduce")
    nbytes = coll["nbytes"]
    algo, proto = coll["algo"], coll["proto"]
    t = coll["t_us"]
    if v >= (2, 24):
        return f"{name}: {nbytes} Bytes -> Algo {algo} proto {proto} channel{{Lo..Hi}}={{0..{coll['channels'] - 1}}}"
    if v >= (2, 23):
        return f"{name}: {nbytes} Bytes -> Algo {ALGO_ID[algo]} proto {PROTO_ID[proto]} time {t:.6f}"
    return f"{nbytes} Bytes -> Algo {ALGO_ID[algo]} proto {PROTO_ID[proto]} time {t:.6f}"


def _pt_stamp(ns: int) -> str:
    tm = _utc(ns)
    return f"{tm.tm_mon:02d}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{ns % 1_000_000_000:09d}"


def write_stdout_logs(out: Path, job: Job, engine: Any, offsets: list[int], seed: int, timeout: dict[str, Any] | None,
                      step_log: dict[int, list[tuple[int, int, int]]], coll_log: list[dict[str, Any]]) -> dict[int,
                                                                                                               str]:
    """One stdout file per rank; returns rank -> relative path."""
    topo = job.topo
    (out / "logs").mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:logs")
    width = len(str(topo.world - 1))
    ips = [f"10.{rng.randrange(1, 250)}.{rng.randrange(1, 250)}.{10 + n}" for n in range(topo.nodes)]
    comm_ids = {g.name: f"0x{rng.getrandbits(64):016x}" for g in engine.groups}
    paths: dict[int, str] = {}
    start_ns = EPOCH_NS - int(JOB_START_S * 1e9)
    for st in engine.states:
        r = st.rank
        lrng = random.Random(f"{seed}:log:{r}")
        lg = _RankLog(st.host, st.pid, st.local, lrng)
        tp_r, dp_r, pp_r = topo.coords(r)
        if r == 0:
            lg.raw(f"using world size: {topo.world}, data-parallel size: {topo.dp}, context-parallel size: 1, "
                   f"tensor-model-parallel size: {topo.tp}, pipeline-model-parallel size: {topo.pp}")
            lg.raw("> initializing torch distributed ...")
        lg.raw(f"[rank{r}]: > setting device to cuda:{st.local} (local rank {st.local}, node {st.node}, host "
               f"{st.host})")
        for g in engine.groups:
            if r not in g.ranks or len(g.ranks) < 2:
                continue
            _nccl_init(lg, job, r, len(g.ranks), len({topo.node_of(x) for x in g.ranks}), st.local,
                       ips[st.node], comm_ids[g.name], list(g.ranks), topo.node_of, g.kind == "world", g.desc, lrng)
        if r == 0:
            lg.raw(f"[after model, optimizer, and learning rate scheduler are built] datetime: "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', _utc(start_ns + 60_000_000_000))}")
            lg.raw("training ...")
        # per-operation TUNING lines exist at INFO level from NCCL 2.20 (commented out before)
        tunings = [c for c in coll_log
                   if c["rank0"] == r] if job.tuning_lines and _ver(job.nccl_version)[:2] >= (2, 20) else []
        ti = 0
        prints_loss = (r == 0) or (topo.pp > 1 and pp_r == topo.pp - 1 and tp_r == 0 and dp_r == 0)
        for step, s0, s1 in step_log[r]:
            while ti < len(tunings) and tunings[ti]["step"] <= step:
                lg.info(_tuning_line(job, tunings[ti]))
                ti += 1
            if prints_loss:
                wall = EPOCH_NS + offsets[st.node] + s1
                loss = 2.2 + 1.5 * (0.995 ** step) + lrng.uniform(-0.02, 0.02)
                lg.raw(f" [{time.strftime('%Y-%m-%d %H:%M:%S', _utc(wall))}] iteration {step:8d}/  100000 | consumed "
                       f"samples: {step * 256:10d} | "
                       f"elapsed time per iteration (ms): {(s1 - s0) / 1e6:.1f} | learning rate: 3.000000E-04 | global "
                       f"batch size: 256 | "
                       f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {0.8 + lrng.random() * 0.4:.3f} | number "
                       f"of skipped iterations:   0 | number of nan iterations:   0 |")
                _checkpoint_line(lg, r, timeout, step, wall)
        if timeout is not None and r in timeout["arrive"]:
            _end_lines(lg, r, timeout, EPOCH_NS + offsets[st.node], lrng, engine, ips)
        name = f"logs/rank{r:0{width}d}.out"
        (out / name).write_text("\n".join(lg.lines) + "\n", encoding="utf-8")
        paths[r] = name
    return paths


def _checkpoint_line(lg: _RankLog, r: int, timeout: dict[str, Any] | None, step: int, wall: int) -> None:
    """Rank 0 of a job that will time out: one timed Megatron-style checkpoint save after its first step;
    its wall time (whole seconds, as written) goes into ``timeout`` for the truth."""
    if r != 0 or timeout is None or "checkpoint_wall_ns" in timeout or step >= timeout["step"]:
        return
    t = wall // 1_000_000_000 * 1_000_000_000  # the stamp has whole seconds: never after the step it follows
    lg.raw(f" [{time.strftime('%Y-%m-%d %H:%M:%S', _utc(t))}] saving checkpoint at iteration {step:8d} to "
           f"/checkpoints/job in torch format")
    timeout["checkpoint_wall_ns"] = t
    timeout["checkpoint_iteration"] = step


def _watchdog_lines(lg: _RankLog, r: int, timeout: dict[str, Any], wall0: int, lrng: random.Random) -> None:
    """PyTorch's watchdog lines on a rank that reached the collective that timed out (``wall0``: the
    node's wall clock at engine time 0)."""
    c = timeout["coll"]
    tmo_ms = int(timeout["timeout_ms"])
    rel = c.pg.ranks.index(r) if r in c.pg.ranks else r
    t_fire = wall0 + timeout["launch"][r] + tmo_ms * 1_000_000 + lrng.randrange(5, 40) * 1_000_000
    ran = tmo_ms + lrng.randrange(0, 40)
    optype = {"allreduce": "ALLREDUCE", "allgather": "_ALLGATHER_BASE", "reduce_scatter": "_REDUCE_SCATTER_BASE"}[c.op]
    work = (f"WorkNCCL(SeqNum={c.seq}, OpType={optype}, NumelIn={timeout['numel_in']}, "
            f"NumelOut={timeout['numel_out']}, "
            f"Timeout(ms)={tmo_ms})")
    pgtag = f"[PG ID {c.pg.name} PG GUID {c.pg.name}({c.pg.desc}) Rank {rel}]"
    lg.raw(f"[rank{r}]:[E{_pt_stamp(t_fire)} ProcessGroupNCCL.cpp:632] [Rank {rel}] Watchdog caught collective "
           f"operation timeout: {work} ran for {ran} milliseconds before timing out.")
    t2 = t_fire + lrng.randrange(100_000, 2_000_000)
    lg.raw(f"[rank{r}]:[E{_pt_stamp(t2)} ProcessGroupNCCL.cpp:1664] {pgtag} Exception (either an error or timeout) "
           f"detected by watchdog at work: {c.seq}, last enqueued NCCL work: {c.seq}, last completed NCCL work: "
           f"{c.seq - 1}.")
    lg.raw(f"[rank{r}]:[E{_pt_stamp(t2 + 60_000)} ProcessGroupNCCL.cpp:1708] {pgtag} Timeout at NCCL work: {c.seq}, "
           f"last enqueued NCCL work: {c.seq}, last completed NCCL work: {c.seq - 1}.")
    lg.raw(f"[rank{r}]:[E{_pt_stamp(t2 + 90_000)} ProcessGroupNCCL.cpp:618] [Rank {rel}] Some NCCL operations have "
           f"failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run "
           f"on corrupted/incomplete data.")
    lg.raw(f"[rank{r}]:[E{_pt_stamp(t2 + 110_000)} ProcessGroupNCCL.cpp:624] [Rank {rel}] To avoid data inconsistency, "
           f"we are taking the entire process down.")
    lg.raw(f"[rank{r}]:[F{_pt_stamp(t2 + 200_000)} ProcessGroupNCCL.cpp:1484] [PG ID {c.pg.name} PG GUID "
           f"{c.pg.name}({c.pg.desc}) Rank {rel}] "
           f"[PG ID {c.pg.name} PG GUID {c.pg.name}({c.pg.desc}) Rank {rel}] Terminating the process after attempting "
           f"to dump debug info, due to collective timeout or exception.")
    lg.raw("terminate called after throwing an instance of 'c10::DistBackendError'")


def _end_lines(lg: _RankLog, r: int, timeout: dict[str, Any], wall0: int, lrng: random.Random, engine: Any,
               ips: list[str]) -> None:
    """How a rank that reached the hung collective ends: NCCL's immediate error (the peer's process is gone and
    its connection closed) or PyTorch's watchdog timeout."""
    if timeout.get("ends") == "comm_error":
        peer = engine.states[min(timeout["coll"].absent)]
        _comm_error_lines(lg, r, timeout, wall0, lrng, ips[peer.node])
    else:
        _watchdog_lines(lg, r, timeout, wall0, lrng)


def _comm_error_lines(lg: _RankLog, r: int, timeout: dict[str, Any], wall0: int, lrng: random.Random,
                      peer_ip: str) -> None:
    """NCCL's immediate error on a rank whose peer process died in the collective (#28): the socket closed
    by the peer (2.26+ `[date time]` WARN prefix), the ncclRemoteError trail, PyTorch's C++ error line."""
    t = wall0 + timeout["launch"][r] + lrng.randrange(1_000, 4_000) * 1_000_000
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", _utc(t))
    tid = lg.pid + 7
    lg.raw(f"[{stamp}] {lg.host}:{lg.pid}:{tid} [{lg.dev}] misc/socket.cc:50 NCCL WARN socketProgress: Connection "
           f"closed by remote peer {peer_ip}<{lrng.randrange(30000, 60000)}>")
    lg.info("misc/socket.cc:752 -> 6", tid)
    lg.info("transport/net_socket.cc:474 -> 6", tid)
    lg.info("proxy.cc:925 -> 6", tid)
    c = timeout["coll"]
    lg.raw(f"[rank{r}]:[E{_pt_stamp(t + 50_000_000)} ProcessGroupNCCL.cpp:1895] [PG ID {c.pg.name} PG GUID "
           f"{c.pg.name}({c.pg.desc}) Rank {r}] Process group watcher thrown an exception: NCCL error in: "
           "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027, remote process exited or there was a "
           "network error, NCCL version 2.26.2")


# ------------------------------------------------------------------------------------ kernel logs
STYLES = ("monotonic", "ctime", "syslog", "iso")
STYLE_FILE = {"monotonic": "dmesg.log", "ctime": "dmesg-T.log", "syslog": "kern.log", "iso": "dmesg-iso.log"}


class _KLog:
    def __init__(self, host: str, style: str, boot_ns: int) -> None:
        self.host, self.style, self.boot_ns = host, style, boot_ns
        self.lines: list[tuple[int, int, str]] = []

    def stamp(self, wall_ns: int) -> str:
        mono = (wall_ns - self.boot_ns) / 1e9
        if self.style == "monotonic":
            return f"[{mono:12.6f}] "
        tm = _utc(wall_ns)
        if self.style == "ctime":
            return (f"[{DAYS[tm.tm_wday]} {MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} "
                    f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} {tm.tm_year}] ")
        if self.style == "syslog":
            return (f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} "
                    f"{self.host} kernel: [{mono:12.6f}] ")
        return f"{time.strftime('%Y-%m-%dT%H:%M:%S', tm)},{(wall_ns // 1000) % 1_000_000:06d}+00:00 "

    def add(self, wall_ns: int, msg: str) -> tuple[int, int]:
        key = (wall_ns, len(self.lines))
        self.lines.append((wall_ns, key[1], self.stamp(wall_ns) + msg))
        return key

    def text(self) -> tuple[str, dict[tuple[int, int], int]]:
        """The log in time order, and each added line's 1-based line number."""
        ordered = sorted(self.lines)
        return "\n".join(line for _, _, line in ordered) + "\n", {(t, i): n + 1 for n, (t, i, _) in enumerate(ordered)}


def _boot_noise(k: _KLog, rng: random.Random, gdr: bool, audio: str | None = None) -> None:
    """Boot lines; ``audio``: the HDMI audio function of a GPU, enumerated right after the GPU's own line."""
    t = k.boot_ns
    msgs = [
        "Linux version 5.15.0-105-generic (buildd@lcy02-amd64-007) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld "
        "(GNU Binutils for Ubuntu) 2.38) #115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024 (Ubuntu 5.15.0-105.115-generic "
        "5.15.152)",
        "Command line: BOOT_IMAGE=/boot/vmlinuz-5.15.0-105-generic root=UUID=4f1c2a9e-7d0b-4c4e-9a51-0e5d3c2b1a90 ro "
        "pci=realloc=off iommu=pt",
        "ACPI: RSDP 0x00000000000F05B0 000024 (v02 DELL  )",
        "smpboot: CPU0: Intel(R) Xeon(R) Platinum 8480+ (family: 0x6, model: 0x8f, stepping: 0x8)",
        "Memory: 2113498212K/2147036084K available (16393K kernel code, 4397K rwdata, 10828K rodata, 3248K init, 6104K "
        "bss, 33537872K reserved, 0K cma-reserved)",
    ]
    for b in PCI_BUS_IDS:
        msgs.append(f"pci {b}: [10de:2330] type 00 class 0x030200")
        if audio is not None and audio[:-1] == b[:-1]:
            msgs.append(f"pci {audio}: [{AUDIO_PCI_ID}] type 00 class 0x040300")
    msgs += [f"pci {b}: [15b3:1021] type 00 class 0x020700" for b in NIC_BUS_IDS]
    msgs += [
        "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Opts: (null). Quota mode: none.",
        "nvidia: loading out-of-tree module taints kernel.",
        "nvidia: module license 'NVIDIA' taints kernel.",
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 508",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
        "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.54.15  Tue Mar  5 22:11:07 "
        "UTC 2024",
        "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from proprietary module nvidia, inheriting "
        "taint.",
    ]
    if gdr:
        msgs.append("nvidia-peermem nv_peer_mem: module loaded (version 1.2)")  # absent when GDR is off
    for _i, b in enumerate(NIC_BUS_IDS):
        msgs.append(f"mlx5_core {b}: firmware version: 28.39.1002")
        msgs.append(f"mlx5_core {b}: 252.048 Gb/s available PCIe bandwidth (16.0 GT/s PCIe x16 link)")
    msgs += [f"mlx5_core {b} mlx5_{i}: Port: 1 Link ACTIVE" for i, b in enumerate(NIC_BUS_IDS)]
    msgs += ["IPv6: ADDRCONF(NETDEV_CHANGE): ibp26s0: link becomes ready",
             "nvidia-fabricmanager: NVSwitch fabric initialized"]
    for m in msgs:
        t += rng.randrange(2_000_000, 400_000_000)
        k.add(t, m)


class _Injector:
    """Adds fault lines to one node's kernel log and remembers where each went for truth.json."""

    def __init__(self, k: _KLog) -> None:
        self.k = k
        self.mine: list[tuple[tuple[int, int], dict[str, Any]]] = []

    def __call__(self, t: int, msg: str, kind: str, rank: int | None = None, gpu: str | None = None) -> None:
        # truth.json records where the line is, not its text: a JSON file quoting kernel-log lines
        # would itself be sniffed as a kernel log by `forensics analyze`
        k = self.k
        m = re.search(r"Xid \(PCI:[0-9a-f:]+\): (\d+)", msg)
        self.mine.append((k.add(t, msg),
                          {"host": k.host, "file": f"kernel/{k.host}/{STYLE_FILE[k.style]}", "kind": kind,
                                          "rank": rank, "gpu": gpu, "xid": int(m.group(1)) if m else None,
                                          "time_ns": t}))


def write_kernel_logs(out: Path, job: Job, engine: Any, offsets: list[int], seed: int, kernel_log: str,
                      end_ns: int, timeout: dict[str, Any] | None) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """One kernel log per node (style rotates per node); returns host -> path and the injected lines."""
    (out / "kernel").mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    injected: list[dict[str, Any]] = []
    culprit = next((f for f in job.faults if f["kind"] in ("xid", "aer_fatal", "compute_straggler", "host_straggler",
                                                           "oom_kill", "node_shutdown", "app_death")), None)
    for node, host in enumerate(engine.hosts):
        rng = random.Random(f"{seed}:klog:{node}")
        style = STYLES[node % len(STYLES)]
        boot = EPOCH_NS + offsets[node] - int(rng.uniform(2, 30) * 86400e9)
        k = _KLog(host, style, boot)
        st = engine.states[culprit["ranks"][0]] if culprit is not None else None
        here = st if st is not None and st.node == node else None  # the culprit rank's state on its own node
        _boot_noise(k, rng, job.net.gdr,
                    PCI_BUS_IDS[here.local][:-1] + "1" if here is not None and kernel_log == "aer_audio" else None)
        wall0 = EPOCH_NS + offsets[node]
        k.add(wall0 - int(JOB_START_S * 1e9) - 3_000_000_000,
              "perf: interrupt took too long (2503 > 2500), lowering kernel.perf_event_max_sample_rate to 79750")
        inject = _Injector(k)
        if here is not None:
            _inject_culprit(inject, kernel_log, here, wall0, end_ns, timeout, rng)
        _inject_node(inject, kernel_log, job, node, wall0)
        # benign runtime noise during the job
        k.add(wall0 + end_ns // 4,
              f"pcieport 0000:{0x16 + node % 4:02x}:01.0: AER: Corrected error received: "
              f"0000:{0x16 + node % 4:02x}:01.0")
        k.add(wall0 + end_ns // 4 + 20_000,
              f"pcieport 0000:{0x16 + node % 4:02x}:01.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
              f"(Receiver ID)")
        k.add(wall0 + end_ns // 2 + 7_000_000, "hrtimer: interrupt took 31477 ns")
        rel = f"kernel/{host}/{STYLE_FILE[style]}"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        text, line_no = k.text()
        (out / rel).write_text(text, encoding="utf-8")
        for key, rec in inject.mine:
            injected.append({**rec, "line": line_no[key]})
        paths[host] = rel
    return paths, injected


def _inject_culprit(inject: _Injector, kernel_log: str, st: Any, wall0: int, end_ns: int,
                    timeout: dict[str, Any] | None,
                    rng: random.Random) -> None:
    """The lines of the scenario's fault on the culprit rank's node (``st``: the culprit rank's state)."""
    r = st.rank
    if kernel_log.startswith("xid"):
        _inject_xid(inject, kernel_log, r, st, wall0, end_ns, timeout)
    elif kernel_log == "aer_audio":
        assert timeout is not None
        _inject_aer_audio(inject, r, PCI_BUS_IDS[st.local], wall0 + timeout["stop"][r] + 2_000_000)
    elif kernel_log == "oom":
        _inject_oom(inject, r, st.pid, wall0, timeout)
    elif kernel_log == "shutdown":
        _inject_shutdown(inject, r, wall0, timeout)
    elif kernel_log == "throttle":
        t = wall0 + end_ns // 3
        for cpu in (12, 13, 44, 45):
            inject(t + cpu * 1000,
                   f"mce: CPU{cpu}: Package temperature above threshold, cpu clock throttled (total events = "
                   f"{rng.randrange(1000, 9000)})", "cpu_throttle", r)


def _inject_node(inject: _Injector, kernel_log: str, job: Job, node: int, wall0: int) -> None:
    """The lines of a scenario's fault on a node rather than on a rank (a NIC, a GPU no rank uses)."""
    if kernel_log == "link_flap":
        slow = {n: f.get("nic", 0) for f in job.faults if f["kind"] == "slow_nic" for n in f["nodes"]}
        if node in slow:
            _inject_link_flap(inject, wall0, slow[node])
    if kernel_log == "nic_replug":
        _nic_replug(inject.k, wall0)
    if kernel_log == "rm_init":
        for f in job.faults:
            if f["kind"] == "gpu_init_failed" and f["node"] == node:
                _inject_rm_init(inject, f["gpu"], wall0)


def _nic_replug(k: _KLog, wall0: int) -> None:
    """Benign NIC lines an hour before the job (#28): each port's module detected, slot power checked, the link
    up again: the forms of real boot / re-plug logs (tests/field_excerpts.py), never a finding."""
    t = wall0 - 3600 * 1_000_000_000
    for i, b in enumerate(NIC_BUS_IDS):
        k.add(t + i * 1_000_000, f"mlx5_core {b}: Port module event: module {i}, Cable plugged")
        k.add(t + i * 1_000_000 + 1_000, f"mlx5_core {b}: mlx5_pcie_event:301:(pid 10): PCIe slot advertised "
              "sufficient power (27W).")
        k.add(t + 3_000_000_000 + i * 1_000_000, f"mlx5_core {b} mlx5_{i}: Port: 1 Link ACTIVE")


def aer_port(bus: str) -> str:
    """The PCIe port above a GPU (``bus``: its function 0) in the simulated topology."""
    return f"0000:{int(bus[5:7], 16) - 2:02x}:01.0"


def _inject_aer_audio(inject: _Injector, r: int, bus: str, t: int) -> None:
    """A fatal completion timeout that the GPU's HDMI audio function (.1) reports (Linux 5.15 wording,
    drivers/pci/pcie/aer.c and err.c): the port receives it, the audio driver prints the details, each
    function's driver says it cannot recover (neither has an error_detected callback), the port gives up."""
    port, audio = aer_port(bus), bus[:-1] + "1"
    lines = [
        f"pcieport {port}: AER: Uncorrected (Fatal) error received: {audio}",
        f"snd_hda_intel {audio}: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)",
        f"snd_hda_intel {audio}:   device [{AUDIO_PCI_ID}] error status/mask=00004000/00000000",
        f"snd_hda_intel {audio}:    [14] CmpltTO                (First)",
        f"nvidia {bus}: AER: can't recover (no error_detected callback)",
        f"snd_hda_intel {audio}: AER: can't recover (no error_detected callback)",
        f"pcieport {port}: AER: device recovery failed",
    ]
    for i, msg in enumerate(lines):
        inject(t + i * 20_000, msg, "aer_fatal", r, bus)


def _inject_rm_init(inject: _Injector, gpu: int, wall0: int) -> None:
    """GPU ``gpu`` of the node fails to initialize each time the device is opened: when
    nvidia-persistenced starts after boot, and when the job's prolog runs nvidia-smi."""
    bus = PCI_BUS_IDS[gpu]
    for t in (inject.k.boot_ns + 45_000_000_000, wall0 - int(JOB_START_S * 1e9) - 2_000_000_000):
        inject(t, f"NVRM: GPU {bus}: RmInitAdapter failed! ({RM_INIT_STATUS})", "gpu_init_failed", None, bus)
        inject(t + 30_000, f"NVRM: GPU {bus}: rm_init_adapter failed, device minor number {gpu}", "gpu_init_failed",
               None, bus)


def _inject_xid(inject: _Injector, kernel_log: str, r: int, st: Any, wall0: int, end_ns: int,
                timeout: dict[str, Any] | None) -> None:
    """The Xid scenario's lines on the culprit rank's node (``kernel_log``: xid79 / xid48 / xid94 / xid149 /
    xid63)."""
    bus = PCI_BUS_IDS[st.local]
    short = bus[:-2]
    if kernel_log == "xid79":
        assert timeout is not None
        t = wall0 + timeout["stop"][r] + 2_000_000
        port = f"0000:{int(bus[5:7], 16) - 2:02x}:01.0"
        inject(t - 900_000, f"pcieport {port}: AER: Uncorrected (Fatal) error received: {port}", "aer_fatal", r, bus)
        inject(t - 880_000,
               f"pcieport {port}: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
               "aer_fatal", r, bus)
        inject(t - 860_000, f"pcieport {port}:    [ 5] Surprise Down Error    (First)", "aer_fatal", r, bus)
        inject(t, f"NVRM: Xid (PCI:{short}): 79, pid={st.pid}, name=python3, GPU has fallen off the bus.", "xid", r,
               bus)
        inject(t + 40_000, f"NVRM: GPU {bus}: GPU has fallen off the bus.", "xid", r, bus)
        inject(t + 60_000, "NVRM: A GPU crash dump has been created. If possible, please run", "xid_continuation", r,
               bus)
    elif kernel_log == "xid48":
        t = wall0 + end_ns // 2
        inject(t,
               f"NVRM: Xid (PCI:{short}): 48, pid={st.pid}, name=python3, An uncorrectable double bit error (DBE) has "
               f"been detected on GPU in the framebuffer at physAddr 0x3f4a1b000 partition 3, subpartition 1.", "xid",
               r, bus)
        inject(t + 3_000_000,
               f"NVRM: Xid (PCI:{short}): 63, pid={st.pid}, name=python3, Row Remapper: New row (0x00000003f4a1b000) "
               f"marked for remapping, reset gpu to activate.", "xid", r, bus)
    elif kernel_log == "xid94":
        t = wall0 + end_ns // 2
        inject(t, f"NVRM: Xid (PCI:{short}): 94, pid={st.pid}, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
               "xid", r, bus)
    elif kernel_log == "xid149":
        # NVLink5 (Blackwell): the link fault, then the driver tears down the GPU's channels because of it
        t = wall0 + end_ns // 2
        inject(t, f"NVRM: Xid (PCI:{short}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 03 (0x016415c6 0x00000000 "
               "0x00000000 0x00000000 0x00000000 0x00000000)", "xid", r, bus)
        for i, ch in enumerate(("00000001", "00000002")):
            inject(t + 280_000_000 + i * 1_000_000, f"NVRM: Xid (PCI:{short}): 45, pid={st.pid}, name=python3, "
                   f"Ch {ch} caused by previous Xid 149", "xid", r, bus)
    elif kernel_log == "xid31":
        # the application's MMU fault, seen by the driver as the rank's kernel faults (its CUDA error follows)
        assert timeout is not None
        t = wall0 + timeout["stop"][r] + 500_000
        inject(t, f"NVRM: Xid (PCI:{short}): 31, pid={st.pid}, name=python3, Ch 00000008, intr 00000000. MMU Fault: "
               "ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_12345000. Fault is of type FAULT_PDE "
               "ACCESS_TYPE_VIRT_READ",
               "xid", r, bus)
    elif kernel_log == "xid63":
        t = wall0 + end_ns // 2
        inject(t,
               f"NVRM: Xid (PCI:{short}): 63, pid={st.pid}, name=python3, Row Remapper: New row (0x00000001a2b3c000) "
               f"marked for remapping, reset gpu to activate.", "xid", r, bus)


OOM_ANON_RSS_KB = 251_658_240  # 240 GiB resident: the victim's anon-rss in the OOM kill line


def _inject_oom(inject: _Injector, r: int, pid: int, wall0: int, timeout: dict[str, Any] | None) -> None:
    """The OOM killer kills rank ``r``'s process where it stopped (the all-reduce it never joins)."""
    assert timeout is not None
    t = wall0 + timeout["stop"][r] + 1_000_000
    inject(t,
           "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
           "oom", r)
    inject(t + 350_000, "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom,"
           f"task_memcg=/system.slice/slurmstepd.scope/job_4242,task=python3,pid={pid},uid=1000", "oom", r)
    inject(t + 360_000,
           f"Out of memory: Killed process {pid} (python3) total-vm:412345678kB, anon-rss:{OOM_ANON_RSS_KB}kB, "
           "file-rss:1048576kB, shmem-rss:0kB, UID:1000 pgtables:493568kB oom_score_adj:0", "oom", r)
    inject(t + 2_400_000_000,
           f"oom_reaper: reaped process {pid} (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB", "oom", r)


def _inject_shutdown(inject: _Injector, r: int, wall0: int, timeout: dict[str, Any] | None) -> None:
    """Rank ``r``'s node goes down for a reboot where the rank stopped: logind's announcement, systemd-shutdown's
    final stage and the kernel's last line, in the wording of real logs (tests/field_excerpts.py SHUTDOWN_*)."""
    assert timeout is not None
    t = wall0 + timeout["stop"][r] - 400_000_000
    inject(t, "systemd-logind[1843]: System is rebooting.", "shutdown", r)
    inject(t + 200_000_000, "systemd-shutdown[1]: Syncing filesystems and block devices.", "shutdown", r)
    inject(t + 350_000_000, "systemd-shutdown[1]: Sending SIGTERM to remaining processes...", "shutdown", r)
    inject(t + 1_900_000_000, "systemd-shutdown[1]: Sending SIGKILL to remaining processes...", "shutdown", r)
    inject(t + 2_300_000_000, "reboot: Restarting system", "shutdown", r)


def _inject_link_flap(inject: _Injector, wall0: int, index: int = 0) -> None:
    """The slow NIC (the first one when the whole node is slow) goes down and comes back at a lower PCIe
    speed before the job."""
    nic = NIC_BUS_IDS[index]
    t = wall0 - int(JOB_START_S * 1e9) + 20_000_000_000
    inject(t, f"mlx5_core {nic} mlx5_{index}: Port: 1 Link DOWN", "nic_link", None, nic)
    inject(t + 1_200_000_000, f"mlx5_core {nic} mlx5_{index}: Port: 1 Link INIT", "nic_link", None, nic)
    inject(t + 2_600_000_000, f"mlx5_core {nic} mlx5_{index}: Port: 1 Link ACTIVE", "nic_link", None, nic)
    inject(t + 2_700_000_000,
           f"mlx5_core {nic}: 63.008 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x16 link at 0000:17:00.0 "
           f"(capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)", "pcie_degraded", None, nic)
