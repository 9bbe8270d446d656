"""NCCL_DEBUG=INFO logs (NCCL 2.4 ... 2.30), PyTorch ProcessGroupNCCL messages, NCCL RAS output and
nccl-tests tables, from files that are mostly training output.

Every line is classified; NCCL-envelope lines whose message is not understood are counted per file
(``nccl_files.nccl_unknown`` and the ParseResult message), never silently dropped. Formats follow
``research/nccl.md`` §A (format strings per release tag).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl
from forensics.parsers.common import (
    DecompressionLimitExceeded,
    LongLines,
    ParseContext,
    ParseResult,
    open_bounded,
    read_lines,
)

from forensics.base import frames as fr
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
# wall-clock times a line can carry: a launcher's ISO prefix (`2019-06-02T16:13:44.884Z: `), the 2.26+ WARN prefix
# and NCCL_DEBUG_TIMESTAMP_FORMAT's default `[2026-01-01 12:08:32] ` in front of the envelope (2.26+)
LINE_ISO = re.compile(r"^\s*(?:(?P<d>\d{4}-\d\d-\d\d)T(?P<t>\d\d:\d\d:\d\d(?:\.\d{1,9})?)(?P<z>Z|[+-]\d\d:?\d\d)?:?"
                      r"|\[(?P<d2>\d{4}-\d\d-\d\d) (?P<t2>\d\d:\d\d:\d\d(?:\.\d{1,9})?)\])\s")
WARN_TS = re.compile(r"^\[(?P<d>\d{4}-\d\d-\d\d) (?P<t>\d\d:\d\d:\d\d)\] ")
LAUNCHER_TAGS = re.compile(r"\[\d+(?:,\d+)?\](?:<std(?:out|err)>:)?|^\d{4}-\d\d-\d\dT[\d:.]+Z?:\s*|^\(\w+ pid=\d+[^)]*\)\s*")
VERSION = re.compile(r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?P<suffix>[^+\s]*)\+cuda(?P<cuda>\d+\.\d+)")
RAS_VERSION = re.compile(r"^NCCL version (?P<ver>[\d.]+) compiled with CUDA (?P<cuda>[\d.]+)")

_I = {
    "bootstrap": r"^Bootstrap ?: ?Using ?(?P<ifaces>.+)$",
    "net_ib_using": r"^NET/IB ?: ?Using(?P<devs>(?: \[\d+\][^\s:]+:\d+/[A-Za-z]+(?:/SHARP)?)*)\s*(?P<ro>\[RO\])?\s*; OOB (?P<oob>\S+)$",
    "net_ib_nodev": r"^NET/IB ?: ?No device found\.?$",
    "net_socket_using": r"^NET/Socket ?: ?Using(?P<devs>(?: \[\d+\][^\s:]+:\S*)+)$",
    "using_network": r"^Using network (?P<net>.+?)\s*$",
    "net_ofi_provider": r"^NET/OFI Selected [Pp]rovider is (?P<prov>[^\s,]+)",
    "net_ofi_gdr_off": r"^NET/OFI (?:.*disabling GDR.*|Need to force simple protocol: GDR not supported.*)$",
    "net_ofi_env": r"^NET/OFI Adding (?P<var>\w+)=(?P<val>\S+) to environment",
    "gdr_hca": r"^NET/(?P<net>\S+) ?: ?GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<hca>\d+) '(?P<name>[^']*)'(?P<extra>.*)$",
    "gdr_gpu": r"^GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU (?P<gpu>[0-9a-fx]+) / HCA (?P<hca>[0-9a-fx]+) \(distance (?P<dist>\d+) (?:<=|>) (?P<lvl>\d+)\)(?P<extra>.*)$",
    "env": r"^(?P<var>NCCL_[A-Z0-9_]+) (?:set by environment to|set to) (?P<val>.*?)\.?\s*$",
    "ring_list": r"^Channel (?P<ch>\d+)/(?P<nch>\d+) :(?P<ranks>(?:\s+\d+)+)\s*(?:\.\.\.)?\s*$",
    "trees": r"^Trees(?P<trees>(?: \[\d+\] \S+)+)\s*$",
    "ring_graph": r"^Ring (?P<ch>\d+) : (?P<prev>\d+) -> (?P<me>\d+) -> (?P<next>\d+)\s*$",
    "tree_graph": r"^Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<me>\d+) -> (?P<down>-?\d+/-?\d+/-?\d+)\s*$",
    "nvls_trees": r"^NVLS Trees : .*$",
    "transport": r"^(?P<kw>Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<srcdev>[0-9a-f]+)\] -> (?P<dst>\d+)\[(?P<dstdev>[0-9a-f]+)\] (?:\[(?P<dir>send|receive)\] )?via (?P<via>.+?)\s*$",
    "comm_init": r"^(?:\[Rank \d+\] )?(?:(?P<func>\w+) )?comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cudaDev>\d+)(?: nvmlDev (?P<nvmlDev>\d+))?(?: busId (?P<busId>[0-9a-f]+))?(?: parent (?P<parent>\S+))?(?: splitCount \d+)?(?: color (?P<color>-?\d+) key (?P<key>-?\d+))?(?: commId (?P<commId>0x[0-9a-f]+))? ?- (?P<phase>Init START|Init COMPLETE|Destroy COMPLETE|Abort COMPLETE)\s*$",
    "comm_layout": r"^comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) localRanks (?P<localRanks>\d+) localRank (?P<localRank>\d+)(?: MNNVL (?P<mnnvl>\d+))?",
    "init_timings": r"^Init timings(?: - (?P<func>\w+))?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) total (?P<total>[\d.]+) \((?P<parts>[^)]*)\)",
    "thread_thresholds": r"^threadThresholds (?P<vals>[\d/ |]+?)\s*$",
    "channels_summary": r"^(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?:(?P<nvls>\d+) nvls channels, )?(?P<p2p>\d+) p2p channels, (?P<p2pPerPeer>\d+) p2p channels per peer\s*$",
    "connected": r"^Connected (?P<what>all rings|all trees|NVLS tree|binomial trees|Collnet Chains|CollNet)(?:, use ring PXN (?P<pxn>\d+) GDR (?P<gdr>\d+))?.*$",
    "nvls_support": r"^NVLS multicast support is (?P<neg>not )?available on dev (?P<dev>\d+)(?: \(NVLS_NCHANNELS (?P<n>\d+)\))?\s*$",
    "nvls_comm": r"^NVLS comm 0x[0-9a-f]+ headRank .*$",
    "collnet_conn": r"^CollNet (?P<ch>\d+)/(?P<conn>\d) : (?P<rank>\d+) \[(?P<dir>send|receive)\] via COLLNET/(?P<net>\S+)/(?P<dev>\d+)(?P<rest>.*)$",
    "p2p_chunk": r"^P2P Chunksize set to \d+\s*$",
    "topo_system": r"^=== System : maxBw (?P<maxBw>[\d.]+) totalBw (?P<totalBw>[\d.]+) ===\s*$",
    "graph_pattern": r"^Pattern (?P<pattern>\d+), crossNic (?P<crossNic>\d+), nChannels (?P<nch>\d+), (?:bw|speed) (?P<bwIntra>[\d.]+)/(?P<bwInter>[\d.]+), type (?P<typeIntra>\w+)/(?P<typeInter>\w+), sameChannels (?P<same>\d+)\s*$",
    "tuning_hdr_old": r"^\s*Latency/AlgBw \|(?P<cols>.*)$",
    "tuning_hdr_new": r"^\s*(?P<which>Algorithm|Protocol)\s+\|(?P<cols>.*)$",
    "tuning_nthreads": r"^\s*Max NThreads \|(?P<vals>.*)$",
    "tuning_row": r"^\s*(?P<coll>Broadcast|Reduce|AllGather|ReduceScatter|AllReduce|SendRecv|AlltoAll|Gather|Scatter) \|(?P<cells>(?:\s*[\d.]+/\s*[\d.]+ \|)+)\s*$",
    "tuning_op": r"^(?:(?P<func>[A-Za-z]+)(?: \[(?P<variant>[^\]]+)\])?: )?(?P<bytes>\d+) Bytes -> (?:Algo (?P<algo>\w+) proto (?P<proto>\w+)(?: time (?P<time>[\d.]+))?(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?|Kernel (?P<kernel>\S+) nchannels (?P<nch>\d+) nthreads (?P<nt>\d+)(?: nWorks (?P<nw>\d+))?|(?P<other>.*))\s*$",
    "coll_op": r"^(?P<op>AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv|AlltoAll|Gather|Scatter): opCount (?P<opCount>[0-9a-f]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) comm (?P<comm>0x[0-9a-f]+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)\s*$",
    "err_trace": r"^(?P<file>[\w/.]+\.(?:cc|cu|h|cpp)):(?P<line>\d+) -> (?P<ret>\d+)(?: \[(?P<thread>[^\]]+)\])?\s*$",
    "net_plugin": r"^(?:NET/Plugin ?: ?.*|Plugin Path : .*|P2P plugin .+|Using non-device net plugin version \d+|(?:Initialized|Assigned) NET plugin .*|Successfully loaded external (?:network )?plugin .*|NET/OFI .*|SHARP .*|TUNER/Plugin: .*|PROFILER/Plugin: .*|NET/Plugin: .*)$",
    "version": r"^NCCL version .*$",
    "misc": r"^(?:cudaDriverVersion \d+|Setting affinity for GPU \d+ to [0-9a-f,]+|Threads per block : .*|\[Proxy (?:Service|Service UDS|Progress)\] Device \d+ CPU core \d+|CC (?:On|Off).*workFifoBytes \d+|[\w/.]+:\d+ Cuda (?:Host )?Alloc Size \d+ pointer 0x[0-9a-f]+|Enabled NCCL Func/Proto/Algo Matrix:.*|comm 0x[0-9a-f]+ rank \d+ nRanks .*|Search \d+ : .*|RAS client listening socket .*|Comm config \w+ set to .*|DMA-BUF is (?:not )?available on GPU device \d+|Bootstrap timings total .*|NET/IB : Made virtual device .*|ncclTopoGetCpuAffinity: .*|NVLS comm .*|MNNVL .*|NET/IB : Using \[.*|NCCL_\w+ set by environment.*|Init (?:START|COMPLETE).*|Allocated .*|ncclCommInit.*)\s*$",
    "check_p2p": r"^Check P2P Type (?:intraNodeP2pSupport (?P<p2p>\d+) directMode (?P<direct>\d+)|isAllDirectP2p (?P<alldirect>\d+) directMode (?P<direct2>\d+)(?: isAllCudaP2p (?P<allcuda>\d+))?)",
    "topo_tree": r"^\s*(?:\+ (?P<link>[A-Z]+)\[(?P<bw>[\d.]+)\] - )?(?P<node>(?:CPU|PCI|GPU|NIC|NET|NVS)/[0-9A-Fa-fx-]+)(?P<attrs>.*)$",
    "graph_channel": r"^\s*(?P<ch>\d+) : (?P<path>(?:(?:GPU|NET|NVS)/\S+ ?)+)$",
}
INFO_RX = {k: re.compile(v) for k, v in _I.items()}

_W = {
    "ib_async": r"^NET/IB ?: (?:(?P<dev>\S+):(?P<port>\d+) )?(?:Got async event ?: ?|Got non-fatal async event: |async fatal event(?: on (?:CQ|QP|SRQ)[^:]*)?: )(?P<event>.+?)\s*$",
    "ib_completion": r"^NET/IB ?: ?Got completion (?:from peer (?P<peer>\S+) )?with (?:error (?P<err>\d+)|status=(?P<status>\w+?)(?:\((?P<statusnum>\d+)\))?),? opcode[ =](?P<opcode>[\w()]+),? (?:len[ =](?P<len>\d+)|reqSize=(?P<reqSize>\d+)),? vendor[ _]err[ =]?(?P<verr>\d+)(?P<rest>.*)$",
    "call_failed": r"^Call to (?P<fn>\S+)(?: from (?P<peer>\S+))? failed(?: with (?:error )?(?P<err>.+?))?(?: : (?P<err2>.+))?\s*$",
    "cuda_failure": r"^Cuda failure (?:(?P<code>\d+) )?'(?P<msg>[^']*)'",
    "socket_closed": r"^(?:socketProgress: )?(?:Net : )?Connection closed by remote peer (?P<peer>\S+)",
    "net_recv_failed": r"^Net : Call to recv from (?P<peer>\S+) failed : (?P<err>.+)$",
    "proxy_error": r"^\[(?:Service thread|Proxy Service[^\]]*)\] (?P<msg>.*)$",
    "no_algo": r"^Error : no algorithm/protocol available.*$",
    # provider errors of the AWS OFI plugin (EFA, libfabric): a request completed with an error, an address or
    # endpoint that cannot be set up; `Peer host id` / `Peer EFA addr` name the other side
    "ofi_error": r"^NET/OFI (?:.*?completed with error\. RC: (?P<rc>-?\d+)(?:\. Error: (?P<err>-?\d+) \((?P<what>[^)]*)\))?"
                 r"(?:.*?Peer EFA addr: (?P<peeraddr>\S+))?(?:.*?Peer host id: (?P<peerhost>\S+))?"
                 r"|(?P<cfg>Unable to insert remote address|Couldn't open AV|Creating new endpoint|Unable to|Couldn't|"
                 r"OFI call \S+ failed|.*\bfailed\b).*)",
    # an NCCL call returned ncclRemoteError / ncclSystemError / ncclInternalError with its reason in the WARN text
    "remote_error": r"^.*(?:remote process exited or there was a network error|Remote process exited).*$",
    "no_libibverbs": r"^Failed to open libibverbs\.so.*$",
}
WARN_RX = {k: re.compile(v) for k, v in _W.items()}

# --- PyTorch, RAS, nccl-tests ---------------------------------------------------------------
_WORK = (
    r"WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?:, TensorShape=\[[^\]]*\])?"
    r"(?:, NumelIn=(?P<numelIn>-?\d+), NumelOut=(?P<numelOut>-?\d+))?, Timeout\(ms\)=(?P<timeout>\d+)\)"
)
PT_TIMEOUT = re.compile(r"\[Rank (?P<rank>\d+)\]\s+Watchdog caught collective operation timeout: " + _WORK + r" ran for (?P<ran>\d+) milliseconds")
PT_BLOCKING = re.compile(r"\[Rank (?P<rank>\d+)\] Work " + _WORK + r" timed out in blocking wait")
PT_LAST = re.compile(
    r"\[PG (?:ID )?(?P<pg>\d+)[^\]]*? Rank (?P<rank>\d+)\]\s+(?:Exception \(either an error or timeout\) detected by watchdog at work: "
    r"(?P<seq>\d+), last enqueued NCCL work: (?P<enq>\d+), last completed NCCL work: (?P<comp>\d+)"
    r"|Timeout at NCCL work: (?P<seq3>\d+), last enqueued NCCL work: (?P<enq3>\d+), last completed NCCL work: (?P<comp3>\d+)"
    r"|failure detected by watchdog at work "
    r"sequence id: (?P<seq2>\d+) PG status: last enqueued work: (?P<enq2>\d+), last completed work: (?P<comp2>\d+))"
)
PT_DESYNC = re.compile(r"\[(?P<lag>\d+)\] finished collective #(?P<fin>\d+), but didn't join collective #(?P<next>\d+)")
PT_NCCL_ERR = re.compile(r"NCCL error in: (?P<file>\S+):(?P<line>\d+), (?P<what>[^,(]+)")
PT_DUMP = re.compile(r"(?:Received a dump signal|flight recorder dump signal|[Dd]umping (?:the )?(?:flight recorder|debug info))"
                     r"(?:.*? from (?:this local )?rank (?P<from>\d+))?")
PT_RANK = re.compile(r"\[rank(?P<r>\d+)\]:|\[Rank (?P<R>\d+)\]")
PT_ANY = re.compile(r"ProcessGroupNCCL|WorkNCCL|TORCH_NCCL|c10d|Watchdog caught|FlightRecorder")

NCCL_MATRIX = re.compile(r"^\s*(?:Function|Broadcast|Reduce|AllGather|ReduceScatter|AllReduce|SendRecv|AlltoAll) \|(?:\s+(?:\d|LL|LL128|Simple))+\s+\|(?:\s+(?:\d+|\w+))+\s*$")
RAS_GROUP = re.compile(r"^\s+(?P<grp>\d+)\s+(?P<comms>\d+)\s+(?P<nodes>\d+)\s+(?P<rpn>[\d-]+)\s+(?P<rpc>\d+)\s+(?P<rig>\d+)\s+(?P<status>[A-Z]+)\s+(?P<errors>[A-Z,]+)\s*$")
RAS_PROC = re.compile(r"^\s*Process (?P<pid>\d+) on node (?P<node>\S+) managing GPU (?P<gpu>\d+)")
RAS_RANK = re.compile(r"^\s*Rank (?P<rank>\d+) -- GPU (?P<gpu>\d+) managed by process (?P<pid>\d+) on node (?P<node>\S+)")
RAS_OUTLIER = re.compile(r"^\s*Node (?P<node>\S+) running processes (?P<pids>[\d,]+)")
RAS_DEAD = re.compile(r"^\s*(?P<n>\d+) job process(?:es)? (?:is|are) considered dead")
RAS_PEER_DEAD = re.compile(r"PEER_DEAD: .*")

NT_PARAMS = re.compile(r"^#?\s*nThread \d+ nGpus \d+ minBytes \d+ maxBytes \d+")
NT_DEVICE = re.compile(r"^#?\s*Rank\s+(?P<rank>\d+)(?: Group\s+\d+)? Pid\s+(?P<pid>\d+) on\s+(?P<host>\S+) device\s+(?P<dev>\d+) \[(?P<bus>[^\]]+)\] (?P<name>.+?)\s*$")
NT_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|f8e4m3|f8e5m2|char|int)"
    r"(?:\s+(?P<redop>sum|prod|max|min|avg|mulsum|none))?(?:\s+(?P<root>-?\d+))?(?P<vals>(?:\s+(?:[\d.]+(?:e[+-]?\d+)?|N/A))+)\s*$"
)
NT_TAIL = re.compile(r"^\s*(?P<time>[\d.]+)\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)\s+(?P<wrong>\d+|N/A|[\d.]+e[+-]\d+)(?P<more>(?:\s+(?:[\d.]+(?:e[+-]?\d+)?|N/A)){4})?\s*$")
NT_HEADER = re.compile(r"^#?\s*(?:out-of-place\s+in-place|size\s+count\s+type|\(B\)\s+\(elements\)|Using devices|#|$)")
NT_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(?P<n>\d+) (?P<ok>OK|FAILED)")
NT_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(?P<bw>[\d.]+)(?:\s+(?P<ok>OK|FAILED))?")
NT_FAIL = re.compile(r"(?:(?P<host>[^\s:]+): )?Test NCCL failure (?P<src>\S+) '(?P<msg>[^']*)")
NT_MISC = re.compile(r"^#|Test NCCL failure|Test failure|Collective test concluded|^\s*\.\. .* pid \d+: ")
NT_PERF = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|hypercube)_perf\b")
CMD_ENV = re.compile(r"(?:^|[\s#])(?:-x\s+)?(?P<var>NCCL_[A-Z0-9_]+)=(?P<val>[^\s;]+)")

# --- checkpoint saves -------------------------------------------------------------------------
# Each pattern starts with a literal and has no nested or overlapping quantifiers (linear); they
# only run on lines that passed the substring guard in _checkpoint.
CK_MEGATRON = re.compile(r"(?:saving|successfully saved) checkpoint (?:from |at )?iteration\s+(?P<it>\d+) to (?P<path>\S+)")
CK_DEEPSPEED = re.compile(r"Saving model checkpoint(?:: (?P<path>\S+))?")
CK_LIGHTNING = re.compile(r"Epoch (?P<ep>\d+), global step (?P<step>\d+): ")
CK_LIGHTNING_TO = re.compile(r"saving model to '?(?P<path>[^'\s]+)")
CK_GENERIC = re.compile(r"(?i)\b(?:checkpoint saved|saved (?:the |a )?checkpoint|finished saving (?:the )?checkpoint)\b")
CK_GEN_PATH = re.compile(r"(?i)\b(?:to|at|in|:) '?(?P<path>[/.~][^'\s,;]*)")
CK_STEP = re.compile(r"(?i)(?:global_step|\bstep)[ =_:-]?(?P<step>\d+)")
CK_FAIL = re.compile(r"(?i)fail|error|unable|could not|cannot|skip")
CK_ISO = re.compile(r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?")
CK_GLOG = re.compile(r"\[[EWIF](?P<md>\d{4}) (?P<t>\d\d:\d\d:\d\d(?:\.\d{1,9})?)")

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
NET_VIA = re.compile(r"^NET/(?P<net>.+?)/(?P<nic>\d+)(?:\((?P<proxy>\d+)\))?(?P<rest>(?:/GDRDMA|\(PCI\)|/Shared|/\S+)*)$")
P2P_VIA = re.compile(r"^P2P/(?P<kind>IPC|CUMEM|MNNVL|direct pointer|common device|indirect)")
SOCKET_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<ifname>[^\s:]+):(?P<addr>\S*)")
IB_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<name>[^\s:]+):(?P<port>\d+)/(?P<link>IB|RoCE)(?P<sharp>/SHARP)?")


class _Acc:
    """Row accumulators for one file (plain lists of dicts, turned into frames once)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.counts: Counter[str] = Counter()
        self.unknown_sample: str | None = None
        self.version: str | None = None
        self.tuning_table = -1
        self.tuning_last = -10
        self.tuning_cols: list[tuple[str, str]] = []
        self.tuning_algos: list[str] = []
        self.tuning_nthreads: list[int] = []
        self.ras = False
        self.ras_error: str | None = None
        self.perf: str | None = None
        self.lo: tuple[int, ...] = (0,)
        self.hi: tuple[int, ...] = (99,)
        self.tails: list[dict[str, Any]] = []
        self.tail_lines = 0
        self.nt_seen = False
        self.launcher: dict[tuple[str, int | None, int | None], int] = {}

    def add(self, frame: str, **row: Any) -> None:
        row["source"] = self.source
        self.rows[frame].append(row)


