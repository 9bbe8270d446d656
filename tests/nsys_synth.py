"""Tiny synthetic Nsight Systems exports for the cases no real sample covers (GPU metrics, NCCL NVTX
payload blobs, rank variables, old metadata table name). DDL follows the real 3.x schema
(../shared/research/nsys_schema_2023.4.4_v3.7.2_full.sql), reduced to the columns used."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path

DDL = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT, busLocation TEXT, smCount INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
  gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData BLOB);
CREATE TABLE NVTX_PAYLOAD_SCHEMAS (domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER, flags INTEGER,
  numEntries INTEGER, payloadSize INTEGER, alignTo INTEGER);
CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INTEGER, schemaId INTEGER, idx INTEGER, flags INTEGER,
  type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER);
"""
METRICS_DDL = """
CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL,
  value INTEGER NOT NULL);
CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL,
  metricId INTEGER NOT NULL, metricName TEXT NOT NULL);
"""


def gtid(pid: int, tid: int) -> int:
    """nsys' serialized global thread id: hardware id 1 in bits 48+, pid in 24-47, tid in 0-23."""
    return (1 << 48) | (pid << 24) | tid


def gpid(pid: int) -> int:
    return (1 << 48) | (pid << 24)


def make_export(
    path: Path,
    *,
    meta_table: str = "META_DATA_EXPORT",
    utc_epoch_ns: int = 1_700_000_000_000_000_000,
    env: dict[str, str] | None = None,
    kernels: Iterable[tuple] = (),  # (start, end, device, stream, corr, pid, name, grid_x)
    runtime: Iterable[tuple] = (),  # (start, end, pid, tid, corr, name)
    nvtx: Iterable[tuple] = (),  # (start, end, eventType, pid, tid, text, domainId, jsonText, binaryData)
    schema_entries: Iterable[tuple] = (),  # (domainId, schemaId, idx, type, name, offset)
    schemas: Iterable[tuple] = (),  # (domainId, schemaId, payloadSize)
    metrics: Iterable[tuple] | None = None,  # (timestamp, device, metricName, value)
    graph_columns: tuple[str, ...] = (),  # kernel columns graphNodeId (nsys 2022.2+), graphId (2026.1+)
    memsets: Iterable[tuple] = (),  # (start, end, device, stream, corr, pid, bytes, graphNodeId)
) -> Path:
    con = sqlite3.connect(path)
    con.executescript(DDL)
    for col in graph_columns:
        con.execute(f"ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL ADD COLUMN {col} INTEGER")
    con.execute(f"CREATE TABLE {meta_table} (name TEXT, value TEXT)")
    con.executemany(f"INSERT INTO {meta_table} VALUES (?, ?)", [
        ("EXPORT_PRODUCT_VERSION", "2099.1.1"), ("EXPORT_SCHEMA_VERSION", "3.99.0"),
        ("EXPORT_PARAM_TIME_NORMALIZE", "false"), ("EXPORT_CONFIG_TIME_SHIFT", "0"),
    ])
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (utc_epoch_ns,))
    con.executemany("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                    [(f'{k}="{v}"',) for k, v in (env or {}).items()])
    con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 0, 'NVIDIA H100 80GB HBM3', '0000:18:00.0', 132)")
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings) + 1
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[text], text))
        return strings[text]

    _kernels(con, sid, kernels, len(graph_columns))
    _memsets(con, memsets)
    for start, end, pid, tid, corr, name in runtime:
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,1,?,?,?,0)",
                    (start, end, gtid(pid, tid), corr, sid(name)))
    for start, end, etype, pid, tid, text, dom, js, blob in nvtx:
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text, domainId, jsonText, binaryData) VALUES "
            "(?,?,?,?,?,?,?,?)",
            (start, end, etype, gtid(pid, tid), text, dom, js, blob))
    for dom, schema, idx, typ, name, offset in schema_entries:
        con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (?,?,?,0,?,?,NULL,NULL,?)",
                    (dom, schema, idx, typ, name, offset))
    for dom, schema, size in schemas:
        con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (?,?,NULL,1,0,3,?,0)", (dom, schema, size))
    if metrics is not None:
        con.executescript(METRICS_DDL)
        names: dict[str, int] = {}
        for ts, dev, metric, value in metrics:
            mid = names.setdefault(metric, len(names))
            con.execute("INSERT INTO GPU_METRICS VALUES (?,?,?,?)", (ts, 0x10000 | dev, mid, value))
        devs = {dev for _, dev, _, _ in metrics}
        con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?,0,'GPU',?,?)",
                        [(0x10000 | d, mid, name) for d in devs for name, mid in names.items()])
    con.commit()
    con.close()
    return path


def _kernels(con: sqlite3.Connection, sid: Callable[[str], int], kernels: Iterable[tuple], n_graph: int) -> None:
    for start, end, dev, stream, corr, pid, name, grid_x, *graph in kernels:  # graph: graphNodeId[, graphId]
        short = name.split("(")[0]
        graph = graph[:n_graph] + [None] * (n_graph - len(graph))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,1,?,?,?,?,?,?,1,1,128,1,1"
                    + ",?" * n_graph + ")",
                    (start, end, dev, stream, corr, gpid(pid), sid(name), sid(short), grid_x, *graph))


def _memsets(con: sqlite3.Connection, memsets: Iterable[tuple]) -> None:
    rows = [(s, e, d, st, c, gpid(p), b, g) for s, e, d, st, c, p, b, g in memsets]
    if not rows:
        return
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, "
                "correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, "
                "graphNodeId INTEGER, memKind INTEGER)")
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?,?,?,1,?,?,?,0,?,?,NULL)", rows)
