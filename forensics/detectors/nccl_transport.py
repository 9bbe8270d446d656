"""NCCL transport problems read from NCCL_DEBUG=INFO logs.

Its documentation (what it detects, why it matters, how it measures, what to do) is data: ``DOC``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from forensics.base.findings import Finding, FindingKind, Role, Severity
from forensics.base.settings import setting
from forensics.detectors import DetectorDoc, Skip, detector
from forensics.facts.context import JobContext
from forensics.facts.nccl_setup import JobNccl, evidence, where


@dataclass(frozen=True)
class NcclTransportConfig:
    """Thresholds of the transport checks."""

    min_gpus_per_single_nic: int = setting(4, unit="GPUs", low=1,
                                           doc="a node whose GPUs share one NIC is flagged from this many GPUs")
    bad_iface_pattern: str = setting(
        r"^(docker\d*|br-\w+|virbr\d*|veth\w*|tunl\d*|ip6tnl\d*|tun\d*|tap\d*|lo|cni\d*|flannel\S*|cali\w+)$",
        regex=True, doc="interface names that are virtual or wrong for NCCL traffic (regular expression)")
    nvls_archs: str = setting("hopper,blackwell", unit="comma-separated",
                              doc="GPU generations on which NVLS is expected when an NVSwitch is present")


@dataclass
class _Transport:
    """The frames every check reads, and the NET connections marked intra-node or not."""

    j: JobNccl
    ch: pl.DataFrame  # nccl_channels
    net: pl.DataFrame  # nccl_net
    ev: pl.DataFrame  # nccl_events
    netch: pl.DataFrame  # NET channels with `intra` (both ends in one process, or a single-node job)
    netsel: pl.DataFrame  # `Using network X` lines
    ib: pl.DataFrame  # NET/IB device lines
    env_rows: pl.DataFrame  # the user's NCCL_* settings (net plugins' own excluded), in file order
    fired: set[str] = field(default_factory=set)  # keys of the findings the checks so far raised

    def nic_facts(self, rows: pl.DataFrame, by_index: bool = False) -> pl.DataFrame:
        """The rows of NIC facts printed at init that matter: never on a single-node job; on a host whose NET
        channels are logged, only the NICs they use (``by_index``: the row's ``index`` is the NIC) or, for
        per-process facts, only that host; a host without NET channel lines keeps them (the excerpt does not say
        which NIC carried the traffic, and the job is not known to be single-node)."""
        if self.j.single_node or rows.height == 0:
            return rows.clear()
        used = self.netch.filter(~pl.col("intra")).select("host", pl.col("nic").alias("index")).unique()
        logged = used.select("host").unique()
        on_used = rows.join(used if by_index else logged, on=["host", "index"] if by_index else ["host"],
                            how="semi", nulls_equal=True)
        unlogged = rows.join(logged, on="host", how="anti", nulls_equal=True)
        return pl.concat([on_used, unlogged]).sort("line")


def _facts(ctx: JobContext) -> _Transport:
    frames = ctx.frames
    j = ctx.nccl
    ch, net, ev = frames["nccl_channels"], frames["nccl_net"], frames["nccl_events"]
    if ch.height == 0 and net.height == 0 and ev.filter(pl.col("level") != "INFO").height == 0 \
            and ev.filter(pl.col("kind").is_in(["p2p_check", "nvls_support", "channels", "connected"])).height == 0:
        raise Skip("the NCCL logs hold no transport, network or fabric lines (NCCL_DEBUG=INFO init lines needed)")
    env_rows = frames["nccl_env"].filter(pl.col("origin") != "plugin").sort("line")
    return _Transport(j, ch, net, ev, _net_channels(j, ch), net.filter(pl.col("kind") == "network"),
                      net.filter(pl.col("kind") == "ib"), env_rows)


def _net_channels(j: JobNccl, ch: pl.DataFrame) -> pl.DataFrame:
    """NET channels with ``intra``: which process owns which ranks: a NET pair inside one process is intra-node."""
    owners = j.ident.filter(pl.col("rank").is_not_null()).select("host", "pid", "rank")
    single_node = (j.nnodes == 1) if j.nnodes is not None else False
    netch = ch.filter(pl.col("transport") == "NET")
    if netch.height == 0:
        return netch.with_columns(pl.lit(False).alias("intra"))
    a = owners.rename({"rank": "src_rank", "pid": "_ps", "host": "_hs"})
    b = owners.rename({"rank": "dst_rank", "pid": "_pd", "host": "_hd"})
    joined = (netch.join(a, on="src_rank", how="left", maintain_order="left")
              .join(b, on="dst_rank", how="left", maintain_order="left"))
    return joined.with_columns(
        (pl.lit(single_node) | ((pl.col("_ps") == pl.col("_pd")) & (pl.col("_hs") == pl.col("_hd"))))
        .fill_null(False).alias("intra")
    ).unique(["line", "source"], keep="first", maintain_order=True)


def _rows(*parts: pl.DataFrame) -> pl.DataFrame:
    """The process columns of every non-empty part, for ``where``."""
    return pl.concat([d.select("host", "pid", "cuda_dev", "line") for d in parts if d.height])


def _link_rows(a: pl.DataFrame, b: pl.DataFrame, b_via: str) -> tuple[dict, ...]:
    """Evidence from two kinds of rows, ``b``'s ``b_via`` column shown as ``via``."""
    return evidence(pl.concat([a.select("host", "rank", "line", "via"),
                               b.select("host", "rank", "line", pl.col(b_via).alias("via"))]),
                    ("host", "rank", "line", "via"))


@dataclass(frozen=True)
class _Problem:
    """What one check measured, before any wording: where, how much (``counts``, by what each count is), the user's
    switches behind it, and the facts its summary names."""

    key: str
    severity: Severity
    kind: FindingKind
    confidence: str
    place: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]  # ranks, hosts, GPUs
    evidence: tuple[dict, ...]
    metrics: dict[str, Any]
    counts: dict[str, int] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    rows: tuple[dict[str, Any], ...] = ()  # per-host facts (single NIC: host, gpus, nic; interfaces: host, ifaces)


