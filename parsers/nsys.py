"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> canonical frames.

Schema variants handled (nsys 2022.2 / export schema 2.9.1 up to 2026.2 / 3.25): tables are created
lazily (an absent table means "not captured", never "empty"), columns are added per release and
are looked up with ``PRAGMA table_info`` before use, the metadata table is ``EXPORT_META_DATA`` (2022.x)
or ``META_DATA_EXPORT`` (2023.x+), and event times are either session-relative or already shifted
(``--ts-normalize`` / ``--ts-shift``).

Clock domain: every ``*_ns`` value this parser writes is Unix-epoch ns on the profiled host's clock,
``raw - EXPORT_CONFIG_TIME_SHIFT + TARGET_INFO_SESSION_START_TIME.utcEpochNs`` (see docs/nsys.md).

The file is opened read-only and immutable and never loaded whole: each table is read with a
query that names only the columns needed, in batches of ``BATCH_ROWS`` rows.
"""

from __future__ import annotations

import json
import re
import sqlite3
import struct
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl
from forensics.parsers.kineto_names import TP_OVERLAP_KERNEL
from forensics.parsers.result import ParseContext, ParseResult

from forensics.base import frames as fr
from forensics.base.hosts import short_host

BATCH_ROWS = 50_000
PID_EXPR = "((({col}) >> 24) & 16777215)"
TID_EXPR = "(({col}) & 16777215)"
# Values above this are already Unix-epoch ns (2001-09-09): used only when the export does not say.
EPOCH_NS_FLOOR = 10**18

# NVTX event types (ENUM_NSYS_EVENT_TYPE, stable 2022.2 -> 2026.2).
NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE, NVTX_THREAD, NVTX_MARK = 59, 60, 75, 39, 34
NVTX_RANGE_TYPES = (59, 60, 70, 71)

# Rank / world size from the captured environment of the launched process, most specific first.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")
HOST_VARS = ("SLURMD_NODENAME", "HOSTNAME")
_FILE_RANK = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)
VERSION_KEYS = ("NvDriverVersion", "CudaDriverVersion", "OfedDriverVersion", "SoftwareReleaseVersion")
"""TARGET_INFO_SYSTEM_ENV rows kept as the ranks' ``versions``."""

# NCCL kernel names in every naming era: ncclKernel_* (<= 2.18), ncclDevKernel_* (2.19+),
# ncclSymDevKernel_* (2.27 symmetric kernels), ncclSymkDevKernel_* (2.28).
NCCL_KERNEL = r"^(?:void\s+)?nccl(?:Symk?)?(?:Dev)?Kernel_"
# DeepEP's expert-parallel dispatch/combine kernels move data between GPUs too (as in parsers/kineto_names.py).
DEEPEP_KERNEL = r"deep_ep::|dpsk::ep::"
_NCCL_COLL = r"^(?:void\s+)?nccl(?:Symk?)?(?:Dev)?Kernel_([A-Za-z]+)"
_NAME_ALGO = r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)(?:_|\(|$)"
_NAME_PROTO = r"_(LL128|LL|SIMPLE)(?:_|\(|$)"
COLLECTIVES = {
    "AllReduce": "allreduce",
    "AllGather": "allgather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Bcast": "broadcast",
    "Reduce": "reduce",
    "SendRecv": "sendrecv",
    "Send": "send",
    "Recv": "recv",
    "AllToAll": "alltoall",
    "AlltoAll": "alltoall",
    "Gather": "gather",
    "Scatter": "scatter",
}
# NCCL API calls that are collectives / p2p (NVTX range names of the NCCL domain) -> comms rows.
NCCL_API = {f"nccl{k}": v for k, v in COLLECTIVES.items() if k != "SendRecv"} | {"ncclAllToAllv": "alltoall"}

PROFILER_OVERHEAD_NAMES = (
    "CUDA profiling data flush overhead",
    "CUDA profiling stop overhead",
    "CUDA profiling overhead",
)

# GPU metrics kept (metric-name prefix -> gpu_metrics column). Names gained a " [Throughput %]"
# suffix in later nsys versions; both spellings start the same way.
GPU_METRICS = {
    "GR Active": "gr_active",
    "SM Active": "sm_active",
    "SMs Active": "sm_active",
    "SM Issue": "sm_issue",
    "SMs Issue": "sm_issue",
    "Tensor Active": "tensor_active",
}
MEMCPY_KINDS = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array", 4: "Array-to-Host",
    5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array", 8: "Device-to-Device", 9: "Host-to-Host",
    10: "Peer-to-Peer", 11: "Unified Host-to-Device", 12: "Unified Device-to-Host", 13: "Unified Device-to-Device",
}
_API_VERSION = re.compile(r"_v\d+$")
# torch.autograd.profiler.emit_nvtx appends ", op_id = N" (and ", seq = ...") to range names.
_STEP_RANGE = re.compile(r"^(?:ProfilerStep#|[Ss]tep[ _#:]?|[Ii]teration[ _#:]?)(\d+)(?:,\s.*)?$")

# NVTX payload entry types (nvToolsExtPayload.h) -> struct format; enums are 4-byte ints.
_PAYLOAD_FMT = {1: "b", 2: "B", 3: "h", 4: "H", 5: "i", 6: "I", 7: "q", 8: "Q", 9: "q", 10: "Q",
                11: "b", 12: "B", 13: "h", 14: "H", 15: "i", 16: "I", 17: "q", 18: "Q", 19: "f", 20: "d",
                22: "Q", 23: "Q"}


class NotNsys(Exception):
    pass


@dataclass
class _Db:
    con: sqlite3.Connection
    tables: dict[str, str] = field(default_factory=dict)  # lower-case name -> real name
    errors: list[str] = field(default_factory=list)  # damage met while reading, with rows salvaged
    _cols: dict[str, set[str]] = field(default_factory=dict)

    def has(self, table: str) -> bool:
        return table.lower() in self.tables

    def cols(self, table: str) -> set[str]:
        real = self.tables.get(table.lower())
        if real is None:
            return set()
        if real not in self._cols:
            self._cols[real] = {r[1] for r in self.con.execute(f'PRAGMA table_info("{real}")')}
        return self._cols[real]

    def name(self, table: str) -> str:
        return self.tables[table.lower()]

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        return self.con.execute(sql, tuple(params)).fetchall()

    def frame(self, sql: str, schema: Mapping[str, Any]) -> pl.DataFrame:
        """Run ``sql`` and build a frame batch by batch, so memory follows the selected columns only."""
        cur = self.con.execute(sql)
        parts: list[pl.DataFrame] = []
        names = list(schema)
        while True:
            try:
                batch = cur.fetchmany(BATCH_ROWS)
            except sqlite3.DatabaseError as exc:
                # A damaged page: keep the rows read before it (a batch at most is lost).
                self.errors.append(f"{exc} after {sum(p.height for p in parts):,} rows")
                break
            if not batch:
                break
            columns = list(zip(*batch))
            parts.append(pl.DataFrame([pl.Series(n, c, dtype=schema[n]) for n, c in zip(names, columns)]))
            del batch, columns
        if not parts:
            return pl.DataFrame(schema=schema)
        return pl.concat(parts, rechunk=False)