@dataclass
class _File:
    acc: _Acc
    lines: int
    error: str | None


class NcclBatch:
    """Several NCCL logs parsed as one: each file's lines are read on their own (``add``), the frames
    of all of them are built and their ranks filled at once, per file (``source``) (``finish``), so
    many small logs (one a rank) pay Polars' fixed costs once."""

    def __init__(self) -> None:
        self.files: list[_File] = []

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None:
        """Read one log: a failed result when nothing of it could be read, else None (see ``finish``)."""
        acc, n, error = _read(path, ctx)
        if n == 0 and error:
            return ParseResult.failed(error)
        _settle_rows(acc)
        self.files.append(_File(acc, n, error))
        return None

    def __len__(self) -> int:
        return len(self.files)

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
        """The result of every file ``add`` took (in order) and the frames of them all."""
        frames = _frames(self.files)
        procs = process_ranks(frames)
        frames = _fill_ranks(frames, procs)
        one = procs.filter(pl.len().over("source") == 1)  # one process, one GPU: the file is that rank's
        frames["checkpoints"] = _fill_checkpoints(frames["checkpoints"], one)
        hosts, ranks = _file_facts(self.files, one)
        return [_result(f, hosts.get(f.acc.source, set()), ranks.get(f.acc.source, set())) for f in self.files], frames


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """One NCCL log (a batch of one)."""
    batch = NcclBatch()
    early = batch.add(path, ctx)
    if early is not None:
        return early
    results, frames = batch.finish()
    results[0].frames = frames
    return results[0]


