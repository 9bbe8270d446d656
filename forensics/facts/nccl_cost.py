"""NCCL's algorithm/protocol cost model (NCCL >= 2.19), transcribed from ``src/graph/tuning.cc`` and
``src/enqueue.cc`` (research/nccl.md §B).

NCCL picks, per operation, ``argmin over enabled (algo, proto) of lat * latCount + nBytes / (1000 * bw)``
(µs, GB/s). ``lat`` and ``bw`` come from its tuning tables: a base latency per (algo, proto) plus a
per-hop hardware latency (NVLink / PCI / network), and a bus bandwidth = channels x per-channel graph
bandwidth, capped per protocol and GPU generation, converted to algorithm bandwidth. When a log carries
the TUNING table, :func:`choose_from_table` replays NCCL's own numbers instead of modelling them.

Only Ring, Tree, NVLS, NVLSTree and PAT are modelled (CollNet needs a plugin and is left out).
``era="2.22"`` covers 2.19-2.22 (Tree/Simple hop latency 28 µs, no PAT, AllReduce ring inter-node steps
``2*nNodes``), ``era="2.28"`` covers 2.23 and later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

ALGOS = ("Tree", "Ring", "NVLS", "NVLSTree", "PAT")
PROTOS = ("LL", "LL128", "Simple")
COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")
ARCH_INDEX = {"kepler": 0, "maxwell": 0, "pascal": 0, "volta": 0, "turing": 0, "ampere": 1, "hopper": 2,
              "blackwell": 3}

BASE_LAT = {
    "Tree": (6.8, 14.0, 8.4), "Ring": (6.6, 14.0, 8.4), "NVLS": (0.0, 0.0, 0.0),
    "NVLSTree": (0.0, 0.0, 0.0), "PAT": (8.0, 8.0, 8.0),
}
# hwLat[link][algo] = (LL, LL128, Simple), 2.23+ constants
HW_LAT = {
    "NVLINK": {"Tree": (0.6, 1.25, 4.0), "Ring": (0.6, 1.9, 3.4), "NVLS": (0, 0, 25.0),
               "NVLSTree": (0, 0, 25.0), "PAT": (0, 0, 4.0)},
    "PCI": {"Tree": (1.0, 1.9, 4.0), "Ring": (1.0, 2.5, 5.7), "NVLS": (0, 0, 0),
            "NVLSTree": (0, 0, 0), "PAT": (0, 0, 4.0)},
    "NET": {"Tree": (5.0, 8.5, 14.0), "Ring": (2.7, 4.0, 14.0), "NVLS": (0, 0, 18.0),
            "NVLSTree": (0, 0, 20.9), "PAT": (0, 0, 14.0)},
}
# [arch or cpu index][nodes index: 1, 2, >=3]
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (73.4, 34.6, 73.4))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 43.8))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
# treeCorrectionFactor[proto][log2(nBytes / 64)] (2.19+)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)


@dataclass(frozen=True)
class Graph:
    """One topology graph (ring, tree or NVLS) as NCCL's search left it (`Pattern ...` GRAPH lines)."""

    nchannels: int
    bw_intra: float  # GB/s per channel inside a node
    bw_inter: float  # GB/s per channel between nodes
    intra_nvlink: bool = True
    latency_inter: float = 0.0
    tree_pattern_is_tree: bool = True  # NCCL_TOPO_PATTERN_TREE (x0.85) vs balanced/split tree