def _open(path: Path) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    con.execute("PRAGMA query_only = ON")
    # Some exports hold strings that are not valid UTF-8 (seen in StringIds of nsys 2022.2).
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    try:
        con = _open(path)
    except sqlite3.Error as exc:
        return ParseResult.failed(f"{ctx.rel_path}: cannot open as SQLite: {exc}")
    try:
        return _parse(_Db(con), path, ctx)
    except NotNsys as exc:
        return ParseResult.failed(f"{ctx.rel_path}: {exc}")
    except sqlite3.DatabaseError as exc:
        return ParseResult.failed(f"{ctx.rel_path}: damaged or unreadable SQLite database: {exc}")
    finally:
        con.close()


# --- metadata ---------------------------------------------------------------------------------


@dataclass
class _Meta:
    version: str | None
    schema: str | None
    offset_ns: int  # added to raw times to get Unix-epoch ns
    env: dict[str, str]
    host: str | None
    gpus: pl.DataFrame  # device, gpu_name, sm_count, bus_id
    notes: list[str]
    versions: list[str] = field(default_factory=list)  # `key=value` of VERSION_KEYS


def _read_meta(db: _Db) -> _Meta:
    meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if db.has(t)), None)
    nsys_tables = [t for t in ("StringIds", "TARGET_INFO_SESSION_START_TIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                               "NVTX_EVENTS") if db.has(t)]
    if meta_table is None and len(nsys_tables) < 2:
        raise NotNsys(
            "SQLite database but not an Nsight Systems export (no META_DATA_EXPORT / EXPORT_META_DATA table); "
            "export .nsys-rep files with `nsys export --type sqlite`"
        )
    export: dict[str, str] = {}
    if meta_table:
        export = {str(k): str(v) for k, v in db.rows(f'SELECT name, value FROM "{db.name(meta_table)}"')}
    notes: list[str] = []
    if meta_table is None:
        notes.append("no export metadata table")
    utc = None
    if db.has("TARGET_INFO_SESSION_START_TIME") and "utcEpochNs" in db.cols("TARGET_INFO_SESSION_START_TIME"):
        row = db.rows(f'SELECT utcEpochNs FROM "{db.name("TARGET_INFO_SESSION_START_TIME")}" LIMIT 1')
        utc = int(row[0][0]) if row and row[0][0] is not None else None
    shift = _int(export.get("EXPORT_CONFIG_TIME_SHIFT"))
    normalized = export.get("EXPORT_PARAM_TIME_NORMALIZE", "").lower() == "true"
    if shift is None:
        # Older exports do not record the shift: infer it from the values themselves.
        shift = utc if (normalized or _looks_absolute(db)) and utc is not None else 0
    if utc is None:
        notes.append("no session start time: times are session-relative, not Unix epoch")
        offset = -shift if shift else 0
    else:
        offset = utc - shift
    env = _capture_env(db)
    sysenv = _system_env(db)
    host = next((env[v] for v in HOST_VARS if env.get(v)), None) or sysenv.get("Hostname")
    if not host and db.has("META_DATA_CAPTURE"):
        row = db.rows(f'SELECT value FROM "{db.name("META_DATA_CAPTURE")}" WHERE name = ? LIMIT 1',
                      ("DEVICE_DISPLAY_NAME",))
        host = str(row[0][0]) if row and row[0][0] else None
    return _Meta(
        version=export.get("EXPORT_PRODUCT_VERSION"),
        schema=export.get("EXPORT_SCHEMA_VERSION"),
        offset_ns=offset,
        env=env,
        host=short_host(host),
        gpus=_gpus(db, sysenv),
        notes=notes,
        versions=sorted(f"{k}={sysenv[k]}" for k in VERSION_KEYS if sysenv.get(k)),
    )


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _looks_absolute(db: _Db) -> bool:
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
        if db.has(table):
            row = db.rows(f'SELECT start FROM "{db.name(table)}" LIMIT 1')
            if row:
                return int(row[0][0]) > EPOCH_NS_FLOOR
    return False


def _capture_env(db: _Db) -> dict[str, str]:
    """Environment of the launched process (``PROCESS_0:ENVIRONMENT_VARIABLE`` rows, KEY="value")."""
    if not db.has("META_DATA_CAPTURE"):
        return {}
    env: dict[str, str] = {}
    for (value,) in db.rows(
        f'SELECT value FROM "{db.name("META_DATA_CAPTURE")}" WHERE name LIKE ?', ("PROCESS_0:ENVIRONMENT_VARIABLE",)
    ):
        key, sep, val = str(value).partition("=")
        if sep:
            env.setdefault(key.strip(), val.strip().strip('"'))
    return env


def _system_env(db: _Db) -> dict[str, str]:
    table = "TARGET_INFO_SYSTEM_ENV"
    if not db.has(table) or not {"name", "value"} <= db.cols(table):
        return {}
    wanted = ("Hostname", "GpuInfo", *VERSION_KEYS)
    rows = db.rows(f'SELECT name, value FROM "{db.name(table)}" WHERE name IN ({",".join("?" * len(wanted))})', wanted)
    return {str(k): str(v) for k, v in rows if v is not None}


_GPU_SCHEMA = {"device": pl.Int32(), "gpu_name": pl.String(), "sm_count": pl.Int32(), "bus_id": pl.String()}


def _gpus(db: _Db, sysenv: dict[str, str]) -> pl.DataFrame:
    rows: list[tuple] = []
    if db.has("TARGET_INFO_GPU") and {"id", "name", "smCount"} <= db.cols("TARGET_INFO_GPU"):
        bus = "busLocation" if "busLocation" in db.cols("TARGET_INFO_GPU") else "NULL"
        rows = db.rows(f'SELECT id, name, smCount, {bus} FROM "{db.name("TARGET_INFO_GPU")}"')
    elif sysenv.get("GpuInfo"):
        try:
            for g in json.loads(sysenv["GpuInfo"]).get("Gpus", []):
                rows.append((g.get("CuDevice", g.get("Id")), g.get("Name"), g.get("SmCount"), g.get("BusLocation")))
        except (ValueError, AttributeError):
            rows = []
    if not rows and db.has("TARGET_INFO_CUDA_DEVICE") and {"cudaId",
                                                           "numMultiprocessors"} <= db.cols("TARGET_INFO_CUDA_DEVICE"):
        rows = [(d, None, n, None) for d,
                n in db.rows(f'SELECT DISTINCT cudaId, numMultiprocessors FROM "{db.name("TARGET_INFO_CUDA_DEVICE")}"')]
    df = pl.DataFrame(rows, schema=_GPU_SCHEMA, orient="row") if rows else pl.DataFrame(schema=_GPU_SCHEMA)
    return df.unique("device", keep="first")


# --- event tables -----------------------------------------------------------------------------


def _str(db: _Db, table: str, col: str, alias: str) -> tuple[str, str]:
    """(select expression, join clause) resolving a StringIds reference (or inline text)."""
    if col not in db.cols(table):
        return f"NULL AS {alias}", ""
    if not db.has("StringIds"):
        return f"CASE WHEN typeof(t.{col}) = 'text' THEN t.{col} END AS {alias}", ""
    j = f"s_{alias}"
    return (
        f"CASE WHEN typeof(t.{col}) = 'text' THEN t.{col} ELSE {j}.value END AS {alias}",
        f' LEFT JOIN "{db.name("StringIds")}" {j} ON {j}.id = t.{col}',
    )


def _opt(db: _Db, table: str, col: str, expr: str | None = None) -> str:
    return (expr or f"t.{col}") if col in db.cols(table) else "NULL"


_GPU_OP_SCHEMA = {
    "start_ns": pl.Int64(), "end_ns": pl.Int64(), "device": pl.Int32(), "context": pl.Int64(), "stream": pl.Int64(),
    "correlation": pl.Int64(), "pid": pl.Int64(), "name": pl.String(), "short": pl.String(),
    "grid_x": pl.Int32(), "grid_y": pl.Int32(), "grid_z": pl.Int32(),
    "block_x": pl.Int32(), "block_y": pl.Int32(), "block_z": pl.Int32(), "bytes": pl.Int64(), "kind": pl.String(),
    "graph_id": pl.Int64(), "graph_node_id": pl.Int64(),
}


def _is_text(db: _Db, table: str, col: str) -> bool:
    """String references are StringIds ids in every known export; fall back to inline text if not."""
    row = db.rows(f'SELECT typeof({col}) FROM "{db.name(table)}" WHERE {col} IS NOT NULL LIMIT 1')
    return bool(row) and row[0][0] == "text"


def _id_or_text(db: _Db, table: str, col: str) -> tuple[str, bool]:
    """(select expression, is_id): ids are resolved afterwards with :func:`_resolve`, which keeps one
    copy of each distinct string instead of one Python string per row."""
    if col not in db.cols(table):
        return "NULL", False
    if _is_text(db, table, col) or not db.has("StringIds"):
        return f"CASE WHEN typeof(t.{col}) = 'text' THEN t.{col} END", False
    return f"t.{col}", True


def _resolve(db: _Db, df: pl.DataFrame, table: str, pairs: dict[str, str],
             fix: Callable[[str], str] | None = None) -> pl.DataFrame:
    """Replace id columns ``pairs`` {frame column: table column} by their StringIds values."""
    for out_col in pairs:
        wanted = df[out_col].drop_nulls().unique().to_list()
        rows: list[tuple] = []
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            rows += db.rows(f'SELECT id, value FROM "{db.name("StringIds")}" WHERE id IN '
                            f'({",".join("?" * len(chunk))})', chunk)
        ids = [r[0] for r in rows]
        vals = [fix(r[1]) if fix else r[1] for r in rows]
        df = df.with_columns(
            pl.col(out_col).cast(pl.Int64).replace_strict(ids, vals, default=None,
                                                          return_dtype=pl.String()).alias(out_col)
        )
    return df


def _kernels(db: _Db, off: int) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not db.has(t):
        return pl.DataFrame(schema=_GPU_OP_SCHEMA)
    dem, dem_id = _id_or_text(db, t, "demangledName")
    short, short_id = _id_or_text(db, t, "shortName")
    g = lambda c: _opt(db, t, c)  # noqa: E731
    sql = (
        f"SELECT t.start + {off}, t.end + {off}, t.deviceId, {g('contextId')}, {g('streamId')}, {g('correlationId')}, "
        f"{_opt(db, t, 'globalPid', PID_EXPR.format(col='t.globalPid'))}, {dem}, {short}, "
        f"{g('gridX')}, {g('gridY')}, {g('gridZ')}, {g('blockX')}, {g('blockY')}, {g('blockZ')}, NULL, 'kernel', "
        f"NULLIF({g('graphId')}, 0), NULLIF({g('graphNodeId')}, 0) "
        f'FROM "{db.name(t)}" t'
    )
    schema = dict(_GPU_OP_SCHEMA)
    if dem_id:
        schema["name"] = pl.Int64()
    if short_id:
        schema["short"] = pl.Int64()
    df = db.frame(sql, schema)
    return _resolve(db, df, t, {k: v for k, v,
                                used in (("name", "demangledName", dem_id), ("short", "shortName", short_id)) if used})


def _copies(db: _Db, off: int, table: str, kind: str) -> pl.DataFrame:
    if not db.has(table):
        return pl.DataFrame(schema=_GPU_OP_SCHEMA)
    cols = db.cols(table)
    if kind == "memcpy":
        enum = "ENUM_CUDA_MEMCPY_OPER"
        if "copyKind" in cols and db.has(enum) and {"id", "label"} <= db.cols(enum):
            label = f"(SELECT e.label FROM \"{db.name(enum)}\" e WHERE e.id = t.copyKind)"
        else:
            # ENUM tables are absent from some exports (2022.2): same labels, from ENUM_CUDA_MEMCPY_OPER.
            whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in MEMCPY_KINDS.items())
            label = f"CASE t.copyKind {whens} END" if "copyKind" in cols else "NULL"
        name = f"'[CUDA memcpy ' || COALESCE({label}, 'unknown') || ']'"
    else:
        name = "'[CUDA memset]'"
    sql = (
        f"SELECT t.start + {off}, t.end + {off}, t.deviceId, {_opt(db, table, 'contextId')}, "
        f"{_opt(db, table, 'streamId')}, "
        f"{_opt(db, table, 'correlationId')}, {_opt(db, table, 'globalPid', PID_EXPR.format(col='t.globalPid'))}, "
        f"{name}, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {_opt(db, table, 'bytes')}, '{kind}', NULL, "
        f"NULLIF({_opt(db, table, 'graphNodeId')}, 0) FROM \"{db.name(table)}\" t"
    )
    return db.frame(sql, _GPU_OP_SCHEMA)


def _syncs(db: _Db, off: int) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not db.has(t) or not {"start", "end", "deviceId"} <= db.cols(t):
        return pl.DataFrame(schema=_GPU_OP_SCHEMA)
    enum = "ENUM_CUPTI_SYNC_TYPE"
    if "syncType" in db.cols(t) and db.has(enum) and {"id", "label"} <= db.cols(enum):
        name = (f"'[CUDA sync ' || COALESCE((SELECT e.label FROM \"{db.name(enum)}\" e WHERE e.id = t.syncType), "
                f"'unknown') || ']'")
    else:
        name = "'[CUDA sync]'"
    sql = (
        f"SELECT t.start + {off}, t.end + {off}, t.deviceId, {_opt(db, t, 'contextId')}, {_opt(db, t, 'streamId')}, "
        f"{_opt(db, t, 'correlationId')}, {_opt(db, t, 'globalPid', PID_EXPR.format(col='t.globalPid'))}, {name}, "
        f"NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'sync', NULL, NULL FROM \"{db.name(t)}\" t"
    )
    return db.frame(sql, _GPU_OP_SCHEMA)


def classify_kernels(df: pl.DataFrame) -> pl.DataFrame:
    """class / collective / name_algo / name_proto from the kernel's short (else full) name."""
    base = pl.coalesce(pl.col("short"), pl.col("name"))
    is_nccl = base.str.contains(NCCL_KERNEL)
    coll_token = base.str.extract(_NCCL_COLL, 1)
    return df.with_columns(
        pl.when(pl.col("kind") == "kernel")
        .then(pl.when(is_nccl | pl.col("name").str.contains(DEEPEP_KERNEL) | base.str.contains(TP_OVERLAP_KERNEL))
              .then(pl.lit("comm")).otherwise(pl.lit("compute")))
        .otherwise(pl.col("kind"))
        .alias("class"),
        pl.when(is_nccl).then(coll_token.replace_strict(COLLECTIVES, default=None,
                                                        return_dtype=pl.String())).alias("collective"),
        pl.when(is_nccl).then(base.str.extract(_NAME_ALGO, 1)).alias("name_algo"),
        pl.when(is_nccl).then(base.str.extract(_NAME_PROTO, 1)).alias("name_proto"),
        *([pl.when(pl.col("kind") != "sync").then(_GRAPH_NODE).alias("graph_replay")]
          if "graph_id" in df.columns else []),
    )


# CUPTI gives every kernel, copy and memset that a graph launch ran its graph node id (0 otherwise, which the
# queries read as NULL) and, from nsys 2026.1 (export schema 3.2x), the kernel its graph id as well.
_GRAPH_NODE = pl.col("graph_id").is_not_null() | pl.col("graph_node_id").is_not_null()
GRAPH_LAUNCH = r"^(cudaGraphLaunch|cuGraphLaunch)(_ptsz)?$"
"""Runtime / driver calls that replay a CUDA graph (version suffixes already dropped): every GPU activity of the
replay carries the launch's correlation id (the same rule as for Kineto traces, parsers/kineto.py)."""


def mark_graph_replays(gpu: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    """``graph_replay`` of the GPU activity: a graph node id or graph id recorded, or the correlation id of a
    graph launch call of the same process (exports whose kernels carry neither)."""
    launches = runtime.filter(pl.col("name").str.contains(GRAPH_LAUNCH) & pl.col("correlation").is_not_null())
    if launches.height == 0:
        return gpu
    key = pl.col("pid").cast(pl.Int64) * (1 << 32) + pl.col("correlation").cast(pl.Int64)
    launched = launches.select(key.alias("k"))["k"].implode()
    by_launch = key.is_in(launched).fill_null(False)
    return gpu.with_columns(pl.when(pl.col("kind") != "sync").then(_GRAPH_NODE | by_launch).alias("graph_replay"))


_RUNTIME_SCHEMA = {"start_ns": pl.Int64(), "end_ns": pl.Int64(), "pid": pl.Int64(), "tid": pl.Int64(),
                   "correlation": pl.Int64(), "name": pl.String()}


def _runtime(db: _Db, off: int) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not db.has(t):
        return pl.DataFrame(schema=_RUNTIME_SCHEMA)
    name, name_id = _id_or_text(db, t, "nameId")
    sql = (
        f"SELECT t.start + {off}, t.end + {off}, {PID_EXPR.format(col='t.globalTid')}, "
        f"{TID_EXPR.format(col='t.globalTid')}, "
        f"{_opt(db, t, 'correlationId')}, {name} FROM \"{db.name(t)}\" t"
    )
    df = db.frame(sql, {**_RUNTIME_SCHEMA, "name": pl.Int64() if name_id else pl.String()})
    # API names carry version suffixes (cudaLaunchKernel_v7000); drop them, as Kineto names do.
    if not name_id:
        return df.with_columns(pl.col("name").str.replace(r"_v\d+$", ""))
    return _resolve(db, df, t, {"name": "nameId"}, fix=lambda n: _API_VERSION.sub("", n))


_NVTX_SCHEMA = {"start_ns": pl.Int64(), "end_ns": pl.Int64(), "event_type": pl.Int32(), "domain": pl.Int64(),
                "pid": pl.Int64(), "tid": pl.Int64(), "name": pl.String(), "json": pl.String(), "blob": pl.Binary()}


def _nvtx(db: _Db, off: int) -> pl.DataFrame:
    t = "NVTX_EVENTS"
    if not db.has(t):
        return pl.DataFrame(schema=_NVTX_SCHEMA)
    cols = db.cols(t)
    text_id, j = _str(db, t, "textId", "text_id")
    text = "t.text" if "text" in cols else "NULL"
    text_expr = text_id.replace(" AS text_id", "")
    json_col = "t.jsonText" if "jsonText" in cols else "NULL"
    blob = "t.binaryData" if "binaryData" in cols else "NULL"
    types = ",".join(str(x) for x in (*NVTX_RANGE_TYPES, NVTX_DOMAIN_CREATE, NVTX_THREAD, NVTX_MARK))
    sql = (
        f"SELECT t.start + {off}, t.end + {off}, t.eventType, {_opt(db, t, 'domainId')}, "
        f"{PID_EXPR.format(col='t.globalTid')}, {TID_EXPR.format(col='t.globalTid')}, "
        f"COALESCE({text}, {text_expr}), {json_col}, {blob} FROM \"{db.name(t)}\" t{j} WHERE t.eventType IN ({types})"
    )
    return db.frame(sql, _NVTX_SCHEMA)


_OVERHEAD_SCHEMA = {"start_ns": pl.Int64(), "end_ns": pl.Int64(), "pid": pl.Int64(), "name": pl.String()}


def _overhead(db: _Db, off: int) -> pl.DataFrame:
    t = "PROFILER_OVERHEAD"
    if not db.has(t) or "globalTid" not in db.cols(t):
        return pl.DataFrame(schema=_OVERHEAD_SCHEMA)
    name, j = _str(db, t, "nameId", "name")
    sql = (
        f"SELECT t.start + {off}, t.end + {off}, {PID_EXPR.format(col='t.globalTid')}, {name} "
        f"FROM \"{db.name(t)}\" t{j}"
    )
    return db.frame(sql, _OVERHEAD_SCHEMA).filter(pl.col("name").is_in(PROFILER_OVERHEAD_NAMES))


_METRIC_SCHEMA = {"timestamp_ns": pl.Int64(), "device": pl.Int32(), **{c: pl.Float64() for c in GPU_METRICS.values()}}


def _gpu_metrics(db: _Db, off: int) -> pl.DataFrame:
    """GPU_METRICS samples pivoted in SQL to one row per (GPU, timestamp); GPU = typeId & 0xFF."""
    if not (db.has("GPU_METRICS") and db.has("TARGET_INFO_GPU_METRICS")):
        return _generic_gpu_metrics(db, off)
    info = db.rows(f'SELECT DISTINCT typeId, metricId, metricName FROM "{db.name("TARGET_INFO_GPU_METRICS")}"')
    wanted: dict[str, list[tuple[int, int]]] = {c: [] for c in GPU_METRICS.values()}
    for type_id, metric_id, metric_name in info:
        for prefix, col in GPU_METRICS.items():
            if str(metric_name).startswith(prefix):
                wanted[col].append((int(type_id), int(metric_id)))
    if not any(wanted.values()):
        return pl.DataFrame(schema=_METRIC_SCHEMA)
    cases = []
    for pairs in wanted.values():
        cond = " OR ".join(f"(typeId = {a} AND metricId = {b})" for a, b in pairs) or "0"
        cases.append(f"MAX(CASE WHEN {cond} THEN value END)")
    all_pairs = " OR ".join(f"(typeId = {a} AND metricId = {b})" for ps in wanted.values() for a, b in ps)
    sql = (
        f"SELECT timestamp + {off}, typeId & 255, {', '.join(cases)} FROM \"{db.name('GPU_METRICS')}\" "
        f"WHERE {all_pairs} GROUP BY timestamp, typeId & 255 ORDER BY typeId & 255, timestamp"
    )
    return db.frame(sql, _METRIC_SCHEMA)


def _generic_gpu_metrics(db: _Db, off: int) -> pl.DataFrame:
    """Exports before the GPU_METRICS table kept samples as JSON in GENERIC_EVENTS (`data` with keys
    like "SM Active"); nsys' 2023.3 gpu_metric_util_map recipe reads them that way."""
    t = "GENERIC_EVENTS"
    if not db.has(t) or not {"typeId", "data"} <= db.cols(t):
        return pl.DataFrame(schema=_METRIC_SCHEMA)
    ts = "COALESCE(timestamp, rawTimestamp)" if "timestamp" in db.cols(t) else "rawTimestamp"
    keys = {col: [k for k, c in GPU_METRICS.items() if c == col] for col in dict.fromkeys(GPU_METRICS.values())}
    picks = [
        "COALESCE(" + ", ".join(f"JSON_EXTRACT(data, '$.\"{k}\"')" for k in ks) + ", NULL)" for ks in keys.values()
    ]
    sql = (
        f"SELECT {ts} + {off}, typeId & 255, {', '.join(picks)} FROM \"{db.name(t)}\" "
        f"WHERE json_valid(data) AND ({' OR '.join(p + ' IS NOT NULL' for p in picks)})"
    )
    try:
        return db.frame(sql, _METRIC_SCHEMA)
    except sqlite3.OperationalError:  # SQLite built without JSON functions
        return pl.DataFrame(schema=_METRIC_SCHEMA)


# --- NCCL NVTX payloads -----------------------------------------------------------------------


def _payload_schemas(db: _Db) -> list[tuple[int, dict[str, tuple[int, int]], int | None]]:
    """(domain, {entry name: (type, offset)}, payload size) per NVTX payload schema."""
    t = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
    if not db.has(t) or not {"domainId", "schemaId", "name", "type"} <= db.cols(t):
        return []
    off = "offset" if "offset" in db.cols(t) else "NULL"
    entries: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
    for dom, sid, name, typ, o in db.rows(f'SELECT DISTINCT domainId, schemaId, name, type, {off} FROM "{db.name(t)}"'):
        if name is None:
            continue
        entries.setdefault((dom, sid), {})[str(name)] = (int(typ or 0), int(o or 0))
    sizes: dict[tuple[int, int], int] = {}
    s = "NVTX_PAYLOAD_SCHEMAS"
    if db.has(s) and {"domainId", "schemaId", "payloadSize"} <= db.cols(s):
        sizes = {(d, i): p for d, i,
                 p in db.rows(f'SELECT DISTINCT domainId, schemaId, payloadSize FROM "{db.name(s)}"') if p}
    return [(k[0], v, sizes.get(k)) for k, v in entries.items()]


def _decode_payload(blob: bytes | None, js: str | None, schemas: list, domain: int, want: tuple[str, ...]) -> dict[str,
                                                                                                                   Any]:
    """Named fields of one NCCL NVTX payload: from jsonText when exported, else from the binary blob
    laid out by the schema whose entries include ``want`` (and whose size fits the blob)."""
    if js:
        try:
            data = json.loads(js)
            if isinstance(data, dict):
                return data
        except ValueError:
            pass
    if not blob:
        return {}
    for dom, entries, size in schemas:
        if dom != domain or not all(w in entries for w in want) or (size and size > len(blob)):
            continue
        out: dict[str, Any] = {}
        for name, (typ, offset) in entries.items():
            fmt = _PAYLOAD_FMT.get(typ, "i" if typ > 0xFFFF else None)  # enum schema ids -> int32
            if fmt and offset + struct.calcsize(fmt) <= len(blob):
                out[name] = struct.unpack_from("<" + fmt, blob, offset)[0]
        return out
    return {}


def _field(payload: dict[str, Any], *prefixes: str) -> Any:
    for key, value in payload.items():
        if any(key.startswith(p) for p in prefixes):
            return value
    return None


# --- assembly ---------------------------------------------------------------------------------


@dataclass
class _Job:
    """One file's parse in progress: where it is, and what went wrong in which table."""

    db: _Db
    meta: _Meta
    src: str
    damaged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def safe(self, table: str, read: Callable[[], pl.DataFrame], schema: Mapping[str, Any]) -> pl.DataFrame:
        # A damaged page breaks one table, not the file: salvage the rest and say which table failed.
        self.db.errors.clear()
        try:
            df = read()
        except sqlite3.DatabaseError as exc:
            self.damaged.append(f"{table} ({exc})")
            return pl.DataFrame(schema=schema)
        self.damaged.extend(f"{table} ({e})" for e in self.db.errors)
        return df


@dataclass
class _Ranks:
    """Rank of each GPU process; ``how`` says where it came from, ``guessed`` that the file named none."""

    by_pid: dict[int, int]
    how: str | None
    guessed: bool = False

    def tagger(self, host: str | None, src: str) -> Callable[[pl.DataFrame], pl.DataFrame]:
        def tag(df: pl.DataFrame) -> pl.DataFrame:
            # a mapping, not a join: no copy of the (possibly large) frame
            rank = (
                pl.col("pid").replace_strict(self.by_pid, default=None, return_dtype=pl.Int32())
                if "pid" in df.columns else pl.lit(None, pl.Int32())
            )
            return df.with_columns(rank.alias("rank"), pl.lit(host, pl.String()).alias("host"),
                                   pl.lit(src).alias("source"))

        return tag


def _gpu_ops(job: _Job) -> pl.DataFrame:
    db, off, safe = job.db, job.meta.offset_ns, job.safe
    gpu = pl.concat(
        [safe("CUPTI_ACTIVITY_KIND_KERNEL", lambda: _kernels(db, off), _GPU_OP_SCHEMA),
         safe("CUPTI_ACTIVITY_KIND_MEMCPY", lambda: _copies(db, off, "CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
              _GPU_OP_SCHEMA),
         safe("CUPTI_ACTIVITY_KIND_MEMSET", lambda: _copies(db, off, "CUPTI_ACTIVITY_KIND_MEMSET", "memset"),
              _GPU_OP_SCHEMA),
         safe("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", lambda: _syncs(db, off), _GPU_OP_SCHEMA)],
        how="vertical",
    )
    return classify_kernels(gpu)


def _env_rank(env: dict[str, str]) -> int | None:
    env_rank = next((_int(env[v]) for v in RANK_VARS if env.get(v) not in (None, "")), None)
    if env_rank is None and all(env.get(v) for v in ("GROUP_RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK")):
        env_rank = int(env["GROUP_RANK"]) * int(env["LOCAL_WORLD_SIZE"]) + int(env["LOCAL_RANK"])
    return env_rank


def _rank_map(job: _Job, nvtx: pl.DataFrame, procs: pl.DataFrame) -> _Ranks:
    """Ranks of the GPU processes: MPI thread names, else (one process) the environment or the file
    name, else numbered from 0 in GPU order, flagged as a guess."""
    by_pid: dict[int, int] = {}
    mpi = nvtx.filter(pl.col("event_type") == NVTX_THREAD).with_columns(
        pl.col("name").str.extract(r"^MPI Rank (\d+)$", 1).cast(pl.Int64, strict=False).alias("r")
    ).drop_nulls("r")
    for pid, r in mpi.select("pid", "r").unique().iter_rows():
        by_pid.setdefault(int(pid), int(r))
    pids = procs["pid"].to_list()
    how = "MPI thread name" if by_pid else None
    env_rank = _env_rank(job.meta.env)
    if len(pids) == 1 and pids[0] not in by_pid:
        file_rank = _FILE_RANK.search(Path(job.src).name)
        if env_rank is not None:
            by_pid[pids[0]], how = env_rank, "environment"
        elif file_rank:
            by_pid[pids[0]], how = int(file_rank.group(1)), "file name"
    elif len(pids) > 1 and env_rank is not None:
        job.notes.append(f"{len(pids)} GPU processes in one file: environment rank {env_rank} not applied to them")
    if by_pid or not pids:
        return _Ranks(by_pid, how)
    # No rank anywhere: number the processes by their first GPU (then pid), as torchrun's local ranks usually are.
    order = procs.select("pid", pl.col("devices").list.first().alias("d")).sort("d", "pid", nulls_last=True)["pid"]
    return _Ranks({int(p): i for i, p in enumerate(order.to_list())}, "process order", guessed=True)


def _cpu_side(job: _Job, gpu: pl.DataFrame, runtime: pl.DataFrame, ranges: pl.DataFrame,
              tag: Callable[[pl.DataFrame], pl.DataFrame]) -> tuple[pl.DataFrame, int, int]:
    """cpu_ops (CUDA runtime/driver calls and closed NVTX ranges), and how many of each there were."""
    # is_launch = it has a GPU op with the same (pid, correlation). Correlation ids are per process:
    # key = (pid, correlation) packed in one Int64 (ids < 2^32).
    key = (pl.col("pid").cast(pl.Int64) * (1 << 32) + pl.col("correlation").cast(pl.Int64))
    # Synchronization records (cudaStreamWaitEvent, cudaEventSynchronize) are not launched work.
    launched = gpu.select(pl.when(pl.col("kind") != "sync").then(key).alias("k")).drop_nulls()["k"]
    rt = runtime.with_columns(
        key.is_in(launched.implode()).fill_null(False).alias("is_launch"),
        pl.when(pl.col("name").str.starts_with("cu") & ~pl.col("name").str.starts_with("cuda"))
        .then(pl.lit("cuda_driver")).otherwise(pl.lit("cuda_runtime")).alias("category"),
    )
    annotations = ranges.select("start_ns", "end_ns", "pid", "tid", "name").with_columns(
        pl.lit("user_annotation").alias("category"), pl.lit(False).alias("is_launch")
    )
    return fr.concat("cpu_ops", [tag(rt), tag(annotations)]), rt.height, annotations.height


def _kernel_frame(meta: _Meta, gpu: pl.DataFrame, comms: pl.DataFrame,
                  tag: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    kern = tag(gpu)
    if meta.gpus.height:
        sms = dict(zip(meta.gpus["device"].to_list(), meta.gpus["sm_count"].to_list()))
        sm_count = pl.col("device").replace_strict(sms, default=None, return_dtype=pl.Float64())
        kern = kern.with_columns(
            (pl.col("grid_x").cast(pl.Float64) * pl.col("grid_y") * pl.col("grid_z") / sm_count).alias("blocks_per_sm")
        )
    # NCCL kernels take message size and communicator from the NCCL call that launched them (payloads).
    linked = comms.filter(pl.col("kernel_correlation").is_not_null() & pl.any_horizontal(
        pl.col("bytes").is_not_null(), pl.col("pg_name").is_not_null()))
    if linked.height:
        lk = (linked["pid"] * (1 << 32) + linked["kernel_correlation"]).to_list()
        kkey = pl.col("pid").cast(pl.Int64) * (1 << 32) + pl.col("correlation").cast(pl.Int64)
        kern = kern.with_columns(
            kkey.replace_strict(lk, linked["bytes"].to_list(), default=None, return_dtype=pl.Int64()).alias("bytes"),
            kkey.replace_strict(lk, linked["pg_name"].to_list(), default=None,
                                return_dtype=pl.String()).alias("pg_name"),
            kkey.replace_strict(lk, linked["group_size"].to_list(), default=None,
                                return_dtype=pl.Int32()).alias("group_size"),
        )
    return fr.conform("kernels", kern.drop("context", "pid", "short", "kind", "sm_count", strict=False))


def _ranks_frame(meta: _Meta, procs: pl.DataFrame, tag: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    """One row per GPU process."""
    world = next((_int(meta.env[v]) for v in WORLD_VARS if meta.env.get(v)), None)
    ranks_rows = procs.with_columns(
        pl.col("devices").list.first().cast(pl.Int32).alias("device"),
        pl.lit(world, pl.Int32()).alias("world_size"),
        pl.lit(meta.env.get("NCCL_VERSION"), pl.String()).alias("nccl_version"),
        pl.lit(meta.versions, pl.List(pl.String())).alias("versions"),
    ).drop("devices", "first")
    if meta.gpus.height:
        ranks_rows = ranks_rows.join(meta.gpus.select("device", "gpu_name", "sm_count"), on="device", how="left")
    return fr.conform("ranks", tag(ranks_rows))


def _rank_text(ranks: _Ranks, n_pids: int) -> tuple[int | None, str]:
    """The file's one rank (None when it holds several processes) and how the message says it."""
    values = set(ranks.by_pid.values())
    single = next(iter(values)) if len(values) == 1 and n_pids <= 1 else None
    if ranks.guessed:
        what = "rank 0" if n_pids == 1 else f"ranks 0-{n_pids - 1} in GPU order"
        return single, f", rank unknown (none in the environment, MPI thread names or file name): analysed as {what}"
    if single is not None:
        return single, f", rank {single} from {ranks.how}"
    return single, ", rank unknown" if not ranks.by_pid else ""


def _parse(db: _Db, path: Path, ctx: ParseContext) -> ParseResult:
    db.tables = {r[0].lower(): r[0] for r in db.rows("SELECT name FROM sqlite_master WHERE type = 'table'")}
    meta = _read_meta(db)
    off = meta.offset_ns
    job = _Job(db, meta, ctx.rel_path, notes=list(meta.notes))
    gpu = _gpu_ops(job)
    runtime = job.safe("CUPTI_ACTIVITY_KIND_RUNTIME", lambda: _runtime(db, off), _RUNTIME_SCHEMA)
    gpu = mark_graph_replays(gpu, runtime)
    nvtx = job.safe("NVTX_EVENTS", lambda: _nvtx(db, off), _NVTX_SCHEMA)

    # Processes that did GPU work, and their device(s): one file may hold several ranks (torchrun
    # under one `nsys profile`); rank from the environment only applies when it holds one process.
    procs = (
        gpu.select("pid", "device", "start_ns", "kind").filter(pl.col("pid").is_not_null(), pl.col("kind") != "sync")
        .group_by("pid").agg(pl.col("device").unique().sort().alias("devices"), pl.col("start_ns").min().alias("first"))
        .sort("first")
    )
    ranks = _rank_map(job, nvtx, procs)
    tag = ranks.tagger(meta.host, job.src)
    ranges = nvtx.filter(pl.col("event_type").is_in(NVTX_RANGE_TYPES))
    open_ranges = ranges.filter(pl.col("end_ns").is_null()).height
    ranges = ranges.filter(pl.col("end_ns").is_not_null())
    if open_ranges:
        job.notes.append(f"{open_ranges} NVTX range(s) without an end not used")
    cpu_ops, n_api, n_ranges = _cpu_side(job, gpu, runtime, ranges, tag)

    # steps: NVTX ranges named ProfilerStep#N / step N / iteration N
    step = pl.col("name").str.extract(_STEP_RANGE.pattern, 1).cast(pl.Int64, strict=False)
    steps_df = ranges.with_columns(step.alias("step")).drop_nulls("step")
    steps = fr.conform("steps", tag(steps_df.select("pid", "step", "start_ns",
                                                    "end_ns")).drop("pid").sort("rank", "step", nulls_last=True))
    comms = _comms(db, nvtx, ranges, runtime, gpu, ranks.by_pid, tag)
    kernels = _kernel_frame(meta, gpu, comms, tag)

    # nsys-only frames
    overhead = job.safe("PROFILER_OVERHEAD", lambda: _overhead(db, off), _OVERHEAD_SCHEMA)
    dev_of_pid = procs.select("pid", pl.col("devices")).explode("devices").rename({"devices": "device"})
    overhead = fr.conform("profiler_overhead",
                          tag(overhead.join(dev_of_pid, on="pid", how="inner")).sort("device", "start_ns"))
    metrics = fr.conform("gpu_metrics", _tag_metrics(job.safe("GPU_METRICS", lambda: _gpu_metrics(db, off),
                                                              _METRIC_SCHEMA), ranks.by_pid, procs, meta, job.src))

    out = {
        "kernels": kernels, "cpu_ops": cpu_ops, "steps": steps, "comms": comms, "ranks": _ranks_frame(meta, procs, tag),
        "profiler_overhead": overhead,
    }
    if metrics.height or db.has("GPU_METRICS"):
        out["gpu_metrics"] = metrics
    single_rank, rank_text = _rank_text(ranks, procs.height)
    n_comm = kernels.filter(pl.col("class") == "comm").height
    msg = (
        f"nsys {meta.version or '?'} (schema {meta.schema or '?'}): {kernels.height} GPU ops ({n_comm} NCCL), "
        f"{n_api} CUDA API calls, {n_ranges} NVTX ranges, {procs.height} GPU process(es)"
        + rank_text
        + (f", {metrics.height} GPU metric samples" if metrics.height else "")
        + ("; " + "; ".join(job.notes) if job.notes else "")
    )
    status = "ok"
    if job.damaged:
        status, msg = "partial", f"{job.src}: unreadable table(s): {'; '.join(job.damaged)}; salvaged: {msg}"
    return ParseResult(frames=out, status=status, message=msg, rank=single_rank, host=meta.host,
                       rank_guessed=ranks.guessed)


def _tag_metrics(df: pl.DataFrame, rank_by_pid: dict[int, int], procs: pl.DataFrame, meta: _Meta,
                 src: str) -> pl.DataFrame:
    # GPU metrics are per GPU, not per process: a GPU used by exactly one ranked process gets its rank.
    dev_rank = (
        procs.explode("devices").rename({"devices": "device"})
        .with_columns(pl.col("pid").replace_strict(rank_by_pid, default=None, return_dtype=pl.Int32()).alias("rank"))
        .group_by("device").agg(pl.col("rank").unique())
        .filter(pl.col("rank").list.len() == 1).with_columns(pl.col("rank").list.first(),
                                                             pl.col("device").cast(pl.Int32))
    )
    out = df.join(dev_rank, on="device",
                  how="left") if dev_rank.height else df.with_columns(pl.lit(None, pl.Int32()).alias("rank"))
    return out.with_columns(pl.lit(meta.host, pl.String()).alias("host"), pl.lit(src).alias("source"))


def _payload_columns(db: _Db, calls: pl.DataFrame, ranges: pl.DataFrame, created: list) -> pl.DataFrame:
    """Payload fields (message size, peer, root, communicator, ranks) when the export kept them."""
    if not (calls["blob"].drop_nulls().len() or calls["json"].drop_nulls().len()):
        return calls.with_columns(pl.lit(None, pl.Int64()).alias("bytes"), pl.lit(None, pl.Int32()).alias("peer"),
                                  pl.lit(None, pl.String()).alias("pg_name"),
                                  pl.lit(None, pl.Int32()).alias("group_size"))
    schemas = _payload_schemas(db)
    want_by = {"send": ("Peer rank",), "recv": ("Peer rank",), "broadcast": ("Root",), "reduce": ("Root",),
               "allreduce": ("Reduction operation",), "reduce_scatter": ("Reduction operation",)}
    decoded = [
        _decode_payload(b, j, schemas, d if d is not None else 0, want_by.get(c, ("Message size [bytes]",)))
        for b, j, d, c in calls.select("blob", "json", "domain", "collective").iter_rows()
    ]
    calls = calls.with_columns(
        pl.Series("bytes", [_field(p, "Message size") for p in decoded], dtype=pl.Int64()),
        pl.Series("peer", [_field(p, "Peer rank") for p in decoded], dtype=pl.Int32()),
        pl.Series("pg_name", [(f"0x{int(v):x}" if v is not None else None)
                              for v in (_field(p, "NCCL communicator") for p in decoded)], dtype=pl.String()),
    )
    # Communicator sizes from the init calls' payloads ("No. of ranks"), by communicator id.
    inits = ranges.filter(pl.col("name").str.starts_with("ncclCommInit") | (pl.col("name") == "ncclCommSplit"))
    if created:
        inits = inits.filter(pl.col("domain").is_in(created))
    sizes: dict[str, int] = {}
    for b, j, d in inits.select("blob", "json", "domain").iter_rows():
        p = _decode_payload(b, j, schemas, d if d is not None else 0, ("No. of ranks",))
        comm, n = _field(p, "NCCL communicator"), _field(p, "No. of ranks")
        if comm is not None and n is not None:
            sizes[f"0x{int(comm):x}"] = int(n)
    return calls.with_columns(pl.col("pg_name").replace_strict(sizes, default=None,
                                                               return_dtype=pl.Int32()).alias("group_size"))


def _kernel_links(calls: pl.DataFrame, ranges: pl.DataFrame, runtime: pl.DataFrame, gpu: pl.DataFrame,
                  created: list) -> pl.DataFrame:
    """(_i, kernel_correlation): the NCCL kernel each call launched (a runtime launch on the same
    thread inside the range), or for grouped calls the one launched inside the next ncclGroupEnd."""
    comm_corr = gpu.filter(pl.col("class") == "comm").select("pid", "correlation").unique()
    launches = runtime.join(comm_corr, on=["pid", "correlation"], how="semi").select(
        "pid", "tid", pl.col("start_ns").alias("launch_ns"), pl.col("correlation").alias("kernel_correlation")
    ).sort("launch_ns")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both sides are sorted by time; Polars cannot check it per group
        linked = (
            calls.select("_i", "pid", "tid", "start_ns", "end_ns").sort("start_ns")
            .join_asof(launches, left_on="start_ns", right_on="launch_ns", by=["pid", "tid"], strategy="forward")
            .filter(pl.col("launch_ns") <= pl.col("end_ns"))
            .select("_i", "kernel_correlation")
        )
        # Grouped calls (ncclGroupStart; ncclSend; ncclRecv; ncclGroupEnd) launch nothing themselves: the
        # kernel is launched inside the ncclGroupEnd that follows on the same thread.
        ends = ranges.filter(pl.col("name") == "ncclGroupEnd")
        if created:
            ends = ends.filter(pl.col("domain").is_in(created))
        ends = ends.select("pid", "tid", "start_ns", "end_ns").sort("start_ns").with_row_index("_g")
        launched_in = (
            ends.join_asof(launches, left_on="start_ns", right_on="launch_ns", by=["pid", "tid"], strategy="forward")
            .filter(pl.col("launch_ns") <= pl.col("end_ns"))
            .select("_g", pl.col("kernel_correlation").alias("_gcorr"))
        )
        # every group end stays (null when it launched nothing), so a call never skips to a later group
        group_links = ends.join(launched_in, on="_g", how="left").select(
            "pid", "tid", pl.col("start_ns").alias("_ge"), "_gcorr").sort("_ge")
        unlinked = (
            calls.join(linked, on="_i", how="anti").select("_i", "pid", "tid", "start_ns").sort("start_ns")
            .join_asof(group_links, left_on="start_ns", right_on="_ge", by=["pid", "tid"], strategy="forward")
            .filter(pl.col("_gcorr").is_not_null())
            .select("_i", pl.col("_gcorr").alias("kernel_correlation"))
        )
    return pl.concat([linked, unlinked])


def _comms(db: _Db, nvtx: pl.DataFrame, ranges: pl.DataFrame, runtime: pl.DataFrame, gpu: pl.DataFrame,
           rank_by_pid: dict[int, int], tag: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    """Host-side NCCL calls from NVTX ranges of the ``NCCL`` domain (found by its NvtxDomainCreate row;
    windowed exports lose that row, then any domain whose ranges carry NCCL API names)."""
    created = nvtx.filter((pl.col("event_type") == NVTX_DOMAIN_CREATE)
                          & (pl.col("name") == "NCCL"))["domain"].unique().to_list()
    calls = ranges.filter(pl.col("name").is_in(list(NCCL_API)))
    if created:
        calls = calls.filter(pl.col("domain").is_in(created))
    else:
        calls = calls.filter(pl.col("domain").fill_null(0) != 0)
    if calls.height == 0:
        return fr.empty("comms")
    calls = calls.with_columns(pl.col("name").replace_strict(NCCL_API,
                                                             default=None).alias("collective")).with_row_index("_i")
    calls = _payload_columns(db, calls, ranges, created)
    calls = calls.join(_kernel_links(calls, ranges, runtime, gpu, created), on="_i", how="left")
    own = pl.col("pid").replace_strict(rank_by_pid, default=None, return_dtype=pl.Int32())
    calls = calls.with_columns(
        pl.when(pl.col("collective") == "send").then(own)
        .when(pl.col("collective") == "recv").then(pl.col("peer")).alias("src_rank"),
        pl.when(pl.col("collective") == "send").then(pl.col("peer"))
        .when(pl.col("collective") == "recv").then(own).alias("dst_rank"),
    )
    cols = ["pid", "tid", "name", "collective", "start_ns", "end_ns", "kernel_correlation", "pg_name", "group_size",
            "bytes", "src_rank", "dst_rank"]
    return fr.conform("comms", tag(calls.select(cols)).sort("start_ns"))