def _read(path: Path, ctx: ParseContext) -> tuple[_Acc, int, str | None]:
    """Every line of one file into a row accumulator: (rows, lines read, why reading stopped early)."""
    acc = _Acc(ctx.rel_path)
    error: str | None = None
    long = LongLines()
    try:
        with open_bounded(path, ctx.max_decompressed_bytes) as fh:
            for n, raw in read_lines(fh, long):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                try:
                    _line(acc, line, n)
                except Exception as exc:  # noqa: BLE001 -- bad input never aborts the file; it is counted
                    acc.counts["nccl_unknown"] += 1
                    acc.unknown_sample = acc.unknown_sample or f"line {n}: {exc}"
    except (OSError, EOFError, zlib.error, DecompressionLimitExceeded) as exc:
        error = f"{ctx.rel_path}: read stopped after line {long.lines}: {exc}"
    error = "; ".join(e for e in (error, long.note(ctx.rel_path)) if e) or None
    return acc, long.lines, error


def _result(f: _File, hosts: set[str], ranks: set[int]) -> ParseResult:
    acc, c = f.acc, f.acc.counts
    msg = (
        f"NCCL {acc.version or 'version unknown'}: {f.lines} lines, {c['nccl']} NCCL "
        f"({c['nccl_unknown']} not understood), {c['nccl_tests']} nccl-tests, {c['pytorch']} PyTorch, "
        f"{c['ras']} RAS, {c['other']} other"
    )
    if acc.unknown_sample:
        msg += f"; first not understood: {acc.unknown_sample[:160]}"
    return ParseResult(
        status="partial" if f.error else "ok",
        message=(f.error + "; " + msg) if f.error else msg,
        rank=next(iter(ranks)) if len(ranks) == 1 else None,
        host=next(iter(hosts)) if len(hosts) == 1 else None,
    )


