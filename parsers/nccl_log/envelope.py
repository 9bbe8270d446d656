"""The NCCL envelope (``host:pid:tid [dev] NCCL INFO|WARN ...``) and the INFO and WARN messages inside it: init,
bootstrap, transports, channels, rings and trees, tuning tables, collectives, versions."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from forensics.parsers.nccl_log.rows import VERSION_HINTS, Acc, note_version, to_float, to_int
from forensics.parsers.timestamps import iso_utc_ns

from forensics.base.bus_ids import normalize_bus_id

# --- envelope -------------------------------------------------------------------------------
# search, not match: launchers put their own tags in front ([1,3]<stdout>:, [0] , Ray, timestamps).
ENVELOPE = re.compile(
    r"(?P<host>[^\s:\[\]()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<tsms>\d+\.\d+) )?"
    # the source is `file:line`, or (net plugins such as aws-ofi-nccl) a C++ signature `int f(T*, U):46`
    r"(?:(?P<src>[\w./\-]+:\d+|[\w:<>~*& ]+\([^()]*\)(?: const)?:\d+)(?: \((?P<func>[^)]*)\))? )?"
    r"NCCL (?P<level>INFO|WARN|TRACE|ERROR) ?(?P<msg>.*)$"
)
# host part stripped by the user or a tool: `[3] NCCL INFO ...`
ENVELOPE_NOHOST = re.compile(
    r"^\s*(?:\[(?P<dev>\d+)\] )?(?:(?P<src>[\w./\-]+:\d+)(?: \((?P<func>[^)]*)\))? )?"
    r"NCCL (?P<level>INFO|WARN) (?P<msg>.*)$"
)
MPI_TAG = re.compile(r"\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:")
# the 2.26+ WARN prefix (a line's other stamps: forensics.parsers.timestamps.LINE_STAMP)
WARN_TS = re.compile(r"^\[(?P<d>\d{4}-\d\d-\d\d) (?P<t>\d\d:\d\d:\d\d)\] ")
LAUNCHER_TAGS = re.compile(r"\[\d+(?:,\d+)?\](?:<std(?:out|err)>:)?|^\d{4}-\d\d-\d\dT[\d:.]+Z?:\s*|^\(\w+ "
                           r"pid=\d+[^)]*\)\s*")
VERSION = re.compile(r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?P<suffix>[^+\s]*)\+cuda(?P<cuda>\d+\.\d+)")

_I = {
    "bootstrap": r"^Bootstrap ?: ?Using ?(?P<ifaces>.+)$",
    "net_ib_using": r"^NET/IB ?: ?Using(?P<devs>(?: \[\d+\][^\s:]+:\d+/[A-Za-z]+(?:/SHARP)?)*)\s*(?P<ro>\[RO\])?\s*; "
                    r"OOB (?P<oob>\S+)$",
    "net_ib_nodev": r"^NET/IB ?: ?No device found\.?$",
    "net_socket_using": r"^NET/Socket ?: ?Using(?P<devs>(?: \[\d+\][^\s:]+:\S*)+)$",
    "using_network": r"^Using network (?P<net>.+?)\s*$",
    "net_ofi_provider": r"^NET/OFI Selected [Pp]rovider is (?P<prov>[^\s,]+)",
    "net_ofi_gdr_off": r"^NET/OFI (?:.*disabling GDR.*|Need to force simple protocol: GDR not supported.*)$",
    "net_ofi_env": r"^NET/OFI Adding (?P<var>\w+)=(?P<val>\S+) to environment",
    "gdr_hca": r"^NET/(?P<net>\S+) ?: ?GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<hca>\d+) "
               r"'(?P<name>[^']*)'(?P<extra>.*)$",
    "gdr_gpu": r"^GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU (?P<gpu>[0-9a-fx]+) / HCA (?P<hca>[0-9a-fx]+) "
               r"\(distance (?P<dist>\d+) (?:<=|>) (?P<lvl>\d+)\)(?P<extra>.*)$",
    "env": r"^(?P<var>NCCL_[A-Z0-9_]+) (?:set by environment to|set to) (?P<val>.*?)\.?\s*$",
    "ring_list": r"^Channel (?P<ch>\d+)/(?P<nch>\d+) :(?P<ranks>(?:\s+\d+)+)\s*(?:\.\.\.)?\s*$",
    "trees": r"^Trees(?P<trees>(?: \[\d+\] \S+)+)\s*$",
    "ring_graph": r"^Ring (?P<ch>\d+) : (?P<prev>\d+) -> (?P<me>\d+) -> (?P<next>\d+)\s*$",
    "tree_graph": r"^Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<me>\d+) -> (?P<down>-?\d+/-?\d+/-?\d+)\s*$",
    "nvls_trees": r"^NVLS Trees : .*$",
    "transport": r"^(?P<kw>Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<srcdev>[0-9a-f]+)\] -> "
                 r"(?P<dst>\d+)\[(?P<dstdev>[0-9a-f]+)\] (?:\[(?P<dir>send|receive)\] )?via (?P<via>.+?)\s*$",
    "comm_init": r"^(?:\[Rank \d+\] )?(?:(?P<func>\w+) )?comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks "
                 r"(?P<nranks>\d+) cudaDev (?P<cudaDev>\d+)(?: nvmlDev (?P<nvmlDev>\d+))?(?: busId "
                 r"(?P<busId>[0-9a-f]+))?(?: parent (?P<parent>\S+))?(?: splitCount \d+)?(?: color (?P<color>-?\d+) "
                 r"key (?P<key>-?\d+))?(?: commId (?P<commId>0x[0-9a-f]+))? ?- (?P<phase>Init START|Init "
                 r"COMPLETE|Destroy COMPLETE|Abort COMPLETE)\s*$",
    "comm_layout": r"^comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
                   r"localRanks (?P<localRanks>\d+) localRank (?P<localRank>\d+)(?: MNNVL (?P<mnnvl>\d+))?",
    "init_timings": r"^Init timings(?: - (?P<func>\w+))?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) total "
                    r"(?P<total>[\d.]+) \((?P<parts>[^)]*)\)",
    "thread_thresholds": r"^threadThresholds (?P<vals>[\d/ |]+?)\s*$",
    "channels_summary": r"^(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?:(?P<nvls>\d+) nvls "
                        r"channels, )?(?P<p2p>\d+) p2p channels, (?P<p2pPerPeer>\d+) p2p channels per peer\s*$",
    "connected": r"^Connected (?P<what>all rings|all trees|NVLS tree|binomial trees|Collnet Chains|CollNet)(?:, use "
                 r"ring PXN (?P<pxn>\d+) GDR (?P<gdr>\d+))?.*$",
    "nvls_support": r"^NVLS multicast support is (?P<neg>not )?available on dev (?P<dev>\d+)(?: \(NVLS_NCHANNELS "
                    r"(?P<n>\d+)\))?\s*$",
    "nvls_comm": r"^NVLS comm 0x[0-9a-f]+ headRank .*$",
    "collnet_conn": r"^CollNet (?P<ch>\d+)/(?P<conn>\d) : (?P<rank>\d+) \[(?P<dir>send|receive)\] via "
                    r"COLLNET/(?P<net>\S+)/(?P<dev>\d+)(?P<rest>.*)$",
    "p2p_chunk": r"^P2P Chunksize set to \d+\s*$",
    "topo_system": r"^=== System : maxBw (?P<maxBw>[\d.]+) totalBw (?P<totalBw>[\d.]+) ===\s*$",
    "graph_pattern": r"^Pattern (?P<pattern>\d+), crossNic (?P<crossNic>\d+), nChannels (?P<nch>\d+), (?:bw|speed) "
                     r"(?P<bwIntra>[\d.]+)/(?P<bwInter>[\d.]+), type (?P<typeIntra>\w+)/(?P<typeInter>\w+), "
                     r"sameChannels (?P<same>\d+)\s*$",
    "tuning_hdr_old": r"^\s*Latency/AlgBw \|(?P<cols>.*)$",
    "tuning_hdr_new": r"^\s*(?P<which>Algorithm|Protocol)\s+\|(?P<cols>.*)$",
    "tuning_nthreads": r"^\s*Max NThreads \|(?P<vals>.*)$",
    "tuning_row": r"^\s*(?P<coll>Broadcast|Reduce|AllGather|ReduceScatter|AllReduce|SendRecv|AlltoAll|Gather|Scatter) "
                  r"\|(?P<cells>(?:\s*[\d.]+/\s*[\d.]+ \|)+)\s*$",
    "tuning_op": r"^(?:(?P<func>[A-Za-z]+)(?: \[(?P<variant>[^\]]+)\])?: )?(?P<bytes>\d+) Bytes -> (?:Algo "
                 r"(?P<algo>\w+) proto (?P<proto>\w+)(?: time (?P<time>[\d.]+))?(?: "
                 r"channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?|Kernel (?P<kernel>\S+) nchannels (?P<nch>\d+) "
                 r"nthreads (?P<nt>\d+)(?: nWorks (?P<nw>\d+))?|(?P<other>.*))\s*$",
    "coll_op": r"^(?P<op>AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv|AlltoAll|Gather|Scatter): "
               r"opCount (?P<opCount>[0-9a-f]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+) count "
               r"(?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) comm "
               r"(?P<comm>0x[0-9a-f]+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)\s*$",
    "err_trace": r"^(?P<file>[\w/.]+\.(?:cc|cu|h|cpp)):(?P<line>\d+) -> (?P<ret>\d+)(?: \[(?P<thread>[^\]]+)\])?\s*$",
    "net_plugin": r"^(?:NET/Plugin ?: ?.*|Plugin Path : .*|P2P plugin .+|Using non-device net plugin version "
                  r"\d+|(?:Initialized|Assigned) NET plugin .*|Successfully loaded external (?:network )?plugin "
                  r".*|NET/OFI .*|SHARP .*|TUNER/Plugin: .*|PROFILER/Plugin: .*|NET/Plugin: .*)$",
    "version": r"^NCCL version .*$",
    "misc": r"^(?:cudaDriverVersion \d+|Setting affinity for GPU \d+ to [0-9a-f,]+|Threads per block : .*|\[Proxy "
            r"(?:Service|Service UDS|Progress)\] Device \d+ CPU core \d+|CC (?:On|Off).*workFifoBytes \d+|[\w/.]+:\d+ "
            r"Cuda (?:Host )?Alloc Size \d+ pointer 0x[0-9a-f]+|Enabled NCCL Func/Proto/Algo Matrix:.*|comm "
            r"0x[0-9a-f]+ rank \d+ nRanks .*|Search \d+ : .*|RAS client listening socket .*|Comm config \w+ set to "
            r".*|DMA-BUF is (?:not )?available on GPU device \d+|Bootstrap timings total .*|NET/IB : Made virtual "
            r"device .*|ncclTopoGetCpuAffinity: .*|NVLS comm .*|MNNVL .*|NET/IB : Using \[.*|NCCL_\w+ set by "
            r"environment.*|Init (?:START|COMPLETE).*|Allocated .*|ncclCommInit.*)\s*$",
    "check_p2p": r"^Check P2P Type (?:intraNodeP2pSupport (?P<p2p>\d+) directMode (?P<direct>\d+)|isAllDirectP2p "
                 r"(?P<alldirect>\d+) directMode (?P<direct2>\d+)(?: isAllCudaP2p (?P<allcuda>\d+))?)",
    "topo_tree": r"^\s*(?:\+ (?P<link>[A-Z]+)\[(?P<bw>[\d.]+)\] - "
                 r")?(?P<node>(?:CPU|PCI|GPU|NIC|NET|NVS)/[0-9A-Fa-fx-]+)(?P<attrs>.*)$",
    "graph_channel": r"^\s*(?P<ch>\d+) : (?P<path>(?:(?:GPU|NET|NVS)/\S+ ?)+)$",
}
INFO_RX = {k: re.compile(v) for k, v in _I.items()}

_W = {
    "ib_async": r"^NET/IB ?: (?:(?P<dev>\S+):(?P<port>\d+) )?(?:Got async event ?: ?|Got non-fatal async event: |async "
                r"fatal event(?: on (?:CQ|QP|SRQ)[^:]*)?: )(?P<event>.+?)\s*$",
    "ib_completion": r"^NET/IB ?: ?Got completion (?:from peer (?P<peer>\S+) )?with (?:error "
                     r"(?P<err>\d+)|status=(?P<status>\w+?)(?:\((?P<statusnum>\d+)\))?),? opcode[ "
                     r"=](?P<opcode>[\w()]+),? (?:len[ =](?P<len>\d+)|reqSize=(?P<reqSize>\d+)),? vendor[ _]err[ "
                     r"=]?(?P<verr>\d+)(?P<rest>.*)$",
    "call_failed": r"^Call to (?P<fn>\S+)(?: from (?P<peer>\S+))? failed(?: with (?:error )?(?P<err>.+?))?(?: : "
                   r"(?P<err2>.+))?\s*$",
    "cuda_failure": r"^Cuda failure (?:(?P<code>\d+) )?'(?P<msg>[^']*)'",
    "socket_closed": r"^(?:socketProgress: )?(?:Net : )?Connection closed by remote peer (?P<peer>\S+)",
    # `Net : ` up to 2.18 (ncclSystemError), `socketProgressOpt: ` from 2.19 (ncclRemoteError)
    "net_recv_failed": r"^(?:Net : |socketProgressOpt: )Call to (?:recv from|send to) (?P<peer>\S+) failed : "
                       r"(?P<err>.+)$",
    # a connect to a peer's socket that failed (`Net : ` up to 2.18, `socketStartConnect: ` from 2.19)
    "connect_failed": r"^(?:Net : |socketStartConnect: )Connect to (?P<peer>\S+) failed : (?P<err>.+)$",
    "proxy_error": r"^\[(?:Service thread|Proxy Service[^\]]*)\] (?P<msg>.*)$",
    "no_algo": r"^Error : no algorithm/protocol available.*$",
    # provider errors of the AWS OFI plugin (EFA, libfabric): a request completed with an error, an address or
    # endpoint that cannot be set up; `Peer EFA addr` / `Peer host id` name the other side
    "ofi_error": r"^NET/OFI (?:.*?completed with error\. RC: (?P<rc>-?\d+)(?:\. Error: (?P<err>-?\d+) "
                 r"\((?P<what>[^)]*)\))?"
                 r"(?:.*?Peer EFA addr: (?P<peeraddr>\S+))?(?:.*?Peer host id: (?P<peerhost>\S+))?"
                 r"|(?P<cfg>Unable to insert remote address|Couldn't open AV|Creating new endpoint|Unable to|Couldn't|"
                 r"OFI call \S+ failed|.*\bfailed\b).*)",
    # an NCCL call returned ncclRemoteError with its reason in the WARN text
    "remote_error": r"^.*(?:remote process exited or there was a network error|Remote process exited).*$",
    "no_libibverbs": r"^Failed to open libibverbs\.so.*$",
}
WARN_RX = {k: re.compile(v) for k, v in _W.items()}

COLL_NAMES = {
    "all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
    "alltoall": "AlltoAll", "broadcast": "Broadcast", "reduce": "Reduce", "sendrecv": "SendRecv",
    "gather": "Gather", "scatter": "Scatter", "hypercube": "Hypercube",
}
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
          "bfloat16", "fp8e4m3", "fp8e5m2"]
DTYPE_SIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2,
              "float32": 4, "float64": 8, "bfloat16": 2, "fp8e4m3": 1, "fp8e5m2": 1}
REDOPS = ["sum", "prod", "max", "min", "avg"]
ALGO_IDS = ["Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"]
PROTO_IDS = ["LL", "LL128", "Simple"]
NET_VIA = re.compile(r"^NET/(?P<net>.+?)/(?P<nic>\d+)(?:\((?P<proxy>\d+)\))?(?P<rest>(?:/GDRDMA|\(PCI\)|/Shared|/\S+)*)"
                     r"$")
P2P_VIA = re.compile(r"^P2P/(?P<kind>IPC|CUMEM|MNNVL|direct pointer|common device|indirect)")
SOCKET_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<ifname>[^\s:]+):(?P<addr>\S*)")
IB_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:]+):(?P<port>\d+)/(?P<link>IB|RoCE)(?P<sharp>/SHARP)?")


def _match_info(msg: str) -> tuple[str, re.Match[str]] | None:
    """The first INFO_RX pattern that matches ``msg`` (order matters: specific patterns come first)."""
    for kind, rx in INFO_RX.items():
        m = rx.match(msg)
        if m:
            return kind, m
    return None


def info_line(acc: Acc, base: dict[str, Any], msg: str, src: str | None) -> bool:
    if not msg:
        return True  # `NCCL INFO` with nothing after it (WARN separators, cut lines)
    found = _match_info(msg)
    if found is None:
        return False
    kind, m = found
    g = m.groupdict()
    hint = VERSION_HINTS.get(kind)
    if hint:
        note_version(acc, *hint(g))
    handler = _INFO_HANDLERS.get(kind)
    # a handler returns False when the line only looked like its kind; other kinds are known and carry nothing
    return handler is None or handler(acc, base, g, msg) is not False


_InfoHandler = Callable[[Acc, dict[str, Any], dict[str, Any], str], "bool | None"]


def _i_comm_init(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add(
        "nccl_comms", **{**base, "cuda_dev": int(g["cudaDev"])}, origin="init", comm=g["comm"], comm_id=g["commId"],
        rank=int(g["rank"]),
        nranks=int(g["nranks"]), nvml_dev=to_int(g["nvmlDev"]),
        bus_id=normalize_bus_id(g["busId"], bare="packed"), phase=g["phase"], func=g["func"],
    )


def _i_comm_layout(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.rows["_layout"].append({"host": base["host"], "pid": base["pid"], "comm": g["comm"],
                                "nnodes": int(g["nnodes"]), "local_ranks": int(g["localRanks"])})


def _i_bootstrap(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    devs = list(SOCKET_DEV.finditer(g["ifaces"]))
    if devs:
        for d in devs:
            acc.add("nccl_net", **base, kind="bootstrap", index=int(d["idx"]), name=d["ifname"], address=d["addr"])
    else:
        name, _, addr = g["ifaces"].strip().partition(":")
        acc.add("nccl_net", **base, kind="bootstrap", index=0, name=name, address=addr)


def _i_net_socket_using(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    for d in SOCKET_DEV.finditer(g["devs"]):
        acc.add("nccl_net", **base, kind="socket", index=int(d["idx"]), name=d["ifname"], address=d["addr"])


def _i_net_ib_using(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    for d in IB_DEV.finditer(g["devs"]):
        acc.add("nccl_net", **base, kind="ib", index=int(d["idx"]), name=d["name"], port=int(d["port"]),
                link_layer=d["link"], detail=g["oob"])


def _i_gdr_hca(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add("nccl_net", **base, kind="gdr_hca", index=int(g["hca"]), name=g["name"], state=g["state"],
            detail=f"NET/{g['net']}{g['extra']}")


def _i_coll_op(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    dtype = DTYPES[int(g["dtype"])] if int(g["dtype"]) < len(DTYPES) else g["dtype"]
    redop = int(g["redop"])
    acc.add(
        "nccl_calls", **base, kind="coll", op=g["op"], comm=g["comm"], op_count=int(g["opCount"], 16),
        count=int(g["count"]), datatype=dtype, redop=REDOPS[redop] if redop < 5 else "premulsum",
        root=int(g["root"]), nranks=int(g["nranks"]),
        bytes=int(g["count"]) * DTYPE_SIZE[dtype] if dtype in DTYPE_SIZE else None,
    )


def _i_tuning_op(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> bool:
    if g["other"] is not None and not g["other"].startswith("cudaMemcpy"):
        return False
    algo, proto = g["algo"], g["proto"]
    if algo is not None and algo.isdigit():
        algo = ALGO_IDS[int(algo)] if int(algo) < len(ALGO_IDS) else algo
    if proto is not None and proto.isdigit():
        proto = PROTO_IDS[int(proto)] if int(proto) < len(PROTO_IDS) else proto
    acc.add(
        "nccl_calls", **base, kind="tuning", op=g["func"],
        bytes=int(g["bytes"]), algo=algo if algo else g["kernel"], proto=proto,
        predicted_us=to_float(g["time"]), chan_lo=to_int(g["lo"]), chan_hi=to_int(g["hi"]),
    )
    return True


def _i_tuning(kind: str) -> _InfoHandler:
    return lambda acc, base, g, msg: _tuning(acc, base, kind, g)


def _i_collnet_conn(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add("nccl_channels", **base, channel=int(g["ch"]), conn_index=int(g["conn"]), src_rank=int(g["rank"]),
            direction=g["dir"], transport="COLLNET", via=msg.split(" via ", 1)[1], net=g["net"], nic=int(g["dev"]),
            gdr="/GDRDMA" in g["rest"], shared="/Shared" in g["rest"])


def _i_ring_list(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add("nccl_events", **base, level="INFO", kind="ring_order", code=int(g["ch"]), value=float(g["nch"]),
            message=" ".join(g["ranks"].split()))


def _i_event(kind: str) -> _InfoHandler:
    """The whole line as an `nccl_events` row of ``kind`` (tree and ring graphs)."""
    return lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind=kind, message=msg)


def _i_thread_thresholds(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    vals = [int(v) for v in re.findall(r"\d+", g["vals"])]
    if len(vals) >= 4:
        acc.add("nccl_events", **base, level="INFO", kind="thread_thresholds", value=vals[3] / 8.0, message=msg)


def _i_check_p2p(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    # intraNodeP2pSupport (2.24-2.26) / isAllCudaP2p (2.27+) = 0: CUDA P2P between the local GPUs is off
    p2p = g["p2p"] if g["p2p"] is not None else g["allcuda"]
    acc.add("nccl_events", **base, level="INFO", kind="p2p_check", code=to_int(p2p), message=msg)


def _i_connected(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    if g["gdr"] is not None:
        acc.add("nccl_events", **base, level="INFO", kind="connected", code=int(g["gdr"]),
                value=float(g["pxn"]), message=msg)


def _i_topo_tree(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    if g["link"]:
        acc.add("nccl_events", **base, level="INFO", kind="topo_link", value=float(g["bw"]),
                peer=g["node"], message=f"{g['link']} {g['node']}")


def _i_version(acc: Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    vm = VERSION.search(msg)
    if vm:
        acc.version = acc.version or vm["ver"]


_INFO_HANDLERS: dict[str, _InfoHandler] = {
    "transport": lambda acc, base, g, msg: _transport(acc, base, g),
    "comm_init": _i_comm_init,
    "comm_layout": _i_comm_layout,
    "env": lambda acc, base, g, msg: acc.add("nccl_env", **base, var=g["var"], value=g["val"].strip(), origin="nccl"),
    "bootstrap": _i_bootstrap,
    "net_socket_using": _i_net_socket_using,
    "net_ib_using": _i_net_ib_using,
    "net_ib_nodev": lambda acc, base, g, msg: acc.add("nccl_net", **base, kind="ib_none", detail=msg),
    "using_network": lambda acc, base, g, msg: acc.add("nccl_net", **base, kind="network", name=g["net"]),
    "net_ofi_provider": lambda acc, base, g, msg: acc.add("nccl_net", **base, kind="ofi_provider", name=g["prov"]),
    "gdr_hca": _i_gdr_hca,
    "gdr_gpu": lambda acc, base, g, msg: acc.add("nccl_net", **base, kind="gdr_gpu", name=g["gpu"], state=g["state"],
                                                 detail=msg),
    "net_plugin": lambda acc, base, g, msg: acc.add("nccl_net", **base, kind="plugin", name=msg.split(":")[0].strip(),
                                                    detail=msg),
    "coll_op": _i_coll_op,
    "tuning_op": _i_tuning_op,
    **{k: _i_tuning(k) for k in ("tuning_hdr_old", "tuning_hdr_new", "tuning_nthreads", "tuning_row")},
    "collnet_conn": _i_collnet_conn,
    "ring_list": _i_ring_list,
    "trees": _i_event("trees"),
    "tree_graph": _i_event("trees"),
    "nvls_trees": _i_event("trees"),
    "ring_graph": _i_event("ring_graph"),
    "thread_thresholds": _i_thread_thresholds,
    "channels_summary": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="channels",
                                                          value=float(g["coll"]), code=to_int(g["nvls"]), message=msg),
    "nvls_support": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="nvls_support",
                                                      code=0 if g["neg"] else 1, message=msg),
    "check_p2p": _i_check_p2p,
    "net_ofi_gdr_off": lambda acc, base, g,
    msg: acc.add("nccl_net", **base, kind="gdr_hca", name="OFI", state="Disabled",
                                                         detail="NET/OFI " + msg[8:]),
    # the plugin sets NCCL variables itself (e.g. NCCL_PROTO=simple on EFA without GDR)
    "net_ofi_env": lambda acc, base, g, msg: acc.add("nccl_env", **base, var=g["var"], value=g["val"], origin="plugin"),
    "connected": _i_connected,
    "init_timings": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="init_timings",
                                                      value=float(g["total"]), message=msg),
    "topo_system": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="topo_system",
                                                     value=float(g["maxBw"]), message=msg),
    "topo_tree": _i_topo_tree,
    "graph_pattern": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="graph_pattern",
                                                       value=float(g["bwInter"]), code=int(g["nch"]), message=msg),
    "err_trace": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="error_trace",
                                                   code=int(g["ret"]), file_line=f"{g['file']}:{g['line']}",
                                                   message=msg),
    "version": _i_version,
}


def _transport(acc: Acc, base: dict[str, Any], g: dict[str, Any]) -> None:
    via = g["via"]
    busid = len(g["srcdev"]) >= 4  # a busId (>= 0x1000 for bus 01) is never a device index
    if g["kw"] == "Ring":
        note_version(acc, *(("2.5", "2.6") if busid else (None, "2.4")))
    elif busid:
        note_version(acc, lo="2.7", hi="2.18.1")
    else:
        note_version(acc, lo="2.18.3")  # a device index, not a busId, in the bracket
    row: dict[str, Any] = dict(
        channel=int(g["ch"]), conn_index=to_int(g["conn"]), src_rank=int(g["src"]), dst_rank=int(g["dst"]),
        direction=g["dir"], via=via,
    )
    # the bracket holds a busId up to 2.18.1 and a device index after (and in 2.4 `Ring` lines)
    for side in ("src", "dst"):
        text = g[side + "dev"]
        if len(text) >= 4:
            row[side + "_bus_id"] = normalize_bus_id(text, bare="packed")
        elif text.isdigit():
            row[side + "_dev"] = int(text)
    nm = NET_VIA.match(via)
    if via.startswith("NET/") and nm:
        rest = nm["rest"] or ""
        row.update(transport="NET", net=nm["net"], nic=int(nm["nic"]), proxy_rank=to_int(nm["proxy"]),
                   gdr="/GDRDMA" in rest, shared="/Shared" in rest)
    elif via.startswith("P2P"):
        pm = P2P_VIA.match(via)
        row.update(transport="P2P", p2p_kind=pm["kind"] if pm else None)
    elif via.startswith("SHM") or "shared memory" in via:
        row.update(transport="SHM")
    elif via.startswith("COLLNET"):
        row.update(transport="COLLNET")
    else:
        row.update(transport=via.split("/")[0])
    acc.add("nccl_channels", **base, **row)


def _tuning(acc: Acc, base: dict[str, Any], kind: str, g: dict[str, Any]) -> None:
    # a table is a run of consecutive TUNING lines; 2.18+ prints it in blocks of 3 algorithms
    if base["line"] != acc.tuning_last + 1:
        acc.tuning_table += 1
        acc.tuning_algos, acc.tuning_cols, acc.tuning_nthreads = [], [], []
    acc.tuning_last = base["line"]
    if kind == "tuning_hdr_old":
        acc.tuning_cols = [
            (a.strip(), p.strip()) for a, p in (c.split("/") for c in g["cols"].split("|") if "/" in c)
        ]
    elif kind == "tuning_hdr_new":
        names = [c.strip() for c in g["cols"].split("|") if c.strip()]
        if g["which"] == "Algorithm":
            acc.tuning_algos = names
        else:
            per = max(1, len(names) // max(1, len(acc.tuning_algos)))
            acc.tuning_cols = [(a, names[i * per + j]) for i, a in enumerate(acc.tuning_algos) for j in range(per)
                               if i * per + j < len(names)]
    elif kind == "tuning_nthreads":
        acc.tuning_nthreads = [int(v) for v in re.findall(r"\d+", g["vals"])]
    else:
        cells = re.findall(r"([\d.]+)/\s*([\d.]+)", g["cells"])
        for i, (lat, bw) in enumerate(cells):
            algo, proto = acc.tuning_cols[i] if i < len(acc.tuning_cols) else (None, None)
            acc.add(
                "nccl_tuning", **base, table=acc.tuning_table, collective=g["coll"], algo=algo,
                proto=proto, latency_us=float(lat), bw_gbps=float(bw),
                max_nthreads=acc.tuning_nthreads[i] if i < len(acc.tuning_nthreads) else None,
            )


def warn_line(acc: Acc, base: dict[str, Any], msg: str, src: str | None) -> bool:
    ts = WARN_TS.match(msg)
    if ts:
        note_version(acc, lo="2.26")
        base = {**base, "time_ns": base.get("time_ns") or iso_utc_ns(ts["d"], ts["t"], None)}
        msg = msg[ts.end():]
    row = dict(**base, level="WARN", file_line=src, message=msg)
    for kind, rx in WARN_RX.items():
        m = rx.match(msg)
        if m:
            g = m.groupdict()
            code: int | None = None
            peer = g.get("peer")
            if kind == "ib_completion":
                code = to_int(g["err"]) if g["err"] is not None else to_int(g["statusnum"])
                if code is None and g["status"] and g["status"].isdigit():
                    code = int(g["status"])
            elif kind == "cuda_failure":
                code = to_int(g["code"])
            elif kind == "ib_async":
                peer = g["dev"]
            elif kind == "proxy_error":
                rm = re.search(r"(?:res|retcode)[= ](\d+)", msg)
                code = int(rm.group(1)) if rm else None
            elif kind == "ofi_error":
                code = to_int(g["rc"])
                peer = next((v.rstrip(").,") for v in (g["peerhost"], g["peeraddr"]) if v and not v.startswith("N/A")),
                            None)
            acc.add("nccl_events", **row, kind=kind, code=code, peer=peer)
            return True
    acc.add("nccl_events", **row, kind="warn_other")
    return True  # an unclassified WARN is still kept, with its text
