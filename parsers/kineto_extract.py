"""Per-chunk extraction: event dicts -> compact typed column buffers -> Polars frames at the end.

Only the fields the canonical frames need are copied out of each event, into ``array.array``
buffers (8 bytes a value, no per-event Python objects); names are interned into a small table
and stored as integer codes. The event dicts are dropped with their chunk. Times stay in the
trace's own unit (µs, int or float) here and are converted to integer ns in Polars, exactly
(see ``us_to_ns``).
"""

from __future__ import annotations

import math
import operator
import os
from array import array
from collections import Counter
from itertools import compress
from typing import Any

import orjson
import polars as pl
from forensics.parsers.kineto_typed import CUT_PH, EMPTY_ARGS, NULL, UNSET, Args, Event, TypedRejected

from forensics.base.flops import SHAPED_OPS, TRITON_TEMPLATE_PREFIX

try:  # the compiled reader (parsers/kineto_columns.c): optional, the typed reader does everything without it
    from forensics.parsers import kineto_columns
except ImportError:  # pragma: no cover - built without a C compiler
    kineto_columns = None
if os.environ.get("FORENSICS_KINETO_READER") == "python":  # the Python readers alone (benchmarks, comparisons)
    kineto_columns = None

NAN = math.nan

# Kineto category -> code. Legacy (2021) names map to today's.
GPU_KINDS = ("kernel", "memcpy", "memset", "sync")
GPU_CATS = {
    "kernel": 0, "Kernel": 0,
    "gpu_memcpy": 1, "Memcpy": 1,
    "gpu_memset": 2, "Memset": 2,
    "cuda_sync": 3,
}
CPU_CATEGORIES = ("cpu_op", "user_annotation", "gpu_user_annotation", "cuda_runtime", "cuda_driver", "python_function")
CPU_CATS = {
    "cpu_op": 0, "Operator": 0,
    "user_annotation": 1,
    "gpu_user_annotation": 2,
    "cuda_runtime": 3, "Runtime": 3,
    "cuda_driver": 4,
    "python_function": 5, "Python": 5,
}
# Host-side ops whose args may carry collective metadata (only from these categories).
COMM_OP_PREFIXES = ("record_param_comms", "nccl:", "c10d::", "gloo:")
_COMM_OP_CATS = (0, 1)

GPU_ARG_KEYS = (
    ("Collective name", "coll_raw"), ("In msg nelems", "in_nelems"), ("Out msg nelems", "out_nelems"),
    ("dtype", "dtype"), ("Group size", "group_size"), ("Process Group Name", "pg_name"),
    ("Process Group Description", "pg_desc"), ("Process Group Ranks", "pg_ranks_raw"), ("Seq", "seq"),
)
COMM_ARG_KEYS = GPU_ARG_KEYS + (
    ("Src Rank", "src_rank"), ("Dst Rank", "dst_rank"),
    ("Process Group ID", "pg_id"),  # 2024-04 variant of Process Group Name
)
_INT_ARGS = {"in_nelems", "out_nelems", "group_size", "seq", "src_rank", "dst_rank"}
_ARG_TYPES: dict[str, type[pl.DataType]] = {**dict.fromkeys(_INT_ARGS, pl.Int64), "pg_ranks_raw": pl.UInt32}
"""The args columns' types other than String (``pg_ranks_raw``: a code into ``Extractor.rank_texts``)."""
_GPU_COLS = tuple(col for _, col in GPU_ARG_KEYS)
_COMM_COLS = tuple(col for _, col in COMM_ARG_KEYS)
_gpu_values = operator.attrgetter(*_GPU_COLS)  # the typed Args fields are named after the columns
_comm_values = operator.attrgetter(*_COMM_COLS)

_DIMS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
_EMPTY: dict = {}
_NO3 = (NULL, NULL, NULL)
_DATA_ERRORS = (TypeError, ValueError, IndexError, KeyError, OverflowError, AttributeError)
# One chunk, converted but not yet committed: GPU and CPU columns, (row in chunk, args) of the
# kernels and host ops whose collective args are wanted, and the skipped (ph, cat) counts.
_Staged = tuple[list[tuple[str, array]], list[tuple[str, array]], list[tuple[int, dict]], list[tuple[int, dict]],
                list[tuple[int, dict]], Counter]


def _to_int(value: object) -> int:
    """Kineto ids are ints, but legacy traces write `"25738"` or `"stream 7"`; NULL otherwise."""
    if value.__class__ is int:
        return value if -(1 << 63) < value < (1 << 63) else NULL
    if isinstance(value, str):
        digits = value.rsplit(" ", 1)[-1]
        if digits.lstrip("-").isdigit():
            return _to_int(int(digits))
        return NULL
    if isinstance(value, float) and value.is_integer():
        return _to_int(int(value))
    return NULL