def _file_facts(files: list[_File], one: pl.DataFrame) -> tuple[dict[str, set[str]], dict[str, set[int]]]:
    """Per file (source): the hosts its NCCL lines name, and the ranks its init lines, its timeouts
    and (a file of one process) that process name; read from the rows (a few per file: no queries)."""
    hosts: dict[str, set[str]] = defaultdict(set)
    ranks: dict[str, set[int]] = defaultdict(set)
    for f in files:
        rows = f.acc.rows
        hosts[f.acc.source] = {r["host"] for name in ("nccl_comms", "nccl_net", "nccl_channels")
                               for r in rows.get(name, []) if r.get("host") is not None}
        ranks[f.acc.source] = {r["rank"] for r in rows.get("nccl_comms", [])
                               if r.get("origin") == "init" and r.get("rank") is not None}
        ranks[f.acc.source] |= {r["rank"] for r in rows.get("collective_timeouts", []) if r.get("rank") is not None}
    for source, rank in one.select("source", "rank").iter_rows():
        ranks[source].add(rank)
    return hosts, ranks


def _fill_checkpoints(checkpoints: pl.DataFrame, one: pl.DataFrame) -> pl.DataFrame:
    """Checkpoint lines of a file of one process are that process's (rank and host)."""
    if checkpoints.height == 0 or one.height == 0:
        return checkpoints
    got = one.select("source", pl.col("rank").cast(pl.Int32).alias("_r"), pl.col("host").alias("_h"))
    return checkpoints.join(got, on="source", how="left", maintain_order="left").with_columns(
        pl.col("rank").fill_null(pl.col("_r")), pl.col("host").fill_null(pl.col("_h"))).drop("_r", "_h")


def _line(acc: _Acc, line: str, n: int) -> None:
    if "NCCL " not in line:  # fast path: most lines of a training log
        _other(acc, line, n)
        return
    m = ENVELOPE.search(line)
    host = None
    if m:
        host = m["host"]
        # nccl-tests row text glued in front (`... -1host:pid`): the root column swallowed a '-1'
        if re.match(r"^-\d+[A-Za-z]", host) and re.search(r"\s-\d+" + re.escape(host[2:]) + ":", line):
            host = host[2:]
    else:
        m = ENVELOPE_NOHOST.search(line)
    if m:
        acc.counts["nccl"] += 1
        acc.ras = False
        base: dict[str, Any] = {
            "host": host,
            "pid": int(m["pid"]) if host else None,
            "cuda_dev": int(m["dev"]) if m["dev"] is not None else None,
            "line": n,
            "time_ns": _line_time(line),
        }
        msg = m["msg"].rstrip()
        tag = MPI_TAG.search(line, 0, m.start())
        if tag and host:
            acc.launcher[(host, base["pid"], base["cuda_dev"])] = int(tag["rank"])
        if m["func"]:
            _hint(acc, lo="2.30")  # `file:line (function) NCCL WARN`
        if m["level"] in ("WARN", "ERROR"):
            known = _warn(acc, base, msg, m["src"])
        else:
            known = _info(acc, base, msg, m["src"])
        if not known:
            acc.counts["nccl_unknown"] += 1
            acc.unknown_sample = acc.unknown_sample or f"line {n}: {line.strip()}"
        return
    _other(acc, line, n)