def measure_sockets(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """1. Inter-node traffic over TCP sockets."""
    net, j = t.net, t.j
    if j.single_node:
        return None  # one node: the network carries nothing, whatever NCCL printed about it at init
    sock = t.netch.filter((pl.col("net") == "Socket") & ~pl.col("intra"))
    sock_net = t.netsel.filter(pl.col("name").str.to_lowercase() == "socket")
    ofi_tcp = net.filter((pl.col("kind") == "ofi_provider") & pl.col("name").str.contains(r"(?i)tcp|sockets"))
    ib_none = net.filter(pl.col("kind") == "ib_none")
    implied = pl.concat([sock_net.select("host", "pid", "cuda_dev", "line"),
                         ib_none.select("host", "pid", "cuda_dev", "line")])
    only_socket = t.netsel.filter(pl.col("name").str.to_lowercase() != "socket").height == 0
    if not (sock.height or ofi_tcp.height or (j.multi_node and implied.height and only_socket)):
        return None
    has_ib = net.filter(pl.col("kind") == "ib").height > 0 or j.env.get("NCCL_IB_DISABLE", "0") not in ("0", "")
    return _Problem(
        "socket", Severity.CRITICAL, DEGRADED_TRANSPORT, "high" if sock.height else "medium",
        where(_rows(sock, ofi_tcp, implied), j.ident), _link_rows(sock, ofi_tcp, "name"),
        {"socket_connections": sock.height, "ib_present_or_disabled": has_ib},
        counts={"socket": sock.height, "socket_network": sock_net.height, "ofi_tcp": ofi_tcp.height,
                "ib_none": ib_none.height},
        overrides=_overrides(t, "socket"))


def _socket_words(p: _Problem) -> tuple[str, str, str]:
    c = p.counts
    why = _said([
        (c["socket"], f"{c['socket']} inter-node connection(s) use NET/Socket"),
        (c["socket_network"], f"NCCL chose the Socket network on {c['socket_network']} process(es) "
                              "(`Using network Socket`)"),
        (c["ofi_tcp"], "the OFI provider is TCP-based"),
        (c["ib_none"], "NCCL found no IB device (`NET/IB : No device found`)"),
        (1, _set_by_user(p.overrides)),
    ])
    return ("Inter-node NCCL traffic runs over TCP sockets",
            why + ". Sockets give a few GB/s per node where IB/RoCE/EFA give 25-50 GB/s per NIC.",
            "Enable the RDMA path: unset NCCL_IB_DISABLE, install libibverbs / the net plugin (aws-ofi-nccl, "
            "HPC-X), check `ibv_devinfo` inside the container, pin NCCL_NET if needed.")


def measure_no_gdr(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """2. RDMA without GPUDirect."""
    net = t.net
    nogdr = t.netch.filter((pl.col("net") != "Socket") & ~pl.col("gdr") & ~pl.col("intra"))
    hca_off = t.nic_facts(net.filter((pl.col("kind") == "gdr_hca") & (pl.col("state") == "Disabled")
                                     & ~pl.col("detail").str.starts_with("NET/Socket")), by_index=True)
    gpu_off = t.nic_facts(net.filter((pl.col("kind") == "gdr_gpu") & (pl.col("state") == "Disabled")))
    # `GDR 0` is normal when the network is TCP: only RDMA processes count
    sock_procs = pl.concat([
        t.netsel.filter(pl.col("name").str.to_lowercase() == "socket").select("host", "pid"),
        t.ch.filter(pl.col("net") == "Socket").select("host", "pid"),
    ]).unique(maintain_order=True)
    gdr0 = t.nic_facts(t.ev.filter((pl.col("kind") == "connected") & (pl.col("code") == 0)).join(
        sock_procs, on=["host", "pid"], how="anti", nulls_equal=True))
    if not (nogdr.height or hca_off.height or gpu_off.height or gdr0.height):
        return None
    return _Problem(
        "no_gdr", Severity.WARNING, DEGRADED_TRANSPORT, "high", where(_rows(nogdr, hca_off, gpu_off, gdr0), t.j.ident),
        _link_rows(nogdr, hca_off, "detail"),
        {"connections_without_gdr": nogdr.height, "hca_gdr_disabled": hca_off.height},
        counts={"no_gdr": nogdr.height, "hca_off": hca_off.height, "gpu_off": gpu_off.height, "gdr0": gdr0.height},
        overrides=_overrides(t, "no_gdr"))


def _no_gdr_words(p: _Problem) -> tuple[str, str, str]:
    c = p.counts
    why = _said([
        (c["no_gdr"], f"{c['no_gdr']} IB/RoCE connection(s) lack /GDRDMA"),
        (c["hca_off"], f"{c['hca_off']} HCA(s) report GPU Direct RDMA Disabled"),
        (c["gpu_off"], f"{c['gpu_off']} GPU/HCA pair(s) are too far apart"),
        (c["gdr0"], f"{c['gdr0']} ring(s) report GDR 0"),
    ])
    return ("RDMA network used without GPUDirect RDMA",
            f"{why}: every message is staged through host memory" + _then(_set_by_user(p.overrides)) + ".",
            "Load nvidia-peermem (or use DMA-BUF with a recent driver), check NCCL_NET_GDR_LEVEL and that each "
            "GPU has a NIC under the same PCIe switch.")


def measure_intra_node(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """3. Intra-node traffic off NVLink/P2P."""
    j, ch = t.j, t.ch
    shm = ch.filter(pl.col("transport") == "SHM")
    intra_net = t.netch.filter(pl.col("intra"))
    nop2p = t.ev.filter((pl.col("kind") == "p2p_check") & (pl.col("code") == 0))
    if not (shm.height or intra_net.height or nop2p.height):
        return None
    forced = _overrides(t, "intra")
    p2p_elsewhere = ch.filter(pl.col("transport") == "P2P").height > 0
    return _Problem(
        "intra_node", Severity.WARNING, DEGRADED_TRANSPORT,
        "high" if (forced or p2p_elsewhere or nop2p.height) else "medium",
        where(_rows(shm, intra_net, nop2p), j.ident), _link_rows(shm, intra_net, "via"),
        {"shm_connections": shm.height, "intra_node_net_connections": intra_net.height},
        counts={"shm": shm.height, "intra_net": intra_net.height, "no_p2p": nop2p.height}, overrides=forced)


def _intra_node_words(p: _Problem) -> tuple[str, str, str]:
    c = p.counts
    why = _said([
        (c["shm"], f"{c['shm']} connection(s) via host shared memory"),
        (c["intra_net"], f"{c['intra_net']} intra-node connection(s) via the network"),
        (c["no_p2p"], "CUDA P2P reported unsupported (intraNodeP2pSupport 0)"),
    ], ", ")
    return ("Intra-node GPU pairs do not use P2P/NVLink", why + _then(_set_by_user(p.overrides)) + ".",
            "Unset NCCL_P2P_DISABLE / NCCL_SHM_DISABLE / NCCL_P2P_LEVEL, run containers with --ipc=host, "
            "check that ACS/IOMMU do not block peer access (`nvidia-smi topo -p2p r`).")


def measure_nvls_off(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """4. NVLS off on an NVSwitch Hopper+/Blackwell system."""
    ev, j = t.ev, t.j
    nvs = ev.filter((pl.col("kind") == "topo_link") & pl.col("peer").str.starts_with("NVS/"))
    nvls_off = pl.concat([
        ev.filter((pl.col("kind") == "nvls_support") & (pl.col("code") == 0)).select("host", "pid", "cuda_dev", "line"),
        ev.filter((pl.col("kind") == "channels") & (pl.col("code") == 0)).select("host", "pid", "cuda_dev", "line"),
    ])
    want = set(cfg.nvls_archs.split(","))
    if not (nvls_off.height and nvs.height and j.archs and set(j.archs.values()) <= want):
        return None
    return _Problem("nvls_off", Severity.WARNING, DEGRADED_TRANSPORT, "medium", where(nvls_off, j.ident),
                    evidence(nvls_off, ("host", "line")), {})


def _nvls_off_words(p: _Problem) -> tuple[str, str, str]:
    return ("NVLink SHARP (NVLS) is off on an NVSwitch system",
            "The topology shows an NVSwitch and the GPUs support NVLS, but NCCL set up 0 NVLS channels.",
            "Check NCCL_NVLS_ENABLE, the fabric manager / IMEX service and that the CUDA driver exposes multicast.")


def measure_single_nic(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """5. One NIC for every GPU of a node."""
    ib, j = t.nic_facts(t.ib, by_index=True), t.j
    if not ib.height:
        return None
    # a node is assumed to hold at least an even share of the ranks only while some ranks are unplaced: when the
    # logs place every rank, each host's GPUs are counted (9 ranks on 8 + 1 GPUs is not a 4-GPU second node)
    even = (j.nranks // j.nnodes) if (j.nranks and j.nnodes and j.nnodes > 1) else 0
    held = j.ident.filter(pl.col("rank").is_not_null())
    all_held = bool(j.nranks) and held["rank"].n_unique() >= (j.nranks or 0)
    gpus_per_host = j.ident.group_by("host").agg(pl.max_horizontal(
        pl.col("cuda_dev").n_unique(), pl.lit(0 if all_held else even)).alias("gpus"))
    nics = (ib.group_by("host", maintain_order=True)
            .agg(pl.col("name").n_unique().alias("nics"), pl.col("name").first().alias("nic")).sort("host"))
    shared = nics.join(gpus_per_host, on="host", maintain_order="left").filter(
        (pl.col("nics") == 1) & (pl.col("gpus") >= cfg.min_gpus_per_single_nic))
    if not shared.height:
        return None
    return _Problem(
        "single_nic", Severity.WARNING, DEGRADED_TRANSPORT, "medium",
        where(ib.join(shared.select("host"), on="host"), j.ident), evidence(shared, ("host", "nic", "gpus")),
        {"max_gpus_per_nic": int(shared["gpus"].max())},  # type: ignore[arg-type]
        rows=tuple(shared.select("host", "gpus", "nic").iter_rows(named=True)))


def _single_nic_words(p: _Problem) -> tuple[str, str, str]:
    return ("All GPUs of a node share one NIC",
            "; ".join(f"{r['host']}: {r['gpus']} GPUs seen, one NIC ({r['nic']})" for r in p.rows)
            + ". Inter-node bandwidth per GPU is one NIC divided by the GPUs of the node.",
            "Expose one NIC (or VF) per GPU/rail to the job (NCCL_IB_HCA, SR-IOV, device plugin settings).")


def measure_interfaces(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """6. Wrong or inconsistent socket interfaces."""
    if t.j.single_node:
        return None  # one node: bootstrap and sockets stay on the host
    ifs = t.net.filter(pl.col("kind").is_in(["bootstrap", "socket"]) & pl.col("name").is_not_null())
    bad = ifs.filter(pl.col("name").str.contains(cfg.bad_iface_pattern))
    sets = (ifs.filter(pl.col("kind") == "socket").group_by("host")
            .agg(pl.col("name").unique().sort().str.join(",").alias("ifaces")).sort("host"))
    inconsistent = sets.height > 1 and sets["ifaces"].n_unique() > 1
    if not (bad.height or inconsistent):
        return None
    names = sorted(set(bad["name"].to_list()))
    return _Problem(
        "iface", Severity.WARNING, DEGRADED_TRANSPORT, "high", where(bad if bad.height else ifs, t.j.ident),
        evidence(bad if bad.height else ifs, ("host", "kind", "name", "address", "line")),
        {"bad_interfaces": ",".join(names) or None, "inconsistent_across_hosts": inconsistent},
        rows=tuple(sets.iter_rows(named=True)) if inconsistent else ())


def _interfaces_words(p: _Problem) -> tuple[str, str, str]:
    names = p.metrics["bad_interfaces"]
    differ = "; ".join(f"{r['host']}={r['ifaces']}" for r in p.rows)
    return ("NCCL uses virtual or inconsistent network interfaces",
            (f"Bootstrap/socket interfaces include {names.replace(',', ', ')}" if names else "")
            + ("; " if names and p.rows else "")
            + (f"interface sets differ between hosts: {differ}" if p.rows else "") + ".",
            "Set NCCL_SOCKET_IFNAME to the data interface (e.g. `=eth0` or `^docker,lo,virbr,veth`).")


def measure_no_libibverbs(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    nolib = t.ev.filter(pl.col("kind") == "no_libibverbs")
    if not nolib.height or t.j.single_node:
        return None
    return _Problem("no_libibverbs", Severity.WARNING if t.j.multi_node else Severity.INFO, DEGRADED_TRANSPORT,
                    "high", where(nolib, t.j.ident), evidence(nolib, ("host", "line", "file_line", "message")), {})


def _no_libibverbs_words(p: _Problem) -> tuple[str, str, str]:
    return ("libibverbs missing: NCCL cannot use InfiniBand/RoCE",
            "NCCL failed to open libibverbs.so, so only TCP sockets are available between nodes.",
            "Install rdma-core / libibverbs in the image if the nodes have RDMA NICs.")


def measure_mixed_link(t: _Transport, cfg: NcclTransportConfig) -> _Problem | None:
    """7. Mixed link layers."""
    ib = t.nic_facts(t.ib, by_index=True)
    if not (ib.height and ib["link_layer"].drop_nulls().n_unique() > 1):
        return None
    return _Problem("mixed_link", Severity.WARNING, DEGRADED_TRANSPORT, "high", where(ib, t.j.ident),
                    evidence(ib.unique(["host", "name"], keep="first", maintain_order=True),
                             ("host", "name", "link_layer")), {})


def _mixed_link_words(p: _Problem) -> tuple[str, str, str]:
    return ("Mixed InfiniBand and RoCE NICs",
            "NCCL lists both IB and RoCE devices; 2.28+ refuses to connect such pairs and older versions mis-tune.",
            "Restrict NCCL_IB_HCA to one link layer.")


# Environment switches that restrict NCCL's transports: variable -> (the finding key of their effect,
# whether a value turns the switch on, what it does). They belong here, not to nccl_algorithm.
_OFF = ("0", "", "LOC")
_WIDEST = ("SYS", "4", "5")  # the widest path level (legacy numbers 4/5): a level switch set to it restricts nothing
TRANSPORT_ENV: dict[str, tuple[str, Callable[[str], bool], Callable[[str], str]]] = {
    "NCCL_P2P_DISABLE": ("intra", lambda v: v != "0", lambda v: "no CUDA P2P/NVLink between GPUs of a node"),
    "NCCL_P2P_LEVEL": ("intra", lambda v: v.upper() not in _WIDEST, lambda v: "no CUDA P2P between GPUs of a node"
                       if v.upper() in _OFF
                       else f"CUDA P2P only between GPUs at most {v} apart"),
    "NCCL_SHM_DISABLE": ("intra", lambda v: v != "0", lambda v: "no shared-memory transport within a node"),
    "NCCL_IB_DISABLE": ("socket", lambda v: v != "0", lambda v: "InfiniBand/RoCE off"),
    "NCCL_NET": ("socket", lambda v: v.strip('"').lower() == "socket", lambda v: "the Socket network forced"),
    "NCCL_NET_GDR_LEVEL": ("no_gdr", lambda v: v.upper() not in _WIDEST,
                           lambda v: "no GPUDirect RDMA" if v.upper() in _OFF
                           else f"GPUDirect RDMA only for NIC-GPU distance up to {v}"),
    "NCCL_NET_GDR_READ": ("no_gdr", lambda v: v == "0", lambda v: "no GPUDirect RDMA reads"),
}


def _said(parts: list[tuple[int, str]], sep: str = "; ") -> str:
    """The parts whose count is not zero (a message never reports "0 connections" as its evidence)."""
    text = sep.join(p for n, p in parts if n and p)
    return text[:1].upper() + text[1:]


def _then(text: str) -> str:
    return f"; {text}" if text else ""


def _overrides(t: _Transport, effect: str | None = None) -> dict[str, str]:
    """The user's transport switches that are on (net plugins' own settings excluded), of one effect."""
    env = {r["var"]: r["value"] for r in t.env_rows.iter_rows(named=True)}  # the last value wins
    return {k: v for k, (eff, on, _) in TRANSPORT_ENV.items()
            if (v := env.get(k)) is not None and on(v) and effect in (None, eff)}


def _set_by_user(overrides: dict[str, str]) -> str:
    return "set by the user: " + ", ".join(f"{k}={v}" for k, v in overrides.items()) if overrides else ""


def _env_verdict(t: _Transport, effect: str) -> tuple[bool, str, int]:
    """(whether the switch costs this job, the basis of that, the count of connections the basis names) for a
    switch whose effect no other finding shows."""
    if effect == "socket":
        return (True, "multi_node", 0) if t.j.multi_node else (False, "single_node", 0)
    if effect == "intra":
        return False, "p2p_used", t.ch.filter(pl.col("transport") == "P2P").height
    return False, "gdr_used", t.netch.filter(pl.col("net") != "Socket").height


_VERDICT_WORDS: dict[str, Callable[[int], str]] = {
    "multi_node": lambda n: ("the job spans nodes: inter-node traffic runs over TCP sockets, a few GB/s per node "
                             "instead of 25-50 GB/s per NIC"),
    "single_node": lambda n: "single-node job: no inter-node traffic",
    "p2p_used": lambda n: (f"the {n} intra-node connection(s) logged use P2P" if n
                           else "no intra-node connection lines in the logs show what it cost"),
    "gdr_used": lambda n: ("every RDMA connection logged uses GPUDirect RDMA" if n
                           else "no RDMA connection lines in the logs show what it cost"),
}


@dataclass(frozen=True)
class _EnvProblem:
    """Transport switches whose effect no other finding names, and per effect what they cost this job."""

    problem: _Problem
    verdicts: dict[str, tuple[bool, str, int]]  # effect -> (costly, basis, count)


def measure_transport_env(t: _Transport, cfg: NcclTransportConfig) -> _EnvProblem | None:
    """9. Transport switches in the environment whose effect no other finding names (runs last)."""
    effects = {"intra": "intra_node", "socket": "socket", "no_gdr": "no_gdr"}
    left = {k: v for k, v in _overrides(t).items() if effects[TRANSPORT_ENV[k][0]] not in t.fired}
    if not left:
        return None
    verdicts = {eff: _env_verdict(t, eff) for eff in dict.fromkeys(TRANSPORT_ENV[k][0] for k in left)}
    costly = any(v[0] for v in verdicts.values())
    rows = t.env_rows.filter(pl.col("var").is_in(list(left)))
    return _EnvProblem(_Problem(
        "transport_env", Severity.WARNING if costly else Severity.INFO,
        # a switch is a cause only where it cost the job: at info the logs showed no effect of it
        DEGRADED_TRANSPORT if costly else TRANSPORT_SETTING, "high" if costly else "medium",
        where(rows, t.j.ident), evidence(rows, ("host", "line", "var", "value", "origin")), dict(left),
        overrides=left), verdicts)


def _transport_env_words(e: _EnvProblem) -> tuple[str, str, str]:
    left = e.problem.overrides
    said = "; ".join(
        ", ".join(f"{k}={v} ({TRANSPORT_ENV[k][2](v)})" for k, v in left.items() if TRANSPORT_ENV[k][0] == eff)
        + f": {_VERDICT_WORDS[basis](n)}" for eff, (_, basis, n) in e.verdicts.items())
    return ("NCCL transports restricted by environment", f"Set by the user: {said}.",
            "Unset the switch unless it works around a known fault on this cluster; NCCL picks the fastest "
            "transport it can use.")


def _finding(p: _Problem, words: tuple[str, str, str]) -> Finding:
    title, summary, remedy = words
    ranks, hosts, gpus = p.place
    return Finding("nccl_transport", p.severity, title, summary, remedy, ranks=ranks, hosts=hosts, gpus=gpus,
                   key=p.key, kind=p.kind.name, metrics=p.metrics, evidence=p.evidence, confidence=p.confidence)


Measure = Callable[[_Transport, NcclTransportConfig], "_Problem | None"]

#: Each check: what it measures, and how that is worded.
CHECKS: tuple[tuple[Measure, Callable[[_Problem], tuple[str, str, str]]], ...] = (
    (measure_sockets, _socket_words), (measure_no_gdr, _no_gdr_words), (measure_intra_node, _intra_node_words),
    (measure_nvls_off, _nvls_off_words), (measure_single_nic, _single_nic_words),
    (measure_interfaces, _interfaces_words), (measure_no_libibverbs, _no_libibverbs_words),
    (measure_mixed_link, _mixed_link_words),
)


DEGRADED_TRANSPORT = FindingKind(
    "degraded_transport", "NCCL uses a slower path than the hardware offers (sockets instead of IB, GDR off, "
    "SHM/P2P off, NVLS off, one NIC for all GPUs, virtual interfaces, mixed link layers)", Role.CONFIG,
    "Let NCCL use the fastest transport the hardware has: unset the switches, fix the NIC/driver setup.")
TRANSPORT_SETTING = FindingKind(
    "transport_setting", "a transport switch in the environment whose effect the logs do not show",
    Role.CONFIG, "Unset the switch unless it works around a known fault on this cluster.", stage=4)


DOC = DetectorDoc(
    summary=(
        "NCCL transport problems read from NCCL_DEBUG=INFO logs."
    ),
    detects=(
        "Inter-node traffic over TCP sockets (`NET/Socket`, or an OFI provider over TCP); IB/RoCE connections"
        " without GPUDirect RDMA (no `/GDRDMA`, `GPU Direct RDMA Disabled for HCA`, `use ring ... GDR 0`); "
        "intra-node pairs over SHM or the network instead of P2P/NVLink (and `intraNodeP2pSupport 0`); NVLS "
        "off on Hopper+ NVSwitch systems; one NIC shared by all GPUs of a node; bootstrap/socket interfaces "
        "that are virtual (docker, virbr, veth, tunnels, lo) or differ between nodes; mixed IB and RoCE link "
        "layers; and transport switches in the environment (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_SHM_DISABLE, "
        "NCCL_IB_DISABLE, "
        "NCCL_NET=Socket, NCCL_NET_GDR_LEVEL, NCCL_NET_GDR_READ=0): named as the cause in the finding of "
        "their effect, else on their own (warning when they cost this job, info when the logs show no "
        "effect)."
    ),
    matters=(
        "The transport bounds every collective: sockets run at a few GB/s instead of 25-50 GB/s per NIC, "
        "missing GDR stages every message through host memory, SHM instead of NVLink costs an order of "
        "magnitude intra-node, and a sick HCA or link hangs or kills the job."
    ),
    measures=(
        "From `nccl_channels` (the `via` of every connection), `nccl_net` (NET/IB, NET/Socket, Bootstrap, GDR"
        " lines), `nccl_events` (WARNs, NVLS/P2P/topology facts) and `nccl_env`. A NET connection is treated "
        "as intra-node only when both ranks belong to one process or the job is single-node. Judged on what "
        "carried traffic: a job proven to run on one node (the 2.20+ layout line, or one host holding every "
        "rank) gets no network finding whatever NCCL printed about its NICs at init; NIC facts (GDR disabled for "
        "an HCA, one NIC, link layers) count on a host only for the NICs its logged NET channels use, and on "
        "hosts whose NET channels are not in the logs. Fabric and connection errors are nccl_comm_failure's. "
        "Ranks and GPUs come from forensics.facts.identity (init lines, channel lines, traces)."
    ),
    todo=(
        "Sockets: install/enable the IB or EFA stack (NCCL_IB_DISABLE unset, libibverbs present, the right "
        "net plugin). No GDR: load nvidia-peermem / use DMA-BUF, check NCCL_NET_GDR_LEVEL and PCIe topology. "
        "SHM/NET intra-node: unset NCCL_P2P_DISABLE / NCCL_SHM_DISABLE / NCCL_P2P_LEVEL, give containers IPC "
        "and --shm-size, check ACS/IOMMU. NVLS: NCCL_NVLS_ENABLE, fabric manager and IMEX. One NIC: expose "
        "every rail (SR-IOV VFs per GPU, NCCL_IB_HCA). Interfaces: set NCCL_SOCKET_IFNAME."
    ),
)


@detector(
    "nccl_transport", doc=DOC,
    settings=NcclTransportConfig,
    requires_any=("nccl_channels", "nccl_net", "nccl_events"),
    kinds=(DEGRADED_TRANSPORT, TRANSPORT_SETTING),
    view="nccl-config",
)
def detect(ctx: JobContext, cfg: NcclTransportConfig) -> list[Finding]:
    t = _facts(ctx)
    out: list[Finding] = []
    for measure, words in CHECKS:
        problem = measure(t, cfg)
        if problem is not None:
            t.fired.add(problem.key)
            out.append(_finding(problem, words(problem)))
    env = measure_transport_env(t, cfg)  # last: it names only switches whose effect no check above reported
    if env is not None:
        out.append(_finding(env.problem, _transport_env_words(env)))
    return out