def _to_float(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return NAN


def _arg_value(col: str, value: object) -> object:
    if value is None:
        return None
    if col in _INT_ARGS:
        v = _to_int(value)
        return None if v == NULL else v
    return value if isinstance(value, str) else str(value)


def us_to_ns(col: str) -> pl.Expr:
    """µs (int, or float with ns decimals) -> integer ns without float drift: the integer part is
    scaled exactly and only the fraction goes through a rounded multiplication."""
    whole = pl.col(col).floor()
    return whole.cast(pl.Int64) * 1000 + ((pl.col(col) - whole) * 1000).round().cast(pl.Int64)


class Extractor:
    """Feeds on chunks of event dicts; between chunks it holds only typed arrays."""

    _G = ("kind", "name", "device", "stream", "ts", "dur", "correlation", "external_id",
          "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "blocks_per_sm", "graph_id", "graph_node_id")
    _C = ("category", "name", "pid", "tid", "ts", "dur", "correlation", "external_id")
    _FLOAT = {"ts", "dur", "blocks_per_sm"}

    def __init__(self) -> None:
        self.g = {c: array("b" if c == "kind" else "d" if c in self._FLOAT else "q") for c in self._G}
        self.c = {c: array("b" if c == "category" else "d" if c in self._FLOAT else "q") for c in self._C}
        self.names: dict[str, int] = {}
        self.comm_name_ids: set[int] = set()
        self.gpu_comm_args: list[tuple] = []  # (row, *GPU_ARG_KEYS values) for kernels carrying them
        self.comm_ops: list[tuple] = []  # (cpu row, *COMM_ARG_KEYS values)
        # GEMM / attention ops (forensics.base.flops.SHAPED_OPS): (cpu row, Input Dims JSON, Input type JSON)
        self.shape_name_ids: set[int] = set()
        self.shape_ops: list[tuple] = []
        # the distinct ``Process Group Ranks`` texts: the args frames carry a code into this table
        self.rank_texts: dict[str, int] = {}
        self.skipped: Counter[tuple] = Counter()
        self.malformed = 0
        # bound appends of every column, in _G / _C order, for the per-event path
        self._gapp = tuple(self.g[x].append for x in self._G)
        self._capp = tuple(self.c[x].append for x in self._C)
        # One extractor may take several files (a batch of small traces): (file index, GPU rows,
        # host rows) of each file taken, in order; the frames carry the index in ``_f``.
        self.files: list[tuple[int, int, int]] = []
        self._mark = (0, 0, 0, 0, 0)
        self.dropped: Counter[int] = Counter()  # per file: events dropped when the frames are built
        self.past_int32: dict[int, Counter[str]] = {}  # per file: values read as null by ``_int32_or_null``

    def begin_file(self) -> None:
        """Start a file: its skipped and malformed counts start from zero."""
        self._mark = (len(self.g["ts"]), len(self.c["ts"]), len(self.gpu_comm_args), len(self.comm_ops),
                      len(self.shape_ops))
        self.skipped = Counter()
        self.malformed = 0

    def end_file(self, index: int) -> None:
        g0, c0, _, _, _ = self._mark
        self.files.append((index, len(self.g["ts"]) - g0, len(self.c["ts"]) - c0))

    def drop_file(self) -> None:
        """Forget every row of the file begun last (it failed): the batch goes on without it."""
        g0, c0, ga, co, so = self._mark
        for arr in self.g.values():
            del arr[g0:]
        for arr in self.c.values():
            del arr[c0:]
        del self.gpu_comm_args[ga:]
        del self.comm_ops[co:]
        del self.shape_ops[so:]

    def _count_dropped(self, df: pl.DataFrame, gpu: bool) -> None:
        """Per file, the events ``_typed_frame`` dropped for a time out of range (malformed)."""
        kept = dict(df.group_by("_f").len().iter_rows())
        for index, g_rows, c_rows in self.files:
            self.dropped[index] += (g_rows if gpu else c_rows) - kept.get(index, 0)

    def _int32_or_null(self, df: pl.DataFrame, cols: tuple[str, ...]) -> pl.DataFrame:
        """``cols`` (Int32 in the frames) with every value past Int32 read as null, counted per file and column in
        ``past_int32`` (a kernel ``grid`` of 2^32: damage, which a cast would turn into a crash). One min / max
        pass when every value fits, the usual case."""
        ok = [pl.col(c).is_between(INT32_MIN, INT32_MAX) for c in cols]
        low, high = df.select(pl.min_horizontal(pl.col(cols).min()).alias("lo"),
                              pl.max_horizontal(pl.col(cols).max()).alias("hi")).row(0)
        if (low is None or low >= INT32_MIN) and (high is None or high <= INT32_MAX):
            return df
        per_file = df.group_by("_f").agg(*[(~fits).sum().alias(c) for c, fits in zip(cols, ok)])
        for index, *counts in per_file.iter_rows():
            for col, n in zip(cols, counts):
                if n:
                    self.past_int32.setdefault(index, Counter())[col] += n
        return df.with_columns(*[pl.when(fits).then(pl.col(c)).alias(c) for c, fits in zip(cols, ok)])

    def _file_index(self, gpu: bool) -> array:
        if not self.files:  # fed without begin_file / end_file: one file
            return array("q", [0]) * len((self.g if gpu else self.c)["ts"])
        out = array("q")
        for index, g_rows, c_rows in self.files:
            out.extend(array("q", [index]) * (g_rows if gpu else c_rows))
        return out

    def _intern(self, name: object) -> int:
        key = name if isinstance(name, str) else str(name)
        code = self.names.get(key)
        if code is None:
            code = self.names[key] = len(self.names)
            if key.startswith(COMM_OP_PREFIXES):
                self.comm_name_ids.add(code)
            elif key in SHAPED_OPS or key.startswith(TRITON_TEMPLATE_PREFIX):
                self.shape_name_ids.add(code)
        return code

    def feed(self, events: list) -> None:
        """Take one chunk: one tuple per event, columns by transposition, else event by event.

        The fast path builds one tuple per event (one list append instead of 8-15 array appends)
        and turns the chunk into typed arrays with ``zip(*rows)``; nothing is committed until the
        whole chunk has converted. Any odd value (string id, null ts, short grid, non-object
        event, an int past 64 bits) raises, and the chunk then goes through ``_feed_rows``, which
        coerces or counts event by event, so results do not depend on which path ran.
        """
        try:
            staged = self._stage(events)
        except _DATA_ERRORS:
            self._feed_rows(events)
            return
        gcols, ccols, gargs, cops, sops, skipped = staged
        self._commit(gcols, ccols, [(i, *[_arg_value(col, a.get(key)) for key, col in GPU_ARG_KEYS]) for i, a in gargs],
                     [(i, *[_arg_value(col, a.get(key)) for key, col in COMM_ARG_KEYS]) for i, a in cops],
                     [_shape_row(i, a) for i, a in sops], skipped)

    def _commit(self, gcols: list[tuple[str, array]], ccols: list[tuple[str, array]], gargs: list[tuple],
                cops: list[tuple], sops: list[tuple], skipped: Counter) -> None:
        """Append one staged chunk: its columns, and its args rows (numbered from the chunk's first row)."""
        g0, c0 = len(self.g["ts"]), len(self.c["ts"])
        for col, arr in gcols:
            self.g[col].extend(arr)
        for col, arr in ccols:
            self.c[col].extend(arr)
        self.gpu_comm_args.extend((g0 + row[0], *row[1:]) for row in gargs)
        self.comm_ops.extend((c0 + row[0], *row[1:]) for row in cops)
        self.shape_ops.extend((c0 + row[0], *row[1:]) for row in sops)
        self.skipped.update(skipped)

    def feed_typed(self, events: list[Event]) -> None:
        """Take one chunk of typed events (``kineto_typed``): the same columns and rows as ``feed`` would take
        from the same events as dicts. Raises TypedRejected for a value ``feed`` would read another way (the
        file is then read again by the stream reader); nothing of the chunk is committed then."""
        try:
            staged = self._stage_typed(events)
        except (OverflowError, TypeError) as exc:  # an integer past 64 bits: the stream reader's slow path
            raise TypedRejected(f"typed decoding: {exc}") from None
        self._commit(*staged)

    def feed_text(self, text: bytearray, first: bool, final: bool) -> tuple[int, bool, int]:
        """Take the events of ``text`` (the inside of the event array) through the compiled reader: the same
        columns and rows as ``feed_typed`` would take. (bytes used, array closed, events read); TypedRejected
        for what it refuses (the typed reader then reads the file)."""
        got = kineto_columns.read(text, 0, first, final, self.names, self._intern, self.comm_name_ids,
                                  self.shape_name_ids, len(self.g["ts"]), len(self.c["ts"]))
        if isinstance(got, str):
            raise TypedRejected(got)
        used, done, events, skipped, gbytes, cbytes, gargs, cops, sops = got
        shapes = [_raw_shape_row(*row) for row in sops]
        if gbytes[0]:
            for (col, _), data in zip(self._GROW, gbytes):
                self.g[col].frombytes(data)
        if cbytes[0]:
            for (col, _), data in zip(self._CROW, cbytes):
                self.c[col].frombytes(data)
        self.gpu_comm_args += gargs
        self.comm_ops += cops
        self.shape_ops += shapes
        self.skipped[(None, None)] += skipped  # only their number is read
        return used, done, events

    # Column order of the fast path's per-event tuples, with each column's array typecode.
    _GROW = (("kind", "b"), ("name", "q"), ("ts", "d"), ("dur", "d"), ("device", "q"), ("stream", "q"),
             ("correlation", "q"), ("external_id", "q"), ("grid_x", "q"), ("grid_y", "q"), ("grid_z", "q"),
             ("block_x", "q"), ("block_y", "q"), ("block_z", "q"), ("blocks_per_sm", "d"), ("graph_id", "q"),
             ("graph_node_id", "q"))
    _CROW = (("category", "b"), ("name", "q"), ("ts", "d"), ("dur", "d"), ("pid", "q"), ("tid", "q"),
             ("correlation", "q"), ("external_id", "q"))

    def _stage(self, events: list) -> _Staged:
        """A chunk as typed column arrays plus its comm args and skipped keys; raises on odd values.

        Names met here are interned at once: that is the only state touched before the commit, and
        an unused entry in the name table changes no output.
        """
        gpu_cats, cpu_cats, names, intern = GPU_CATS, CPU_CATS, self.names, self._intern
        comm_ids, shape_ids = self.comm_name_ids, self.shape_name_ids
        grows: list[tuple] = []
        crows: list[tuple] = []
        gargs: list[tuple[int, dict]] = []
        cops: list[tuple[int, dict]] = []
        sops: list[tuple[int, dict]] = []
        skipped: list[tuple] = []
        gadd, cadd = grows.append, crows.append
        for e in events:
            cat = e.get("cat")
            code = gpu_cats.get(cat)
            if code is not None:
                a = e.get("args") or _EMPTY
                nm = e["name"]
                nid = names.get(nm)
                if nid is None:
                    nid = intern(nm)
                dev = a.get("device")
                st = a.get("stream")
                ext = a.get("External id")
                grid = a.get("grid") or _NO3
                block = a.get("block") or _NO3
                gadd((code, nid, e["ts"], e.get("dur", NAN),
                      dev if dev is not None else e.get("pid", NULL),
                      st if st is not None else e.get("tid", NULL),
                      a.get("correlation", NULL), ext if ext is not None else a.get("external id", NULL),
                      grid[0], grid[1], grid[2], block[0], block[1], block[2], a.get("blocks per SM", NAN),
                      a.get("graph id", NULL), a.get("graph node id", NULL)))
                if "Collective name" in a or "In msg nelems" in a:
                    gargs.append((len(grows) - 1, a))
                continue
            code = cpu_cats.get(cat)
            if code is None:
                skipped.append((e.get("ph"), cat))
                continue
            a = e.get("args") or _EMPTY
            nm = e["name"]
            nid = names.get(nm)
            if nid is None:
                nid = intern(nm)
            pid = e.get("pid", NULL)
            tid = e.get("tid", NULL)
            ext = a.get("External id")
            cadd((code, nid, e["ts"], e.get("dur", NAN),
                  pid if pid.__class__ is int else _to_int(pid), tid if tid.__class__ is int else _to_int(tid),
                  a.get("correlation", NULL), ext if ext is not None else a.get("external id", NULL)))
            if nid in comm_ids and code in _COMM_OP_CATS:
                cops.append((len(crows) - 1, a))
            elif nid in shape_ids and "Input Dims" in a:
                sops.append((len(crows) - 1, a))
        # array() raises on a value of the wrong type (a float id, a string ts, a 65-bit int).
        gcols = [(col, array(tc, vals)) for (col, tc), vals in zip(self._GROW, zip(*grows))] if grows else []
        ccols = [(col, array(tc, vals)) for (col, tc), vals in zip(self._CROW, zip(*crows))] if crows else []
        return gcols, ccols, gargs, cops, sops, Counter(skipped)  # Counter(): an unhashable ph raises here

    def _stage_typed(self, events: list[Event]) -> tuple:
        """``_stage`` for typed events, column by column (one comprehension per column instead of a Python
        statement per event); the args rows come converted. Raises TypedRejected where the stream reader's
        reading could differ (see ``kineto_typed``), OverflowError for an integer past 64 bits, TypeError for a
        missing ``ts``."""
        gpu_cats, cpu_cats = GPU_CATS, CPU_CATS
        gpu = [e for e in events if e.cat in gpu_cats]
        cpu = [e for e in events if e.cat in cpu_cats]
        gcols, gargs = self._typed_gpu_columns(gpu) if gpu else ([], [])
        ccols, cops, sops = self._typed_cpu_columns(cpu) if cpu else ([], [], [])
        return gcols, ccols, gargs, cops, sops, Counter({None: len(events) - len(gpu) - len(cpu)})

    def _typed_common(self, events: list[Event]) -> dict[str, Any]:
        """The columns GPU and host rows share, and ``_args`` (each event's args)."""
        names = [e.name for e in events]
        if None in names or CUT_PH.intersection([e.ph for e in events]):
            raise TypedRejected("an event the stream reader reads another way (no name, or a flow or instant "
                                "event of a tabulated category)")
        table = self.names
        for name in set(names).difference(table):
            self._intern(name)
        args = [e.args or EMPTY_ARGS for e in events]
        ext = [a.external_id for a in args]
        if None in ext:
            ext = [a.external_id if a.external_id is not None else a.external_id_legacy for a in args]
        return {
            "_args": args,
            "name": [table[n] for n in names],
            "ts": [e.ts for e in events],
            "dur": [e.dur for e in events],
            "correlation": [a.correlation for a in args],
            "external_id": ext,
        }

    def _typed_gpu_columns(self, events: list[Event]) -> tuple[list[tuple[str, array]], list[tuple]]:
        """GPU columns in ``_GROW`` order, and the collective args rows of the kernels carrying them."""
        cols = self._typed_common(events)
        args = cols.pop("_args")
        cols["kind"] = [GPU_CATS[e.cat] for e in events]
        cols["device"] = _ids_or(args, "device", events, "pid")
        cols["stream"] = _ids_or(args, "stream", events, "tid")
        for axis, dims in (("grid", [a.grid or _NO3 for a in args]), ("block", [a.block or _NO3 for a in args])):
            if any(len(d) < 3 for d in dims):  # the stream reader's slow path: NULL for a missing axis
                dims = [(*d, *_NO3) for d in dims]
            for i, x in enumerate("xyz"):
                cols[f"{axis}_{x}"] = [d[i] for d in dims]
        cols["blocks_per_sm"] = [a.blocks_per_sm for a in args]
        cols["graph_id"] = [a.graph_id for a in args]
        cols["graph_node_id"] = [a.graph_node_id for a in args]
        gargs = [(i, *map(_typed_arg, _GPU_COLS, _gpu_values(a))) for i, a in enumerate(args)
                 if a.coll_raw is not UNSET or a.in_nelems is not UNSET]
        return [(col, _array(tc, cols[col])) for col, tc in self._GROW], gargs

    def _typed_cpu_columns(self, events: list[Event]) -> tuple[list[tuple[str, array]], list[tuple], list[tuple]]:
        """Host columns in ``_CROW`` order, the collective args rows and the shape rows."""
        cols = self._typed_common(events)
        args = cols.pop("_args")
        cols["category"] = cats = [CPU_CATS[e.cat] for e in events]
        cols["pid"] = _ids([e.pid for e in events])
        cols["tid"] = _ids([e.tid for e in events])
        cops: list[tuple] = []
        sops: list[tuple] = []
        comm_ids, shape_ids = self.comm_name_ids, self.shape_name_ids
        nids = cols["name"]
        wanted = comm_ids | shape_ids
        if not wanted.isdisjoint(nids):  # the rows of those names only, found by C loops
            for i in compress(range(len(nids)), map(wanted.__contains__, nids)):
                nid, code, a = nids[i], cats[i], args[i]
                if nid in comm_ids and code in _COMM_OP_CATS:
                    cops.append((i, *map(_typed_arg, _COMM_COLS, _comm_values(a))))
                elif nid in shape_ids and a.input_dims is not UNSET:
                    sops.append(_typed_shape_row(i, a))
        return [(col, _array(tc, cols[col])) for col, tc in self._CROW], cops, sops

    def _feed_rows(self, events: list) -> None:
        """The per-event loop: a value the fast appends reject sends that event to the slow paths."""
        gpu_cats, cpu_cats = GPU_CATS, CPU_CATS
        for e in events:
            try:
                cat = e.get("cat")
                code = gpu_cats.get(cat)
            except (AttributeError, TypeError):  # not an object, or an unhashable category
                self.malformed += 1
                continue
            if code is not None:
                self._row_gpu(e, code)
                continue
            code = cpu_cats.get(cat)
            if code is not None:
                self._row_cpu(e, code)
                continue
            try:
                self.skipped[(e.get("ph"), cat)] += 1
            except TypeError:  # an unhashable ph
                self.malformed += 1

    def _name_id(self, name: object) -> int:
        nid = self.names.get(name)  # type: ignore[call-overload]
        return nid if nid is not None else self._intern(name)

    def _row_gpu(self, e: dict, code: int) -> None:
        g = self.g
        n = len(g["ts"])
        gk, gn, gdev, gst, gts, gdur, gcorr, gext, ggx, ggy, ggz, gbx, gby, gbz, gbps, ggid, ggnode = self._gapp
        try:
            a = e.get("args") or _EMPTY
            nid = self._name_id(e["name"])
            gts(e["ts"])
            gdur(e.get("dur", NAN))
            gk(code)
            gn(nid)
            v = a.get("device")
            gdev(v if v is not None else e.get("pid", NULL))
            v = a.get("stream")
            gst(v if v is not None else e.get("tid", NULL))
            gcorr(a.get("correlation", NULL))
            v = a.get("External id")
            gext(v if v is not None else a.get("external id", NULL))
            v = a.get("grid") or _NO3
            ggx(v[0])
            ggy(v[1])
            ggz(v[2])
            v = a.get("block") or _NO3
            gbx(v[0])
            gby(v[1])
            gbz(v[2])
            gbps(a.get("blocks per SM", NAN))
            ggid(a.get("graph id", NULL))
            ggnode(a.get("graph node id", NULL))
        except _DATA_ERRORS:
            for arr in g.values():
                del arr[n:]
            self._slow_gpu(e, code)
            return
        if "Collective name" in a or "In msg nelems" in a:
            self.gpu_comm_args.append((n, *[_arg_value(col, a.get(key)) for key, col in GPU_ARG_KEYS]))

    def _row_cpu(self, e: dict, code: int) -> None:
        c = self.c
        n = len(c["ts"])
        ck, cn, cpid, ctid, cts, cdur, ccorr, cext = self._capp
        try:
            a = e.get("args") or _EMPTY
            nid = self._name_id(e["name"])
            cts(e["ts"])
            cdur(e.get("dur", NAN))
            ck(code)
            cn(nid)
            v = e.get("pid", NULL)
            cpid(v if v.__class__ is int else _to_int(v))
            v = e.get("tid", NULL)
            ctid(v if v.__class__ is int else _to_int(v))
            ccorr(a.get("correlation", NULL))
            v = a.get("External id")
            cext(v if v is not None else a.get("external id", NULL))
        except _DATA_ERRORS:
            for arr in c.values():
                del arr[n:]
            if not self._slow_cpu(e, code):
                return
            a = e.get("args")
            a = a if isinstance(a, dict) else _EMPTY
            nid = self._intern(e["name"])
        if nid in self.comm_name_ids and code in _COMM_OP_CATS:
            self.comm_ops.append((n, *[_arg_value(col, a.get(key)) for key, col in COMM_ARG_KEYS]))
        elif nid in self.shape_name_ids and "Input Dims" in a:
            self.shape_ops.append(_shape_row(n, a))

    # Slow paths: an event with an unusual value (string ids, nulls, short grid lists, a missing
    # ts). Values are coerced one by one; an event without a name or a numeric ts is malformed.
    def _slow_gpu(self, e: dict, code: int) -> None:
        a = e.get("args")
        a = a if isinstance(a, dict) else _EMPTY
        ts = _to_float(e.get("ts"))
        if "name" not in e or math.isnan(ts):
            self.malformed += 1
            return
        g = self.g
        n = len(g["ts"])
        dev = a.get("device")
        st = a.get("stream")
        ext = a.get("External id")
        grid_v, block_v = a.get("grid"), a.get("block")
        grid = grid_v if isinstance(grid_v, list) else []
        block = block_v if isinstance(block_v, list) else []
        values: dict[str, Any] = {
            "kind": code, "name": self._intern(e["name"]), "ts": ts, "dur": _to_float(e.get("dur")),
            "device": _to_int(dev if dev is not None else e.get("pid")),
            "stream": _to_int(st if st is not None else e.get("tid")),
            "correlation": _to_int(a.get("correlation")),
            "external_id": _to_int(ext if ext is not None else a.get("external id")),
            "blocks_per_sm": _to_float(a.get("blocks per SM")),
            "graph_id": _to_int(a.get("graph id")), "graph_node_id": _to_int(a.get("graph node id")),
        }
        for i, axis in enumerate("xyz"):
            values[f"grid_{axis}"] = _to_int(grid[i]) if i < len(grid) else NULL
            values[f"block_{axis}"] = _to_int(block[i]) if i < len(block) else NULL
        for col, arr in g.items():
            arr.append(values[col])
        if "Collective name" in a or "In msg nelems" in a:
            self.gpu_comm_args.append((n, *[_arg_value(col, a.get(key)) for key, col in GPU_ARG_KEYS]))

    def _slow_cpu(self, e: dict, code: int) -> bool:
        a = e.get("args")
        a = a if isinstance(a, dict) else _EMPTY
        ts = _to_float(e.get("ts"))
        if "name" not in e or math.isnan(ts):
            self.malformed += 1
            return False
        ext = a.get("External id")
        values: dict[str, Any] = {
            "category": code, "name": self._intern(e["name"]), "ts": ts, "dur": _to_float(e.get("dur")),
            "pid": _to_int(e.get("pid")), "tid": _to_int(e.get("tid")),
            "correlation": _to_int(a.get("correlation")),
            "external_id": _to_int(ext if ext is not None else a.get("external id")),
        }
        for col, arr in self.c.items():
            arr.append(values[col])
        return True

    # --- frames -----------------------------------------------------------------------------

    def name_table(self) -> pl.Series:
        return pl.Series("name", list(self.names), dtype=pl.String)

    def gpu_frame(self) -> pl.DataFrame | None:
        if not len(self.g["ts"]):
            return None
        self.g["_f"] = self._file_index(gpu=True)
        df, bad = _typed_frame(self.g, self.name_table())  # consumes the buffers
        if bad:
            self._count_dropped(df, gpu=True)
        df = self._int32_or_null(df, (*_DIMS, "device")).with_columns(
            pl.col("kind").replace_strict(dict(enumerate(GPU_KINDS)), return_dtype=pl.String),
            pl.col(_DIMS).cast(pl.Int32),
        )
        args = _args_frame(self.gpu_comm_args, GPU_ARG_KEYS, self.rank_texts)
        if args is None:
            return df.with_columns(
                [pl.lit(None, dtype=_ARG_TYPES.get(col, pl.String)).alias(col) for _, col in GPU_ARG_KEYS]
            ).drop("_row")
        df = df.join(args, on="_row", how="left", maintain_order="left")
        return self._int32_or_null(df, ("group_size",)).drop("_row")

    def cpu_frame(self) -> pl.DataFrame | None:
        """Host ops, with ``_row`` (their position in the buffers) kept for ``comm_frame``."""
        if not len(self.c["ts"]):
            return None
        self.c["_f"] = self._file_index(gpu=False)
        df, bad = _typed_frame(self.c, self.name_table())  # consumes the buffers
        if bad:
            self._count_dropped(df, gpu=False)
        return df.with_columns(
            pl.col("category").replace_strict(dict(enumerate(CPU_CATEGORIES)), return_dtype=pl.String)
        )

    def comm_frame(self, cpu: pl.DataFrame | None) -> pl.DataFrame | None:
        """The host ops that may be collective calls, with their collective args."""
        if cpu is None or not self.comm_ops:
            return None
        args = _args_frame(self.comm_ops, COMM_ARG_KEYS, self.rank_texts)
        assert args is not None
        rows = self._int32_or_null(cpu.join(args, on="_row", how="inner"), ("group_size", "src_rank", "dst_rank"))
        return rows.select("_f", "pid", "tid", "name", "start_ns", "end_ns", "external_id",
                           *[col for _, col in COMM_ARG_KEYS])


    def rank_list_texts(self) -> list[str]:
        """The ``Process Group Ranks`` texts, in the order of the codes the frames' ``pg_ranks_raw`` carry."""
        return list(self.rank_texts)

    def shape_frame(self, cpu: pl.DataFrame | None) -> pl.DataFrame | None:
        """The GEMM and attention ops whose input shapes the trace recorded (``record_shapes=True``)."""
        if cpu is None or not self.shape_ops:
            return None
        args = pl.DataFrame(self.shape_ops, schema={"_row": pl.UInt32, "input_dims": pl.String,
                                                    "input_types": pl.String}, orient="row")
        rows = cpu.join(args, on="_row", how="inner")
        return rows.select("_f", "tid", "name", "start_ns", "end_ns", "external_id", "input_dims", "input_types")


def _ids(values: list) -> array:
    """Ids as the stream reader takes them: ints as they are, anything else (a legacy ``"stream 7"``, a missing
    one) through ``_to_int``. OverflowError for an int past 64 bits (the stream reader's slow path)."""
    try:
        return array("q", values)
    except TypeError:
        return array("q", [v if v.__class__ is int else _to_int(v) for v in values])


def _array(typecode: str, values: list | array) -> array:
    return values if isinstance(values, array) else array(typecode, values)


def _ids_or(args: list[Args], key: str, events: list[Event], fallback: str) -> list:
    """An args id (device, stream), or where the args lack it the event's own (pid, tid) as ``_ids`` takes it."""
    values = [getattr(a, key) for a in args]
    if None not in values:
        return values
    return [v if v is not None else _ids([getattr(e, fallback)])[0] for v, e in zip(values, events)]


def _typed_arg(col: str, value: object) -> object:
    """``_arg_value`` of a typed event's collective arg. orjson reads an integer past 64 bits as a float and a
    nested value differently than msgspec: those are left to the stream reader."""
    if value is UNSET:
        return None
    if value.__class__ is int and not -(1 << 63) <= value < (1 << 64):
        raise TypedRejected(f"collective arg {col!r} is an integer past 64 bits")
    if isinstance(value, (list, dict)):
        raise TypedRejected(f"collective arg {col!r} is not a scalar")
    return _arg_value(col, value)


def _typed_shape_row(row: int, a: Args) -> tuple[int, str, str]:
    """``_shape_row`` of a typed event: the raw ``Input Dims`` / ``Input type`` text, read as orjson reads it."""
    return _raw_shape_row(row, bytes(a.input_dims), bytes(a.input_type) if a.input_type is not UNSET else None)


def _raw_shape_row(row: int, dims: bytes, types: bytes | None) -> tuple[int, str, str]:
    """``_shape_row`` of raw ``Input Dims`` / ``Input type`` text (None: absent)."""
    loaded = orjson.loads(types) if types is not None else None
    return (row, orjson.dumps(orjson.loads(dims)).decode(), orjson.dumps(loaded).decode())


def _shape_row(row: int, a: dict) -> tuple[int, str, str]:
    """Shapes as JSON text: one string column, whatever the nesting the profiler wrote."""
    return (row, orjson.dumps(a.get("Input Dims")).decode(), orjson.dumps(a.get("Input type")).decode())


# Times (µs) beyond this are rejected per event: start + duration in ns must fit an Int64 (year 2096).
TIME_LIMIT_US = 4e15
SMALL_ROWS = 50_000


def _typed_frame(cols: dict[str, array], names: pl.Series) -> tuple[pl.DataFrame, int]:
    """The columns as a frame with integer-ns ``start_ns`` / ``end_ns`` and the buffer position in
    ``_row``; events whose ts or dur is not a finite number within ``TIME_LIMIT_US`` are dropped
    and counted (second value)."""
    ints = [c for c, arr in cols.items() if arr.typecode == "q" and c != "name"]
    floats = [c for c, arr in cols.items() if arr.typecode == "d" and c != "ts"]
    # Small frames: one pass for every column (each Polars call has a fixed cost that dominates
    # tiny traces). Large ones: column by column, so each buffer is freed as its column exists.
    small = len(cols["ts"]) < SMALL_ROWS
    data = {}
    for col in list(cols):
        arr = cols.pop(col)
        s = pl.Series(col, arr)
        del arr
        if col == "name":
            s = names.gather(s).alias("name")
        elif not small and col in ints:
            s = pl.select(pl.when(s != NULL).then(s)).to_series().alias(col)
        elif not small and col in floats:
            s = s.fill_nan(None)
        data[col] = s
    n = len(data["ts"])
    lazy = pl.DataFrame(data).lazy()
    if small:
        lazy = lazy.with_columns(*[pl.when(pl.col(c) != NULL).then(pl.col(c)).alias(c) for c in ints],
                                 *[pl.col(c).fill_nan(None) for c in floats])
    in_range = pl.col("ts").is_finite() & (pl.col("ts").abs() < TIME_LIMIT_US) & (
        pl.col("dur").is_null() | (pl.col("dur").is_finite() & (pl.col("dur").abs() < TIME_LIMIT_US))
    )
    start = us_to_ns("ts")
    dur = us_to_ns("dur").fill_null(0)
    df = (
        lazy.with_row_index("_row").filter(in_range)
        .with_columns(start.alias("start_ns"), (start + dur).alias("end_ns")).drop("ts", "dur")
        .collect()
    )
    return df, n - df.height


def _args_frame(rows: list[tuple], keys: tuple[tuple[str, str], ...], texts: dict[str, int]) -> pl.DataFrame | None:
    """The args rows as a frame; ``pg_ranks_raw`` as a code into ``texts`` (the distinct texts, added to as met).
    A rank list is as long as its group: thousands of numbers on every collective of a big job, which the frame
    would copy row by row and every later join, group and unique would hash again."""
    if not rows:
        return None
    at = 1 + [col for _, col in keys].index("pg_ranks_raw")
    code = texts.setdefault
    rows = [row if row[at] is None else (*row[:at], code(row[at], len(texts)), *row[at + 1:]) for row in rows]
    schema: dict[str, type[pl.DataType]] = {"_row": pl.UInt32}
    schema.update((col, _ARG_TYPES.get(col, pl.String)) for _, col in keys)
    return pl.DataFrame(rows, schema=schema, orient="row")