_HINTS = {
    "tuning_op": lambda g: ("2.24", None) if g["lo"] is not None else (("2.23", "2.23") if g["func"] and g["time"]
                                                                       else ("2.20", "2.22") if g["time"] else (None, None)),
    "init_timings": lambda g: ("2.23", None) if g["func"] else ("2.22", "2.22"),
    "channels_summary": lambda g: ("2.20", None) if g["collnet"] is not None else (("2.17", "2.19") if g["nvls"] is not None else ("2.7", "2.16")),
    "check_p2p": lambda g: ("2.24", "2.26") if g["p2p"] is not None else ("2.27", None),
    "connected": lambda g: ("2.24", None) if g["gdr"] is not None else (None, None),
    "bootstrap": lambda g: (None, None),
    "comm_layout": lambda g: ("2.20", None),
    "tuning_hdr_old": lambda g: ("2.5", "2.17"),
    "tuning_hdr_new": lambda g: ("2.18", None),
}


def _match_info(msg: str) -> tuple[str, re.Match[str]] | None:
    """The first INFO_RX pattern that matches ``msg`` (order matters: specific patterns come first)."""
    for kind, rx in INFO_RX.items():
        m = rx.match(msg)
        if m:
            return kind, m
    return None


def _info(acc: _Acc, base: dict[str, Any], msg: str, src: str | None) -> bool:
    if not msg:
        return True  # `NCCL INFO` with nothing after it (WARN separators, cut lines)
    found = _match_info(msg)
    if found is None:
        return False
    kind, m = found
    g = m.groupdict()
    hint = _HINTS.get(kind)
    if hint:
        _hint(acc, *hint(g))
    handler = _INFO_HANDLERS.get(kind)
    # a handler returns False when the line only looked like its kind; other kinds are known and carry nothing
    return handler is None or handler(acc, base, g, msg) is not False


_InfoHandler = Callable[[_Acc, dict[str, Any], dict[str, Any], str], "bool | None"]