@dataclass(frozen=True)
class Comm:
    nranks: int
    nnodes: int
    arch: str = "hopper"  # volta / ampere / hopper / blackwell (minimum compute capability)
    cpu_vendor: str = "intel"  # intel / amd (amd or mixed use the AMD row)
    ring: Graph = field(default_factory=lambda: Graph(16, 24.0, 12.0))
    tree: Graph | None = None
    nvls: Graph | None = None
    era: str = "2.28"
    ll128: bool = True  # LL128 enabled (NVLink paths, homogeneous GPUs, Volta+)
    # NCCL_ALGO / NCCL_PROTO: None = everything NCCL would enable
    algos: frozenset[str] | None = None
    protos: frozenset[str] | None = None

    @property
    def ppn(self) -> int:
        return max(1, self.nranks // max(1, self.nnodes))


def log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else -1


def _nsteps(coll: str, n: int) -> int:
    if coll == "AllReduce":
        return 2 * (n - 1)
    if coll in ("AllGather", "ReduceScatter"):
        return n - 1
    return n


def _graph(c: Comm, algo: str) -> Graph | None:
    if algo in ("Ring", "PAT"):
        return c.ring
    if algo == "Tree":
        return c.tree or c.ring
    return c.nvls


def enabled(c: Comm, coll: str, algo: str, proto: str) -> bool:
    """NCCL's applicability and default enable rules (tuning.cc), then NCCL_ALGO / NCCL_PROTO."""
    if c.algos is not None and algo not in c.algos:
        return False
    if c.protos is not None and proto not in c.protos:
        return False
    if proto == "LL128" and not c.ll128:
        return False
    if not applicable(coll, algo):
        return False
    if algo == "PAT" and (c.era == "2.22" or c.ppn != 1 or c.nnodes < 2):
        return False
    if algo in ("NVLS", "NVLSTree"):
        return _nvls_enabled(c, algo, proto)
    return True


def applicable(coll: str, algo: str) -> bool:
    """Whether NCCL implements ``coll`` with ``algo`` (Broadcast/Reduce: Ring only; AllGather/ReduceScatter: Ring,
    PAT, NVLS; AllReduce: all but PAT)."""
    if coll in ("Broadcast", "Reduce"):
        return algo == "Ring"
    if coll in ("AllGather", "ReduceScatter"):
        return algo in ("Ring", "PAT", "NVLS")
    return not (coll == "AllReduce" and algo == "PAT")


def _nvls_enabled(c: Comm, algo: str, proto: str) -> bool:
    if c.nvls is None or c.nvls.nchannels < 2 or ARCH_INDEX[c.arch] < 2 or proto != "Simple":
        return False
    if algo == "NVLSTree" and c.nnodes == 1:
        return False
    return not (algo == "NVLS" and c.nnodes > 1)  # multi-node NVLS needs CollNet


def bandwidth(c: Comm, coll: str, algo: str, proto: str) -> float:
    """Algorithm bandwidth (GB/s) NCCL puts in comm->bandwidths[coll][algo][proto]; 0 = disabled."""
    g = _graph(c, algo)
    if g is None or not enabled(c, coll, algo, proto):
        return 0.0
    bw = g.bw_intra if c.nnodes <= 2 else g.bw_inter
    if algo in ("NVLS", "NVLSTree"):
        bw = _nvls_bw(c, g, coll, algo)
    bus = _proto_bus(c, g, coll, algo, proto, g.nchannels * bw)
    if algo == "Tree" and g.tree_pattern_is_tree:
        bus *= 0.85
    if algo == "PAT":
        bus *= 0.75
    if not (algo != "Ring" and coll in ("AllGather", "ReduceScatter")):
        ratio = c.nranks / _nsteps(coll, c.nranks) if algo in ("Ring", "NVLS", "NVLSTree") else 0.5
        bus *= ratio
    return bus


def _nvls_bw(c: Comm, g: Graph, coll: str, algo: str) -> float:
    """Per-channel bandwidth of NVLS / NVLSTree."""
    arch = ARCH_INDEX[c.arch]
    nch = g.nchannels
    intra = g.bw_intra * NVLS_EFFICIENCY[arch] * (nch - 1) / nch
    intra *= 2 if coll == "AllReduce" else (c.ppn - 1) / c.ppn
    bw = intra
    if c.nnodes > 1:
        bw = min(bw, g.bw_inter * (2 if (c.nnodes <= 2 and algo == "NVLSTree") else 1))
    if algo == "NVLSTree":
        bw = min(bw, PER_CH_MAX_NVLS_TREE[arch][min(c.nnodes, 3) - 1])
    return bw


def _proto_bus(c: Comm, g: Graph, coll: str, algo: str, proto: str, bus: float) -> float:
    """Bus bandwidth after the LL / LL128 factors and per-channel caps of Ring and Tree."""
    arch = ARCH_INDEX[c.arch]
    i2 = min(c.nnodes, 3) - 1
    i1 = arch if c.nnodes == 1 else (1 if c.cpu_vendor == "amd" else 0)
    ll_max = LL_MAX_BWS[i1][i2]
    nch = g.nchannels
    if algo == "Ring" and proto == "LL":
        bus = min(ll_max, bus * 0.5)
    if algo == "Ring" and proto == "LL128":
        bus = min(bus * 0.92, nch * PER_CH_MAX_RING_LL128[arch][i2])
    if algo == "Tree" and coll == "AllReduce":
        bus = min(bus * 0.92, nch * PER_CH_MAX_TREE[arch][i2])
    if algo == "Tree" and proto == "LL":
        bus = min(bus / 3.8, ll_max)
    if algo == "Tree" and proto == "LL128":
        bus = min(bus * (7.0 / 9.0 if c.nnodes == 1 else 120.0 / 128.0), nch * PER_CH_MAX_TREE_LL128[arch][i2])
    return bus


def latency(c: Comm, coll: str, algo: str, proto: str) -> float:
    """Latency (µs) NCCL puts in comm->latencies[coll][algo][proto]."""
    g = _graph(c, algo)
    if g is None:
        return 0.0
    intra, inter = _hop_latencies(c, g, algo, proto)
    base = BASE_LAT[algo][PROTOS.index(proto)]
    if algo == "Ring":
        return _ring_latency(c, coll, proto, base, intra, inter)
    if algo == "Tree":
        return base + 2 * ((c.ppn - 1) * intra + log2i(c.nnodes) * inter)
    if algo == "NVLS":
        return intra + (inter if c.nnodes > 1 else 0.0)
    if algo == "NVLSTree":
        return base + intra + 2 * log2i(c.nnodes) * inter
    if algo == "PAT":
        return base + log2i(c.nnodes) * inter / 3.5 + c.nranks * 2.8
    return 0.0


def _hop_latencies(c: Comm, g: Graph, algo: str, proto: str) -> tuple[float, float]:
    """(intra-node, inter-node) latency of one hop (µs)."""
    p = PROTOS.index(proto)
    tree_simple = 28.0 if c.era == "2.22" else None
    link = "NVLINK" if g.intra_nvlink else "PCI"
    intra = HW_LAT[link][algo][p]
    if tree_simple is not None and algo == "Tree" and proto == "Simple":
        intra = tree_simple
    net_algo = "Tree" if (c.ppn == 1 and algo != "PAT") else algo
    inter = HW_LAT["NET"][net_algo][p]
    if tree_simple is not None and net_algo == "Tree" and proto == "Simple":
        inter = tree_simple
    if c.era == "2.22" and algo == "NVLSTree":
        inter = 14.0
    inter += g.latency_inter * (2 if proto == "Simple" else 1)
    return intra, inter


def _ring_latency(c: Comm, coll: str, proto: str, base: float, intra: float, inter: float) -> float:
    nsteps = _nsteps(coll, c.nranks)
    if coll not in ("AllReduce", "AllGather", "ReduceScatter"):
        # Broadcast / Reduce: pipelined chain, one hop of latency per step
        return base + nsteps * (inter if c.nnodes > 1 else intra)
    n_inter = 0
    if c.nnodes > 1:
        overhead = 2.0 if c.cpu_vendor == "amd" else 1.0
        intra = max(intra, overhead * (3 if proto == "Simple" else 1))
        if coll == "AllReduce":
            n_inter = 2 * c.nnodes if c.era == "2.22" else 2 * (c.nnodes - 1)
        else:
            n_inter = c.nnodes - 1
    return base + (nsteps - n_inter) * intra + n_inter * inter


def op_time(lat: float, bw: float, coll: str, algo: str, proto: str, nbytes: int, c: Comm | None,
            arch: str = "hopper") -> float:
    """``lat + nBytes / (1000 * bw * corr)`` with NCCL's per-op refinements (µs); inf when disabled."""
    if bw <= 0:
        return math.inf
    if coll == "AllReduce" and algo == "Tree":
        ls = log2i(nbytes >> 6)
        if 0 <= ls < len(TREE_CORRECTION[0]):
            bw *= TREE_CORRECTION[PROTOS.index(proto)][ls]
    if (c is not None and algo == "Ring" and proto == "Simple" and coll == "AllReduce" and c.nnodes > 1
            and nbytes / (c.ring.nchannels * c.nranks) >= 64):
        lat *= 1.9 if ARCH_INDEX.get(c.arch, 2) < 1 else 1.4
    return lat + nbytes / (1000.0 * bw)


def predict(c: Comm, coll: str, algo: str, proto: str, nbytes: int) -> float:
    """Predicted time (µs) of one (algo, proto) for ``nbytes`` (total buffer for AllGather/ReduceScatter)."""
    return op_time(latency(c, coll, algo, proto), bandwidth(c, coll, algo, proto), coll, algo, proto, nbytes, c)


def choose(c: Comm, coll: str, nbytes: int) -> tuple[str, str, float, dict[tuple[str, str], float]]:
    """NCCL's choice: (algo, proto, predicted µs, every candidate's time)."""
    cands = {(a, p): predict(c, coll, a, p, nbytes) for a in ALGOS for p in PROTOS}
    cands = {k: v for k, v in cands.items() if math.isfinite(v)}
    if not cands:
        raise ValueError(f"no algorithm/protocol available for {coll}")
    (a, p), t = min(cands.items(), key=lambda kv: kv[1])
    return a, p, t, cands


def choose_from_table(table: Mapping[tuple[str, str], tuple[float, float]], coll: str, nbytes: int,
                      c: Comm | None = None) -> tuple[str, str, float, dict[tuple[str, str], float]]:
    """Replay a TUNING table: ``{(algo, proto): (latency_us, algbw_gbps)}`` for ``coll``."""
    cands = {
        (a, p): op_time(lat, bw, coll, a, p, nbytes, c) for (a, p), (lat, bw) in table.items() if bw > 0
    }
    if not cands:
        raise ValueError(f"no algorithm/protocol available for {coll}")
    (a, p), t = min(cands.items(), key=lambda kv: kv[1])
    return a, p, t, cands


def arch_from_gpu_name(name: str | None) -> str | None:
    """GPU generation from a device name (nccl-tests device list, Kineto deviceProperties)."""
    if not name:
        return None
    n = name.upper()
    if any(k in n for k in ("B100", "B200", "GB200", "B300", "RTX PRO 6000", "BLACKWELL")):
        return "blackwell"
    if any(k in n for k in ("H100", "H200", "H800", "H20", "GH200")):
        return "hopper"
    if any(k in n for k in ("A100", "A800", "A10", "A30", "A40", "A6000", "A5000", "A4000", "A2000", "L4", "L40",
                            "RTX 30", "RTX 40")):
        return "ampere"
    if any(k in n for k in ("T4", "RTX 20", "QUADRO RTX", "TITAN RTX")):
        return "turing"
    if any(k in n for k in ("V100", "TITAN V")):
        return "volta"
    if any(k in n for k in ("P100", "P40", "P4", "P2200", "P2000", "P4000", "P5000", "P6000", "GTX 10", "TITAN X")):
        return "pascal"
    if any(k in n for k in ("M40", "M60", "M4000", "M2000", "GTX 9")):
        return "maxwell"
    if any(k in n for k in ("K80", "K40", "K620", "K2200", "K1200", "K5000", "K6000")):
        return "kepler"
    return None