def _i_comm_init(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add(
        "nccl_comms", **{**base, "cuda_dev": int(g["cudaDev"])}, origin="init", comm=g["comm"], comm_id=g["commId"], rank=int(g["rank"]),
        nranks=int(g["nranks"]), nvml_dev=_int(g["nvmlDev"]),
        bus_id=normalize_bus_id(g["busId"], bare="packed"), phase=g["phase"], func=g["func"],
    )


def _i_comm_layout(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.rows["_layout"].append({"host": base["host"], "pid": base["pid"], "comm": g["comm"],
                                "nnodes": int(g["nnodes"]), "local_ranks": int(g["localRanks"])})


def _i_bootstrap(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    devs = list(SOCKET_DEV.finditer(g["ifaces"]))
    if devs:
        for d in devs:
            acc.add("nccl_net", **base, kind="bootstrap", index=int(d["idx"]), name=d["ifname"], address=d["addr"])
    else:
        name, _, addr = g["ifaces"].strip().partition(":")
        acc.add("nccl_net", **base, kind="bootstrap", index=0, name=name, address=addr)


def _i_net_socket_using(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    for d in SOCKET_DEV.finditer(g["devs"]):
        acc.add("nccl_net", **base, kind="socket", index=int(d["idx"]), name=d["ifname"], address=d["addr"])


def _i_net_ib_using(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    for d in IB_DEV.finditer(g["devs"]):
        acc.add("nccl_net", **base, kind="ib", index=int(d["idx"]), name=d["name"], port=int(d["port"]),
                link_layer=d["link"], detail=g["oob"])


def _i_gdr_hca(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add("nccl_net", **base, kind="gdr_hca", index=int(g["hca"]), name=g["name"], state=g["state"],
            detail=f"NET/{g['net']}{g['extra']}")


def _i_coll_op(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    dtype = DTYPES[int(g["dtype"])] if int(g["dtype"]) < len(DTYPES) else g["dtype"]
    redop = int(g["redop"])
    acc.add(
        "nccl_calls", **base, kind="coll", op=g["op"], comm=g["comm"], op_count=int(g["opCount"], 16),
        count=int(g["count"]), datatype=dtype, redop=REDOPS[redop] if redop < 5 else "premulsum",
        root=int(g["root"]), nranks=int(g["nranks"]),
        bytes=int(g["count"]) * DTYPE_SIZE[dtype] if dtype in DTYPE_SIZE else None,
    )


def _i_tuning_op(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> bool:
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
        predicted_us=_float(g["time"]), chan_lo=_int(g["lo"]), chan_hi=_int(g["hi"]),
    )
    return True


def _i_tuning(kind: str) -> _InfoHandler:
    return lambda acc, base, g, msg: _tuning(acc, base, kind, g)


def _i_collnet_conn(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add("nccl_channels", **base, channel=int(g["ch"]), conn_index=int(g["conn"]), src_rank=int(g["rank"]),
            direction=g["dir"], transport="COLLNET", via=msg.split(" via ", 1)[1], net=g["net"], nic=int(g["dev"]),
            gdr="/GDRDMA" in g["rest"], shared="/Shared" in g["rest"])


def _i_ring_list(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    acc.add("nccl_events", **base, level="INFO", kind="ring_order", code=int(g["ch"]), value=float(g["nch"]),
            message=" ".join(g["ranks"].split()))


def _i_event(kind: str) -> _InfoHandler:
    """The whole line as an `nccl_events` row of ``kind`` (tree and ring graphs)."""
    return lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind=kind, message=msg)


def _i_thread_thresholds(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    vals = [int(v) for v in re.findall(r"\d+", g["vals"])]
    if len(vals) >= 4:
        acc.add("nccl_events", **base, level="INFO", kind="thread_thresholds", value=vals[3] / 8.0, message=msg)


def _i_check_p2p(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    # intraNodeP2pSupport (2.24-2.26) / isAllCudaP2p (2.27+) = 0: CUDA P2P between the local GPUs is off
    p2p = g["p2p"] if g["p2p"] is not None else g["allcuda"]
    acc.add("nccl_events", **base, level="INFO", kind="p2p_check", code=_int(p2p), message=msg)


def _i_connected(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    if g["gdr"] is not None:
        acc.add("nccl_events", **base, level="INFO", kind="connected", code=int(g["gdr"]),
                value=float(g["pxn"]), message=msg)


def _i_topo_tree(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
    if g["link"]:
        acc.add("nccl_events", **base, level="INFO", kind="topo_link", value=float(g["bw"]),
                peer=g["node"], message=f"{g['link']} {g['node']}")


def _i_version(acc: _Acc, base: dict[str, Any], g: dict[str, Any], msg: str) -> None:
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
                                                          value=float(g["coll"]), code=_int(g["nvls"]), message=msg),
    "nvls_support": lambda acc, base, g, msg: acc.add("nccl_events", **base, level="INFO", kind="nvls_support",
                                                      code=0 if g["neg"] else 1, message=msg),
    "check_p2p": _i_check_p2p,
    "net_ofi_gdr_off": lambda acc, base, g, msg: acc.add("nccl_net", **base, kind="gdr_hca", name="OFI", state="Disabled",
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
                                                   code=int(g["ret"]), file_line=f"{g['file']}:{g['line']}", message=msg),
    "version": _i_version,
}


def _hint(acc: _Acc, lo: str | None = None, hi: str | None = None) -> None:
    """Narrow the version range the line formats allow (research/nccl.md §A.5)."""
    if lo:
        acc.lo = max(acc.lo, tuple(int(x) for x in lo.split(".")))
    if hi:
        acc.hi = min(acc.hi, tuple(int(x) for x in hi.split(".")))


def _transport(acc: _Acc, base: dict[str, Any], g: dict[str, Any]) -> None:
    via = g["via"]
    busid = len(g["srcdev"]) >= 4  # a busId (>= 0x1000 for bus 01) is never a device index
    if g["kw"] == "Ring":
        _hint(acc, *(("2.5", "2.6") if busid else (None, "2.4")))
    elif busid:
        _hint(acc, lo="2.7", hi="2.18.1")
    else:
        _hint(acc, lo="2.18.3")  # a device index, not a busId, in the bracket
    row: dict[str, Any] = dict(
        channel=int(g["ch"]), conn_index=_int(g["conn"]), src_rank=int(g["src"]), dst_rank=int(g["dst"]),
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
        row.update(transport="NET", net=nm["net"], nic=int(nm["nic"]), proxy_rank=_int(nm["proxy"]),
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


def _tuning(acc: _Acc, base: dict[str, Any], kind: str, g: dict[str, Any]) -> None:
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


def _warn(acc: _Acc, base: dict[str, Any], msg: str, src: str | None) -> bool:
    ts = WARN_TS.match(msg)
    if ts:
        _hint(acc, lo="2.26")
        base = {**base, "time_ns": base.get("time_ns") or _iso_utc_ns(ts["d"], ts["t"], None)}
        msg = msg[ts.end():]
    row = dict(**base, level="WARN", file_line=src, message=msg)
    for kind, rx in WARN_RX.items():
        m = rx.match(msg)
        if m:
            g = m.groupdict()
            code: int | None = None
            peer = g.get("peer")
            if kind == "ib_completion":
                code = _int(g["err"]) if g["err"] is not None else _int(g["statusnum"])
                if code is None and g["status"] and g["status"].isdigit():
                    code = int(g["status"])
            elif kind == "cuda_failure":
                code = _int(g["code"])
            elif kind == "ib_async":
                peer = g["dev"]
            elif kind == "proxy_error":
                rm = re.search(r"(?:res|retcode)[= ](\d+)", msg)
                code = int(rm.group(1)) if rm else None
            elif kind == "ofi_error":
                code = _int(g["rc"])
                peer = next((v.rstrip(").,") for v in (g["peerhost"], g["peeraddr"]) if v and not v.startswith("N/A")), None)
            acc.add("nccl_events", **row, kind=kind, code=code, peer=peer)
            return True
    acc.add("nccl_events", **row, kind="warn_other")
    return True  # an unclassified WARN is still kept, with its text


def _other(acc: _Acc, line: str, n: int) -> None:
    _checkpoint(acc, line, n)
    text = LAUNCHER_TAGS.sub("", line).strip()
    if not text:
        acc.counts["other"] += 1
        return
    # PyTorch ProcessGroupNCCL
    if PT_ANY.search(line) or PT_DESYNC.search(line):
        acc.counts["pytorch"] += 1
        acc.ras = False
        _pytorch(acc, line, n)
        return
    if NCCL_MATRIX.match(text):
        acc.counts["nccl"] += 1  # body of `Enabled NCCL Func/Proto/Algo Matrix:` (2.24+, no envelope)
        return
    rv = RAS_VERSION.match(text)
    if rv:
        acc.version = acc.version or rv["ver"]
        acc.ras = True
        acc.counts["ras"] += 1
        return
    vm = VERSION.search(text)
    if vm and text.startswith("NCCL version"):
        acc.version = acc.version or vm["ver"]
        acc.counts["nccl"] += 1  # the bare banner of <= 2.21
        return
    if acc.ras:
        acc.counts["ras"] += 1
        _ras(acc, text, n)
        return
    if _nccl_tests(acc, text, n):
        acc.counts["nccl_tests"] += 1
        return
    for cm in CMD_ENV.finditer(line):
        acc.add("nccl_env", host=None, pid=None, cuda_dev=None, line=n, var=cm["var"], value=cm["val"], origin="command")
    pm = NT_PERF.search(line)
    if pm:
        acc.perf = acc.perf or COLL_NAMES[pm.group(1)]
    acc.counts["other"] += 1


def _checkpoint(acc: _Acc, line: str, n: int) -> None:
    """One checkpoint-save line -> a `checkpoints` row (the line is still classified as before)."""
    if "heckpoint" not in line and "saving model to" not in line:  # cheap guard: almost every line stops here
        return
    if CK_FAIL.search(line):
        return
    row = _ck_fields(line)
    if row is None:
        return
    rm = PT_RANK.search(line)
    tm = CK_ISO.search(line)
    gm = None if tm else CK_GLOG.search(line)
    acc.add("checkpoints", host=None, line=n, rank=int(rm["r"] or rm["R"]) if rm else None,
            time_ns=_iso_ns(tm) if tm else None, stamp=f"{gm['md']} {gm['t']}" if gm else None, **row)


def _ck_fields(line: str) -> dict[str, Any] | None:
    """iteration / step / epoch / path / framework of a save line; None when it is not one."""
    m = CK_MEGATRON.search(line)
    if m:
        return dict(iteration=int(m["it"]), step=None, epoch=None, path=m["path"], framework="megatron")
    m = CK_DEEPSPEED.search(line)
    if m:
        sm = CK_STEP.search(m["path"] or "")
        return dict(iteration=None, step=int(sm["step"]) if sm else None, epoch=None, path=m["path"],
                    framework="deepspeed")
    m = CK_LIGHTNING.search(line)
    if m and "saving model to" in line:
        pm = CK_LIGHTNING_TO.search(line, m.end())
        return dict(iteration=None, step=int(m["step"]), epoch=int(m["ep"]), path=pm["path"] if pm else None,
                    framework="lightning")
    if "Saving latest checkpoint" in line:
        return dict(iteration=None, step=None, epoch=None, path=None, framework="lightning")
    m = CK_GENERIC.search(line)
    if m:
        pm = CK_GEN_PATH.search(line, m.end())
        sm = CK_STEP.search(line)
        return dict(iteration=None, step=int(sm["step"]) if sm else None, epoch=None,
                    path=pm["path"] if pm else None, framework="generic")
    return None


def _iso_ns(m: re.Match[str]) -> int | None:
    try:
        t = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000 + int((m["f"] or "0").ljust(9, "0"))


def _seen_tests(acc: _Acc) -> bool:
    """A bare number row: nccl-tests when the file has nccl-tests output, else plain text."""
    acc.tail_lines += 1
    return True


def _nccl_tests(acc: _Acc, text: str, n: int) -> bool:
    """One line of nccl-tests output (a result row, a cut row, a device line, a check or a header)."""
    return (_nt_row(acc, text, n) or _nt_tail(acc, text, n) or _nt_device(acc, text, n) or _nt_check(acc, text, n)
            or _nt_misc(acc, text, n))


def _nt_row(acc: _Acc, text: str, n: int) -> bool:
    m = NT_ROW.match(text)
    if not m:
        return False
    acc.nt_seen = True
    vals = m["vals"].split()
    for k, placement in enumerate(("out-of-place", "in-place")):
        part = vals[4 * k : 4 * k + 4]
        if len(part) < 3:
            break
        acc.add(
            "nccl_tests", host=None, line=n, size_bytes=int(m["size"]), count=int(m["count"]), type=m["type"],
            redop=m["redop"], root=_int(m["root"]), placement=placement, time_us=_float(part[0]),
            algbw_gbps=_float(part[1]), busbw_gbps=_float(part[2]),
            wrong=_float(part[3]) if len(part) > 3 else None, size_inferred=False,
        )
    return True


def _nt_tail(acc: _Acc, text: str, n: int) -> bool:
    m = NT_TAIL.match(text)
    if not m:
        return False
    # a row cut by interleaved output: its size is algbw x time (GB/s x us = kB), a power of two
    est = float(m["algbw"]) * float(m["time"]) * 1e3
    if est <= 0:
        return _seen_tests(acc)
    p2 = 1 << max(0, round(est).bit_length() - 1)
    size = min((p2, 2 * p2), key=lambda s: abs(s - est))
    if abs(size - est) / size >= 0.05:
        return _seen_tests(acc)
    # kept only if the file turns out to hold nccl-tests output (decided at the end of the file)
    acc.tails.append(dict(
        source=acc.source, host=None, line=n, size_bytes=size, placement=None, time_us=float(m["time"]),
        algbw_gbps=float(m["algbw"]), busbw_gbps=float(m["busbw"]), wrong=_float(m["wrong"]), size_inferred=True,
    ))
    return True


def _nt_device(acc: _Acc, text: str, n: int) -> bool:
    m = NT_DEVICE.match(text)
    if not m:
        return False
    acc.nt_seen = True
    bus = m["bus"].lower().removeprefix("0x")
    acc.add(
        "nccl_comms", host=m["host"], pid=int(m["pid"]), cuda_dev=int(m["dev"]), rank=int(m["rank"]), line=n,
        origin="nccl-tests", phase="device", gpu_name=m["name"],
        bus_id=normalize_bus_id(bus, bare="bus"),
    )
    return True


def _nt_check(acc: _Acc, text: str, n: int) -> bool:
    """The out-of-bounds check count and the average bus bandwidth line."""
    m = NT_OOB.match(text)
    if m:
        acc.add("nccl_events", host=None, line=n, level="ERROR" if m["ok"] == "FAILED" else "INFO",
                kind="nccl_tests_check", code=int(m["n"]), message=text)
        return True
    m = NT_AVG.match(text)
    if m:
        acc.add("nccl_events", host=None, line=n, level="ERROR" if m["ok"] == "FAILED" else "INFO",
                kind="nccl_tests_avg", value=float(m["bw"]), message=text)
        return True
    return False


def _nt_misc(acc: _Acc, text: str, n: int) -> bool:
    """Parameter and header lines: they prove nccl-tests output and may name the test and its environment."""
    if NT_PARAMS.match(text) or re.search(r"out-of-place|\(elements\)|Avg bus bandwidth", text):
        acc.nt_seen = True
    if NT_PARAMS.match(text) or NT_HEADER.match(text) or NT_MISC.search(text):
        fail = NT_FAIL.search(text)
        if fail:  # nccl-tests ends on an NCCL error: its text says which (`remote process exited ...`)
            acc.add("nccl_events", host=fail["host"], pid=None, cuda_dev=None, line=n, level="WARN",
                    kind="nccl_tests_failure", file_line=fail["src"], message=fail["msg"].strip(" /"))
        perf = NT_PERF.search(text)
        if perf:
            acc.perf = acc.perf or COLL_NAMES[perf.group(1)]
        for cm in CMD_ENV.finditer(text):
            acc.add("nccl_env", host=None, pid=None, cuda_dev=None, line=n, var=cm["var"], value=cm["val"], origin="command")
        return True
    return False


def _pytorch(acc: _Acc, line: str, n: int) -> None:
    text = line.strip()
    rm = PT_RANK.search(line)
    rank = int(rm["r"] or rm["R"]) if rm else None
    base = dict(host=None, line=n, rank=rank, message=text[:2000])
    m = PT_TIMEOUT.search(line) or PT_BLOCKING.search(line)
    if m:
        acc.add(
            "collective_timeouts", **base, kind="watchdog_timeout" if "Watchdog" in m.group(0) else "blocking_wait",
            seq=_int(m["seq"]), op_type=m["op"], numel_in=_int(m["numelIn"]), numel_out=_int(m["numelOut"]),
            timeout_ns=int(m["timeout"]) * 1_000_000,
            ran_ns=int(m["ran"]) * 1_000_000 if "ran" in m.groupdict() and m["ran"] else None,
        )
        return
    m = PT_LAST.search(line)
    if m:
        acc.add(
            "collective_timeouts", **base, kind="pg_status", pg=int(m["pg"]), seq=int(m["seq"] or m["seq2"] or m["seq3"]),
            last_enqueued=int(m["enq"] or m["enq2"] or m["enq3"]),
            last_completed=int(m["comp"] or m["comp2"] or m["comp3"]),
        )
        return
    m = PT_DESYNC.search(line)
    if m:
        acc.add("collective_timeouts", **base, kind="desync", seq=int(m["next"]), lagging_rank=int(m["lag"]),
                last_completed=int(m["fin"]))
        return
    m = PT_NCCL_ERR.search(line)
    if m:
        acc.add("collective_timeouts", **base, kind="nccl_error")
        return
    if "FlightRecorder is disabled" in line:
        acc.add("nccl_events", host=None, line=n, rank=rank, level="INFO", kind="flight_recorder_disabled",
                message=text)
        return
    m = PT_DUMP.search(line)
    if m:
        # the flight recorder was triggered; `from rank N` names the rank whose watchdog fired first
        acc.add("nccl_events", host=None, line=n, rank=rank, level="INFO", kind="flight_recorder",
                code=_int(m["from"]), message=text[:500])


def _ras(acc: _Acc, text: str, n: int) -> None:
    m = RAS_GROUP.match(" " + text)
    base = dict(host=None, line=n)
    if m:
        bad = m["errors"] != "OK" or m["status"] not in ("RUNNING",)
        acc.add("nccl_events", **base, level="WARN" if bad else "INFO", kind="ras_group", code=int(m["grp"]),
                value=float(m["rpc"]), message=f"group {m['grp']}: {m['status']} {m['errors']}")
        return
    if re.fullmatch(r"(?:INCOMPLETE|MISMATCH|DEAD|TIMEOUT)\b.*|#\d+-\d+ \(\w+\) [A-Z,]+", text):
        acc.ras_error = text.split()[-1] if text.startswith("#") else text.split()[0]
        return
    m = RAS_PROC.match(text) or RAS_RANK.match(text)
    if m:
        g = m.groupdict()
        acc.add("nccl_events", **base, level="WARN", kind="ras_missing", rank=_int(g.get("rank")),
                code=int(g["pid"]), value=float(g["gpu"]), peer=g["node"],
                message=f"{acc.ras_error or 'ERROR'}: {text}")
        return
    m = RAS_OUTLIER.match(text)
    if m:
        acc.add("nccl_events", **base, level="WARN", kind="ras_outlier", peer=m["node"], message=text)
        return
    m = RAS_DEAD.match(text) or RAS_PEER_DEAD.search(text)
    if m:
        acc.add("nccl_events", **base, level="WARN", kind="ras_dead", message=text)


def _settle_rows(acc: _Acc) -> None:
    """What only the whole file tells: whether bare number rows are nccl-tests results, the test's
    collective, the launcher's ranks, the 2.20+ layout, which variables a plugin set."""
    tail_lines = len({t["line"] for t in acc.tails}) + acc.tail_lines
    if acc.nt_seen:
        acc.rows["nccl_tests"].extend(acc.tails)
    else:  # bare number rows in a file without nccl-tests output are just text
        acc.counts["nccl_tests"] -= tail_lines
        acc.counts["other"] += tail_lines
    if acc.perf:
        for row in acc.rows.get("nccl_tests", []):
            row["collective"] = acc.perf
    for (h, p, d), r in acc.launcher.items():
        acc.rows["nccl_comms"].append({"source": acc.source, "host": h, "pid": p, "cuda_dev": d, "rank": r,
                                       "origin": "launcher"})
    if acc.rows.get("_layout"):
        _apply_layout(acc.rows["nccl_comms"], acc.rows["_layout"])
    env = acc.rows.get("nccl_env", [])
    plugin_vars = {r["var"] for r in env if r.get("origin") == "plugin" and r.get("var") is not None}
    for row in env:
        if row.get("var") in plugin_vars:
            row["origin"] = "plugin"


def _apply_layout(comms: list[dict[str, Any]], layout: list[dict[str, Any]]) -> None:
    """nnodes / localRanks from the 2.20+ layout lines onto the file's communicators, by (host, pid,
    comm), the last line winning; a communicator with an unknown key gets none."""
    by_key = {(r["host"], r["pid"], r["comm"]): (r["nnodes"], r["local_ranks"]) for r in layout}
    for row in comms:
        key = (row.get("host"), row.get("pid"), row.get("comm"))
        row["nnodes"], row["local_ranks"] = (None, None) if None in key else by_key.get(key, (None, None))


def _frames(files: list[_File]) -> dict[str, pl.DataFrame]:
    """The frames of every file's rows, built once."""
    out: dict[str, pl.DataFrame] = {}
    for name in ("nccl_comms", "nccl_net", "nccl_channels", "nccl_calls", "nccl_tuning", "nccl_env",
                 "nccl_events", "collective_timeouts", "nccl_tests", "checkpoints"):
        out[name] = _rows_frame(name, [row for f in files for row in f.acc.rows.get(name, [])])
    out["nccl_files"] = _rows_frame("nccl_files", [_file_row(f) for f in files])
    return out


def _rows_frame(name: str, rows: list[dict[str, Any]]) -> pl.DataFrame:
    if not rows:
        return fr.empty(name)
    schema = fr.schema(name)
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema, orient="row")


def _file_row(f: _File) -> dict[str, Any]:
    acc, c = f.acc, f.acc.counts
    return {
        "source": acc.source, "nccl_version": acc.version, "lines": f.lines, "nccl_lines": c["nccl"],
        "nccl_unknown": c["nccl_unknown"], "nccl_tests_lines": c["nccl_tests"], "pytorch_lines": c["pytorch"],
        "ras_lines": c["ras"], "other_lines": c["other"], "unknown_sample": acc.unknown_sample,
        "version_range": _range(acc),
    }


def _range(acc: _Acc) -> str | None:
    """`2.20-2.22`, `>=2.24`, `<=2.18.1` from the line formats seen; null when nothing narrowed it."""
    lo = ".".join(map(str, acc.lo)) if acc.lo != (0,) else None
    hi = ".".join(map(str, acc.hi)) if acc.hi != (99,) else None
    if lo and hi:
        if acc.lo > acc.hi:  # formats of different eras: a custom build, or several NCCLs in one file
            return f"inconsistent: >={lo} and <={hi}"
        return lo if lo == hi else f"{lo}-{hi}"
    return f">={lo}" if lo else (f"<={hi}" if hi else None)


def process_ranks(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Per file (source): (host, pid, cuda_dev) -> rank, from init lines (largest communicator wins)
    and, failing those, from the process's own side of its channel lines."""
    comms = frames["nccl_comms"].lazy().filter(pl.col("origin").is_in(["init", "launcher"]))
    init = comms.sort("nranks", descending=True, maintain_order=True).select(
        "source", "host", "pid", "cuda_dev", "rank", pl.lit(0).alias("prio"))
    ch = frames["nccl_channels"].lazy().select(
        "source", "host", "pid", "cuda_dev",
        pl.when(pl.col("direction") == "receive").then(pl.col("dst_rank")).otherwise(pl.col("src_rank")).alias("rank"),
        pl.lit(1).alias("prio"),
    )
    both = pl.concat([init, ch], how="vertical_relaxed").drop_nulls(["pid", "cuda_dev", "rank"])
    return (both.sort("prio", maintain_order=True)
            .unique(["source", "host", "pid", "cuda_dev"], keep="first", maintain_order=True)
            .drop("prio").collect())


def _fill_ranks(out: dict[str, pl.DataFrame], ranks: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """A null rank of a line of a process whose rank its file tells (:func:`process_ranks`)."""
    if ranks.height == 0:
        return out
    ranks = ranks.rename({"rank": "_r"})
    for name in ("nccl_net", "nccl_channels", "nccl_calls", "nccl_tuning", "nccl_env", "nccl_events"):
        df = out[name]
        if df.height == 0:
            continue
        df = df.join(ranks, on=["source", "host", "pid", "cuda_dev"], how="left", nulls_equal=False,
                     maintain_order="left")
        out[name] = fr.conform(name, df.with_columns(pl.coalesce("rank", "_r").alias("rank")).drop("_r"))
    return out


def _line_time(line: str) -> int | None:
    """Epoch ns of a launcher's ISO timestamp at the start of ``line`` (no zone: read as UTC), else None."""
    m = LINE_ISO.match(line)
    if m is None:
        return None
    return _iso_utc_ns(m["d"], m["t"], m["z"]) if m["d"] else _iso_utc_ns(m["d2"], m["t2"], None)


def _iso_utc_ns(day: str, clock: str, zone: str | None) -> int | None:
    """Epoch ns of `YYYY-mm-dd` `HH:MM:SS[.f]` [`Z`/`+hh:mm`]; a time without a zone is read as UTC (the logs
    of one job share a zone, so order and gaps hold)."""
    z = "+00:00" if zone in (None, "Z") else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    whole, _, frac = clock.partition(".")
    try:
        t = datetime.fromisoformat(f"{day}T{whole}{z}")
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000 + int((frac + "000000000")[:9])


def _int(v: str | None) -> int | None:
    return int(v) if v not in (None, "") else None


def _float(v: str | None) -> float | None:
    if v in (None, "", "N/A"):
        return None
    return float(v)
