"""PyTorch NCCL Flight Recorder dumps -> ``fr_dumps``, ``fr_entries``, ``fr_pg_status``.

One file per rank, found by content under any name: ``nccl_trace_rank_<N>`` (TORCH_NCCL_DEBUG_INFO_TEMP_FILE),
``comm_lib_trace_rank_<N>`` (TORCH_FR_DUMP_TEMP_FILE), nvidia-resiliency-ext's ``_dump_<N>[.json]``, torchcomms'
``torchcomm_fr_trace_<N>``, the debug server's ``rank_<N>``. Two encodings: the torch C++ pickler (protocol 2; read
by :mod:`forensics.parsers.fr_pickle`, which never executes anything) and JSON (``dump_json``: strings for the
``pg_status`` counters and ``pg_config`` ranks, 0 for unseen times, ``process_group`` a list, no ``entries`` key when
there are none). Format versions 1.x to 2.10: ``seq_id`` before ``collective_seq_id``; ``pg_config`` from 1.2,
``pg_status`` from 2.x (derived from the entries when absent), ``nccl_version`` 2.6-2.9 and ``comm_lib_version``
from 2.10, ``thread_name`` from 2.9, ``frames`` only with stack traces, ``duration_ms`` only with timing on.

Every field's type is checked (Polars builds each column strictly); a dump failing any check is a ``failed``
source whose message names the field. The rank comes from the file name's trailing digits and is checked against
the content (the one rank every group in ``pg_config`` contains); a host from the file name when it carries one
(``nccl_trace_rank_<host>_<N>``).
"""

from __future__ import annotations

import gc
import hashlib
import marshal
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from forensics.parsers import fr_pickle
from forensics.parsers.bounded_read import GZIP_MAGIC, open_bounded
from forensics.parsers.result import ParseContext, ParseResult, parse_alone

from forensics.base import frames as fr
from forensics.base.hosts import short_host

try:  # the compiled reader (parsers/fr_columns.c): optional, the Python reader below does everything without it
    from forensics.parsers import fr_columns
except ImportError:  # built without a C compiler or Python's headers
    fr_columns = None
if os.environ.get("FORENSICS_FR_READER") == "python":  # the Python reader alone (benchmarks, comparisons)
    fr_columns = None

_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d{1,7})(?:\.(?:json|pkl|pickle|bin|txt|gz))*$", re.IGNORECASE)
_KNOWN_PREFIXES = ("nccl_trace_rank_", "comm_lib_trace_rank_", "hccl_trace_rank_", "torchcomm_fr_trace_",
                   "torchcomms_fr_trace_", "fr_trace_rank_", "_dump_", "rank_", "rank")
_DIGITS = re.compile(r"-?\d+")
_MAX_RANKS_TEXT = 1 << 22


class BadDump(ValueError):
    """A field of the dump has the wrong type or shape; the message names it."""


# The entry keys read, with their Arrow types: Arrow's converter builds every column in one C++ pass over the
# dicts and refuses a value of another type (no coercion); Polars builds nested lists element by element in Python.
_I64, _STR = pa.int64(), pa.string()
_ENTRY_SCHEMA = pa.schema([
    ("record_id", _I64), ("pg_id", _I64), ("process_group", pa.list_(_STR)), ("collective_seq_id", _I64),
    ("seq_id", _I64), ("p2p_seq_id", _I64), ("op_id", _I64), ("profiling_name", _STR), ("time_created_ns", _I64),
    ("duration_ms", pa.float64()), ("input_sizes", pa.list_(pa.list_(_I64))), ("input_dtypes", pa.list_(_STR)),
    ("output_sizes", pa.list_(pa.list_(_I64))), ("output_dtypes", pa.list_(_STR)), ("state", _STR),
    ("time_discovered_started_ns", _I64), ("time_discovered_completed_ns", _I64), ("retired", pa.bool_()),
    ("timeout_ms", _I64), ("is_p2p", pa.bool_()), ("thread_name", _STR), ("thread_id", _STR),
    ("frames", pa.list_(pa.struct([("name", _STR), ("filename", _STR), ("line", _I64)]))),
])
_RENAME = {"p2p_seq_id": "p2p_seq", "profiling_name": "op", "time_created_ns": "created_ns",
           "time_discovered_started_ns": "started_ns", "time_discovered_completed_ns": "completed_ns",
           "input_sizes": "in_sizes", "output_sizes": "out_sizes", "input_dtypes": "in_dtypes",
           "output_dtypes": "out_dtypes"}


def parse(path: Path, ctx: ParseContext) -> ParseResult:
    """One dump: a batch of one."""
    return parse_alone(FlightRecorderBatch(), path, ctx)


@dataclass
class _Dump:
    """One dump taken into a batch: its rows of ``fr_dumps`` and ``fr_pg_status``, its entries as Arrow columns
    and each entry's row in the batch's shapes."""

    tag: dict[str, Any]  # rank, host, source
    entries: _Entries | None
    status: list[tuple[Any, ...]]
    row: dict[str, Any]
    message: str
    shape_rows: pa.Array | None = None


class FlightRecorderBatch:
    """Several dumps parsed as one: each is read, checked and turned into Arrow columns on its own (``add``; a bad
    dump fails alone), the frames of all are built at once (``finish``): Polars' fixed costs are paid once a batch.
    The entries' shapes (group, operation, sizes, dtypes, stack) are converted once per distinct value a batch."""

    def __init__(self) -> None:
        self.dumps: list[_Dump] = []
        self.shape_of: dict[bytes, int] = {}  # shape key -> row of ``shapes``
        self.shapes: list[tuple[Any, ...]] = []

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None:
        try:
            data = _read_file(path, min(ctx.max_decompressed_bytes, fr_pickle.MAX_DUMP_BYTES + 1))
        except (OSError, EOFError, zlib.error) as exc:
            return ParseResult.failed(f"{ctx.rel_path}: unreadable: {exc}")
        try:
            with _no_cyclic_gc():
                dump = _read_compiled(data, ctx.rel_path, self.shape_of)
                if not isinstance(dump, _Dump):
                    dump = _read_python(data, ctx.rel_path, self.shape_of, dump)
                del data
        except fr_pickle.UnsafeDump as exc:
            return ParseResult.failed(f"{ctx.rel_path}: Flight Recorder pickle refused, not loaded: {exc}")
        except BadDump as exc:
            return ParseResult.failed(f"{ctx.rel_path}: not a valid Flight Recorder dump: {exc}")
        self._take(dump)
        return None

    def _take(self, dump: _Dump) -> None:
        """The dump's new shapes join the batch's; each entry gets its shape's row."""
        e = dump.entries
        if e is not None:
            for key, shape in e.shapes.items():
                self.shape_of[key] = len(self.shapes)
                self.shapes.append(shape)
            rows = [self.shape_of[k] for k in e.keys]
            dump.shape_rows = pa.array(rows, type=pa.uint32()).take(e.rows)
            dump.row["has_stacks"] = any(self.shapes[r][_SHAPE.index("frames")] is not None for r in rows)
            e.keys, e.shapes = [], {}
        self.dumps.append(dump)

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]:
        shapes = _shapes_frame(self.shapes) if self.shapes else None
        frames = {"fr_entries": _entries_frame(self.dumps, shapes) if shapes is not None else fr.empty("fr_entries"),
                  "fr_signatures": fr.conform("fr_signatures", shapes.select(fr.schema("fr_signatures").names())
                                              .unique("sig", keep="first", maintain_order=True))
                  if shapes is not None else fr.empty("fr_signatures"),
                  "fr_pg_status": _status_frame(self.dumps),
                  "fr_dumps": fr.conform("fr_dumps", pl.DataFrame([d.row for d in self.dumps],
                                                                  schema=fr.schema("fr_dumps")))}
        results = [ParseResult(message=d.message, rank=d.tag["rank"], host=d.tag["host"]) for d in self.dumps]
        return results, frames


def _read_file(path: Path, limit: int) -> bytes:
    """The dump's bytes, at most one past the cap. A plain file within ``limit`` is read in one call (the bounded
    reader's 64 MiB read buffer cost ~0.5 ms a dump); a gzipped or bigger one through the bounded reader."""
    with open(path, "rb", buffering=0) as fh:
        if fh.read(2) != GZIP_MAGIC and os.fstat(fh.fileno()).st_size < limit:
            fh.seek(0)
            return fh.readall()
    with open_bounded(path, limit) as bounded:
        return bounded.read(fr_pickle.MAX_DUMP_BYTES + 1)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector paused: a dump is a tree of tens of thousands of acyclic containers, which it would
    traverse every 700 allocations (and once more when re-enabled with them alive)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _read_compiled(data: bytes, source: str, known: Mapping[bytes, Any]) -> _Dump | str | None:
    """The dump read by the compiled reader; why it left the dump to the Python reader (None: not built, or not
    a pickle). Anything it refuses, or that the checks below find unusual, is read again by the Python reader:
    only that one words refusals, so a refused dump gets exactly the same message either way."""
    if fr_columns is None or data[:1] != b"\x80":
        return None
    got = fr_columns.read(data, _COMPILED_FLAT, _SHAPE, known)
    if isinstance(got, str):
        return got
    doc, columns = got
    try:
        return _read(doc, "pickle", source, known, columns)
    except (_Odd, BadDump, TypeError, ValueError, OverflowError, KeyError, IndexError, pa.ArrowException) as exc:
        return f"{type(exc).__name__}: {str(exc)[:80]}"


def _read_python(data: bytes, source: str, known: Mapping[bytes, Any], why: str | None) -> _Dump:
    """The dump read through Python objects (pickle or JSON); ``why`` the compiled reader left it, if it did."""
    doc, fmt = _decode(data)
    dump = _read(doc, fmt, source, known)
    del doc  # freed while the collector is off: its thousands of containers are never traversed
    if why is not None:
        dump.message += f"; read by the Python reader (the compiled one refused it: {why})"
    return dump


def _decode(data: bytes) -> tuple[Any, str]:
    if len(data) > fr_pickle.MAX_DUMP_BYTES:
        raise fr_pickle.UnsafeDump(f"larger than the {fr_pickle.MAX_DUMP_BYTES}-byte cap")
    if data[:1] == b"\x80":
        return fr_pickle.loads(data), "pickle"
    try:
        return orjson.loads(data), "json"
    except orjson.JSONDecodeError as exc:
        raise BadDump(f"JSON does not decode: {exc}") from None


def _read(doc: Any, fmt: str, source: str, known: Mapping[bytes, Any], columns: Any = None) -> _Dump:
    """One decoded dump; ``columns``: its entries as the compiled reader read them (then ``doc`` has none)."""
    dump = _check_top(doc)
    cfg = _pg_config(dump.get("pg_config"))
    name_rank, host = rank_host_from_name(source)
    content_rank = _content_rank(cfg)
    rank = content_rank if content_rank is not None else name_rank
    note = ""
    if name_rank is not None and content_rank is not None and name_rank != content_rank:
        note = f"; the file name says rank {name_rank}, its process groups say {content_rank}: {content_rank} used"
    if rank is None:
        raise BadDump("no rank: the file name ends in no digits and pg_config names no single rank")
    if columns is None:
        raw = dump.get("entries") or []
        entries, status = _entries(raw, known), _status(dump, cfg, _group_pairs(raw), lambda: raw)
    else:
        entries, groups = _compiled_entries(columns, known)
        status = _status(dump, cfg, _compiled_pairs(entries, groups), lambda: _compiled_raw(entries, groups))
    tag = {"rank": rank, "host": host, "source": source}
    count = entries.n if entries is not None else 0
    message = (f"Flight Recorder {fmt} dump, format {dump.get('version')}: {count} entries, "
               f"{len(status)} process group(s){note}")
    return _Dump(tag, entries, [(*row, rank, host, source) for row in status], _dump_row(dump, entries, fmt, tag),
                 message)


def _check_top(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadDump(f"the top level is a {type(doc).__name__}, not a dict")
    if not isinstance(doc.get("version"), str):
        raise BadDump("no `version` string")
    for key, kind in (("entries", list), ("pg_config", dict), ("pg_status", dict)):
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            raise BadDump(f"`{key}` is a {type(doc[key]).__name__}, not a {kind.__name__}")
    for key in ("nccl_version", "comm_lib_version"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise BadDump(f"`{key}` is not a string")
    return doc


def rank_host_from_name(rel_path: str) -> tuple[int | None, str | None]:
    """(rank, host) the file name says: trailing digits; a host between a known prefix and the rank."""
    m = _NAME.match(rel_path.rsplit("/", 1)[-1])
    if not m:
        return None, None
    prefix = m["prefix"]
    for known in _KNOWN_PREFIXES:
        if prefix.lower().startswith(known) and len(prefix) > len(known):
            rest = prefix[len(known):].rstrip("_-.")
            return int(m["rank"]), short_host(rest) if rest and not rest.isdigit() else None
    return int(m["rank"]), None


def _ranks_of(value: Any, where: str) -> list[int]:
    """``pg_config`` ranks: the string ``"[0, 1, 2]"`` (pickle and JSON) or a list."""
    if isinstance(value, list) and all(type(r) is int for r in value):
        return value
    if isinstance(value, str) and len(value) < _MAX_RANKS_TEXT:
        return list(_ranks_text(value))
    raise BadDump(f"{where}: ranks is neither a list of ints nor its text")


@lru_cache(maxsize=1024)
def _ranks_text(value: str) -> tuple[int, ...]:
    """Every dump of a job lists the same groups: the default group's ranks (4,096 numbers) are read once."""
    return tuple(map(int, _DIGITS.findall(value)))


def _pg_config(cfg: Any) -> dict[str, tuple[str | None, list[int]]]:
    """pg_name -> (desc, ranks)."""
    out: dict[str, tuple[str | None, list[int]]] = {}
    for name, pg in (cfg or {}).items():
        if not isinstance(name, str) or not isinstance(pg, dict):
            raise BadDump("pg_config: an entry is not a dict keyed by name")
        desc = pg.get("desc")
        if desc is not None and not isinstance(desc, str):
            raise BadDump(f"pg_config[{name}].desc is not a string")
        out[name] = (desc, _ranks_of(pg.get("ranks", []), f"pg_config[{name}]"))
    return out


def _content_rank(cfg: dict[str, tuple[str | None, list[int]]]) -> int | None:
    """The one rank every group of ``pg_config`` contains (pg_config lists the groups this rank is in)."""
    groups = [set(ranks) for _, ranks in cfg.values() if ranks]
    common = set.intersection(*groups) if groups else set()
    return next(iter(common)) if len(common) == 1 else None


# --- entries ---------------------------------------------------------------------------------------

# An entry's fields, read in two parts. Flat fields (ints, bools, short text) become one Arrow array each. The
# shape fields (group, operation, sizes, dtypes, stack) are the same on every rank of a collective: each entry's
# shape is keyed by its marshal bytes (exact: type and value), and only one entry per distinct key is converted
# (a batch converts each key once, whatever the number of dumps that hold it).
_FLAT = ("record_id", "pg_id", "collective_seq_id", "seq_id", "p2p_seq_id", "op_id", "time_created_ns",
         "duration_ms", "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "timeout_ms",
         "is_p2p", "thread_name", "thread_id")
_SHAPE = ("process_group", "profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "frames")
_TYPES = {f.name: f.type for f in _ENTRY_SCHEMA}
# what Arrow infers for a column of exactly these Python types (int, str, bool, none): anything else (a float
# where an int belongs, bytes, a mix) is decided by the checked conversion, with its exact refusal
_INFERRED = {pa.int64(): (pa.int64(), pa.null()), pa.string(): (pa.string(), pa.null()),
             pa.bool_(): (pa.bool_(), pa.null())}


class _Odd(Exception):
    """The fast reading met something unusual: the checked conversion decides (and words any refusal)."""


@dataclass
class _Entries:
    """One dump's entries: the flat fields as Arrow arrays, each entry's shape as a row of ``keys`` (its distinct
    shape keys: marshal bytes, or the compiled reader's)."""

    flat: dict[str, pa.Array]
    keys: list[bytes]
    shapes: dict[bytes, tuple[Any, ...]]  # the new keys of this dump (not yet in the batch): one entry's values
    n: int
    rows: pa.Array  # uint32: each entry's row of ``keys``


def _entries(entries: list[Any], known: Mapping[bytes, Any]) -> _Entries | None:
    """The entries as Arrow columns and shape keys, every field's type checked. ``known``: shape keys already
    checked (in the batch)."""
    if not entries:
        return None
    if set(map(type, entries)) != {dict}:
        raise BadDump("entries: an entry is not a dict")
    cols = _columns(entries, _FLAT + _SHAPE)
    try:
        return _read_entries(cols, known, len(entries), typed=False)
    except (_Odd, TypeError, ValueError, OverflowError, pa.ArrowException):
        _checked_table(entries)  # raises BadDump with the field and the reason
        return _read_entries(cols, known, len(entries), typed=True)


def _columns(entries: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, tuple[Any, ...] | list[Any]]:
    """Each field's values over the entries (None where absent). The fields the first and last entries have are
    read by one itemgetter over every entry and transposed (C-level); a field some entry lacks, by ``dict.get``."""
    first, last = entries[0], entries[-1]  # optional fields (duration_ms) come and go with the state
    common = [k for k in names if k in first and k in last]
    while len(common) >= 2:
        try:
            rows = list(map(itemgetter(*common), entries))
        except KeyError as exc:
            common.remove(exc.args[0])
            continue
        out: dict[str, tuple[Any, ...] | list[Any]] = dict(zip(common, zip(*rows)))
        break
    else:
        out, common = {}, []
    for k in names:
        if k not in out:
            out[k] = list(map(dict.get, entries, repeat(k)))
    return out


def _read_entries(cols: dict[str, Any], known: Mapping[bytes, Any], n: int, typed: bool) -> _Entries:
    flat = {k: _flat(k, cols[k], typed) for k in _FLAT}
    _check_states(flat["state"], typed)
    keys = list(map(marshal.dumps, zip(*(cols[k] for k in _SHAPE)), repeat(2)))
    row_of = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    new: dict[bytes, tuple[Any, ...]] = {}
    for k in row_of:
        if k not in known:
            new[k] = marshal.loads(k)
    _check_shapes(list(new.values()), typed)
    return _Entries(flat, list(row_of), new, n, pa.array(list(map(row_of.__getitem__, keys)), type=pa.uint32()))


def _check_states(states: pa.Array, typed: bool) -> None:
    if not set(states.unique().to_pylist()) - {None} <= _STATES:
        if not typed:
            raise _Odd
        first = next(s for s in states.to_pylist() if s is not None and s not in _STATES)
        raise BadDump(f"entries: unknown state {first!r}")


# The compiled reader's flat fields, "name:kind" (int64, float64, bool, text), and how its buffers become arrays.
_KIND = {pa.int64(): "i", pa.float64(): "f", pa.bool_(): "b", pa.string(): "s"}
_COMPILED_FLAT = tuple(f"{k}:{_KIND[_ENTRY_SCHEMA.field(k).type]}" for k in _FLAT)


def _compiled_entries(columns: Any, known: Mapping[bytes, Any]) -> tuple[_Entries, list[Any]]:
    """The compiled reader's columns as Arrow arrays (no copy but the strings' dictionary decoding), checked as
    the Python reading checks them; with each distinct shape's ``process_group``."""
    n, cols, (keys, new, groups), rows = columns
    flat = {k: _buffers(_TYPES[k], n, *cols[k]) for k in _FLAT}
    _check_states(flat["state"], typed=False)
    _check_shapes(list(new.values()), typed=False)
    return _Entries(flat, keys, new, n, pa.Array.from_buffers(pa.uint32(), n, [None, pa.py_buffer(rows)])), groups


def _buffers(kind: pa.DataType, n: int, values: bytes, valid: bytes | None, dictionary: list[str] | None
             ) -> pa.Array:
    mask = pa.py_buffer(valid) if valid is not None else None
    if dictionary is None:
        return pa.Array.from_buffers(kind, n, [mask, pa.py_buffer(values)])
    index = pa.Array.from_buffers(pa.int32(), n, [mask, pa.py_buffer(values)])
    return pa.DictionaryArray.from_arrays(index, pa.array(dictionary, type=pa.string())).cast(pa.string())


def _compiled_pairs(entries: _Entries, groups: list[Any]) -> Iterator[tuple[Any, Any]]:
    """(pg_id, group name) of each entry, from the compiled reader's columns."""
    names = [pg[0] if pg else None for pg in groups]
    return zip(entries.flat["pg_id"].to_pylist(), map(names.__getitem__, entries.rows.to_pylist()))


def _compiled_raw(entries: _Entries, groups: list[Any]) -> list[dict[str, Any]]:
    """The fields ``_derived_status`` reads, one dict an entry: only for dumps without ``pg_status`` (before 2.x)."""
    f = entries.flat
    names = ("collective_seq_id", "seq_id", "pg_id", "state")
    return [{**dict(zip(names, row[:4])), "process_group": groups[row[4]]}
            for row in zip(*(f[k].to_pylist() for k in names), entries.rows.to_pylist())]


def _flat(name: str, values: Any, typed: bool) -> pa.Array:
    want = _TYPES[name]
    if typed or want not in _INFERRED:
        return pa.array(values, type=want)
    arr = pa.array(values)  # inferred: int64 only when every value is an int (a float would make it double)
    if arr.type not in _INFERRED[want]:
        raise _Odd
    return arr.cast(want) if arr.type != want else arr


def _check_shapes(shapes: list[tuple[Any, ...]], typed: bool) -> None:
    """The new shapes converted as the entries' own values would be (same types: marshal keeps them)."""
    if not shapes:
        return
    for i, k in enumerate(_SHAPE):
        arr = pa.array([s[i] for s in shapes], type=_TYPES[k])
        if k == "process_group" and pc.any(pc.not_equal(pc.list_value_length(arr), 2)).as_py():
            if not typed:
                raise _Odd
            raise BadDump("entries: `process_group` is not a (name, description) pair")


def _checked_table(entries: list[dict[str, Any]]) -> None:
    """The reference check of every field (Arrow's converter over the dicts, then the floats): slow, run only
    when the fast reading met something unusual; raises :class:`BadDump` naming the field."""
    try:
        table = pa.Table.from_pylist(entries, schema=_ENTRY_SCHEMA)
    except (TypeError, OverflowError, pa.ArrowException) as exc:
        raise BadDump(f"entries: {_bad_field(entries)} has a value of the wrong type "
                      f"({str(exc).splitlines()[0][:160]})") from None
    _refuse_truncated_floats(entries)
    states = set(table["state"].unique().to_pylist()) - {None}
    if not states <= _STATES:
        first = next(s for s in table["state"].to_pylist() if s is not None and s not in _STATES)
        raise BadDump(f"entries: unknown state {first!r}")
    pairs = table["process_group"].combine_chunks()
    if pc.any(pc.not_equal(pc.list_value_length(pairs), 2)).as_py():
        raise BadDump("entries: `process_group` is not a (name, description) pair")


_STATES = frozenset(fr.FR_STATES)


def _bad_field(entries: list[dict[str, Any]]) -> str:
    """The first field Arrow refuses (only on the error path: one conversion per field)."""
    for f in _ENTRY_SCHEMA:
        try:
            pa.array([e.get(f.name) for e in entries], type=f.type)
        except (TypeError, OverflowError, pa.ArrowException):
            return f"`{f.name}`"
    return "a field"


def _refuse_truncated_floats(entries: list[dict[str, Any]]) -> None:
    """Arrow truncates a float given for an integer field (1.5 -> 1): refuse floats outside `duration_ms` (the
    one float field). Value types are counted in one C-level pass; fields are only looked at on a mismatch."""
    floats = Counter(map(type, chain.from_iterable(map(dict.values, entries))))[float]
    if not floats or floats == sum(type(e.get("duration_ms")) is float for e in entries):
        return
    for f in _ENTRY_SCHEMA:
        if f.name != "duration_ms" and any(type(e.get(f.name)) is float for e in entries):
            raise BadDump(f"entries: `{f.name}` holds a float where an integer belongs")


# --- the batch's frames ----------------------------------------------------------------------------------


def _entries_frame(dumps: list[_Dump], shapes: pl.DataFrame) -> pl.DataFrame:
    """``fr_entries`` of every dump of a batch: the flat columns of all dumps in one Arrow table, the shape
    columns gathered from the batch's shapes by each entry's shape row, the file's rank, host and source
    repeated over its rows (categoricals: each text is stored once)."""
    with_rows = [d for d in dumps if d.entries is not None]
    if not with_rows:
        return fr.empty("fr_entries")
    flat = pa.table({k: pa.chunked_array([d.entries.flat[k] for d in with_rows if d.entries is not None],
                                         type=_TYPES[k]) for k in _FLAT})
    df = pl.from_arrow(flat)
    assert isinstance(df, pl.DataFrame)
    row = pl.Series("shape", pa.chunked_array([d.shape_rows for d in with_rows if d.shape_rows is not None],
                                              type=pa.uint32()))
    counts = [d.entries.n for d in with_rows if d.entries is not None]
    # each dump's index repeated over its rows (an empty list explodes to a null row: dumps of 0 rows are dropped)
    which = (pl.DataFrame({"i": range(len(counts)), "n": counts}, schema={"i": pl.UInt32, "n": pl.UInt32})
             .filter(pl.col("n") > 0).select(pl.col("i").repeat_by("n").explode())["i"])
    tags = pl.DataFrame({k: [d.tag[k] for d in with_rows] for k in ("rank", "host", "source")},
                        schema={"rank": pl.Int32, "host": pl.Categorical, "source": pl.Categorical})
    per_shape = shapes.select("pg_name", "pg_desc", "op", "sig")
    flat_part = _normalise(df.rename(_RENAME, strict=False))
    return fr.conform("fr_entries", flat_part.hstack(tags[which]).hstack(per_shape[row]))


def _normalise(df: pl.DataFrame) -> pl.DataFrame:
    zero_null = [pl.when(pl.col(c) > 0).then(pl.col(c)).alias(c) for c in ("started_ns", "completed_ns")]
    return df.with_columns(
        *zero_null,
        pl.col("collective_seq_id").fill_null(pl.col("seq_id")).alias("collective_seq"),
        (pl.col("duration_ms") * 1e6).round().cast(pl.Int64).alias("duration_ns"),
        (pl.col("timeout_ms") * 1_000_000).alias("timeout_ns"),
        pl.col("thread_name", "thread_id").cast(pl.Categorical),
    ).drop("duration_ms", "timeout_ms", "collective_seq_id", "seq_id")


def _shapes_frame(shapes: list[tuple[Any, ...]]) -> pl.DataFrame:
    """The batch's distinct shapes (one row each: pg_name, pg_desc, op, sig and the ``fr_signatures`` columns).
    ``sig`` is a content hash of the converted sizes, dtypes and stack: the same in every worker and batch."""
    table = pa.table({k: pa.array([s[i] for s in shapes], type=_TYPES[k]) for i, k in enumerate(_SHAPE)})
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    frame = pl.element().struct
    df = df.rename(_RENAME, strict=False).with_columns(
        pl.col("process_group").list.get(0, null_on_oob=True).cast(pl.Categorical).alias("pg_name"),
        pl.col("process_group").list.get(1, null_on_oob=True).cast(pl.Categorical).alias("pg_desc"),
        pl.col("op").str.replace(r"^[A-Za-z0-9_]+:", "").cast(pl.Categorical),
        pl.col("frames").list.eval(pl.format("{} ({}:{})", frame.field("name"), frame.field("filename"),
                                             frame.field("line"))).alias("stack"),
        _numel("in_sizes").alias("in_numel"),
        _numel("out_sizes").alias("out_numel"),
    ).drop("process_group", "frames")
    content = df.select(fr.schema("fr_signatures").names()[1:])
    sigs = [int.from_bytes(hashlib.blake2b(orjson.dumps(r), digest_size=8).digest(), "little")
            for r in content.iter_rows()]
    return df.with_columns(pl.Series("sig", sigs, dtype=pl.UInt64))


def _numel(col: str) -> pl.Expr:
    """Elements of all tensors: the sum over tensors of the product of their dimensions."""
    return pl.col(col).list.eval(pl.element().list.eval(pl.element().product()).list.first()).list.sum()


# --- per-group status ----------------------------------------------------------------------------


def _status(dump: dict[str, Any], cfg: dict[str, tuple[str | None, list[int]]], pairs: Iterator[tuple[Any, Any]],
            entries: Callable[[], list[dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """Rows of ``fr_pg_status`` (without rank, host, source): from ``pg_status``, else derived from the entries.
    ``pairs``: each entry's (pg_id, group name)."""
    if dump.get("pg_status"):
        names = _names_by_id(dump["pg_status"], cfg, pairs)
        return [_status_row(key, value, names, cfg) for key, value in dump["pg_status"].items()]
    return _derived_status(entries(), cfg)


def _group_pairs(entries: list[dict[str, Any]]) -> Iterator[tuple[Any, Any]]:
    names_of = [pg[0] if pg else None for pg in map(dict.get, entries, repeat("process_group"))]
    return zip(map(dict.get, entries, repeat("pg_id")), names_of)


def _derived_status(entries: list[dict[str, Any]], cfg: dict[str, tuple[str | None, list[int]]]
                    ) -> list[tuple[Any, ...]]:
    """Per group (pg_id, name, description) of the entries: the last collective enqueued, started (not
    ``scheduled``; -1 when none) and completed (else one below the first it holds). Dumps before 2.x only."""
    seqs: dict[tuple[Any, Any, Any], list[tuple[int, Any]]] = {}
    for e in entries:
        seq = e.get("collective_seq_id")
        seq = e.get("seq_id") if seq is None else seq
        pg: Any = e.get("process_group") or ()
        key = (e.get("pg_id"), pg[0] if len(pg) > 0 else None, pg[1] if len(pg) > 1 else None)
        group = seqs.setdefault(key, [])
        if seq is not None:
            group.append((seq, e.get("state")))
    rows = []
    for (pg_id, name, desc), done in sorted(seqs.items(), key=lambda kv: tuple(map(str, kv[0]))):
        every = [q for q, _ in done]
        started = [q for q, st in done if st is not None and st != "scheduled"]
        completed = [q for q, st in done if st == "completed"]
        low = min(every) - 1 if every else None
        rows.append((pg_id, name, desc, cfg.get(name, (None, None))[1] if name is not None else None,
                     max(every, default=None), max(started, default=-1), max(completed, default=low), "entries"))
    return rows


def _status_frame(dumps: list[_Dump]) -> pl.DataFrame:
    """``fr_pg_status`` of a batch. Every dump of a job lists the same groups: each distinct ``pg_ranks`` list is
    converted once and gathered (the default group's 4,096 ranks in every dump were 0.4 ms a dump, 1.6 CPU-s at
    4,096 dumps)."""
    rows = [row for d in dumps for row in d.status]
    if not rows:
        return fr.empty("fr_pg_status")
    at = _STATUS_COLUMNS.index("pg_ranks")
    distinct: dict[tuple[int, ...] | None, int] = {}
    which = [distinct.setdefault(None if r[at] is None else tuple(r[at]), len(distinct)) for r in rows]
    ranks = pl.Series("pg_ranks", [None if k is None else list(k) for k in distinct], dtype=_STATUS_SCHEMA["pg_ranks"])
    rest = {k: v for k, v in _STATUS_SCHEMA.items() if k != "pg_ranks"}
    df = pl.DataFrame([r[:at] + r[at + 1:] for r in rows], schema=rest, orient="row")
    return fr.conform("fr_pg_status", df.insert_column(at, ranks[which]))


_STATUS_SCHEMA: dict[str, pl.DataType] = {
    "pg_id": pl.Int32(), "pg_name": pl.String(), "pg_desc": pl.String(), "pg_ranks": pl.List(pl.Int32()),
    "last_enqueued": pl.Int64(), "last_started": pl.Int64(), "last_completed": pl.Int64(), "origin": pl.String(),
    "rank": pl.Int32(), "host": pl.String(), "source": pl.String()}
_STATUS_COLUMNS = tuple(_STATUS_SCHEMA)
_STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _names_by_id(status: dict[str, Any], cfg: dict[str, tuple[str | None, list[int]]],
                 pairs: Iterator[tuple[Any, Any]]) -> dict[int, str]:
    """pg_id -> pg_name: from the entries (they carry both); the rest by creation order, both keys sorted
    numerically (ids and names are handed out in the same order), when the counts agree."""
    known: dict[int, str] = {}
    for pg_id, name in dict.fromkeys(pairs):
        if pg_id is not None and name is not None:
            known.setdefault(pg_id, name)
    ids = sorted((_int(k, "pg_status key") for k in status), key=int)
    names = sorted(cfg, key=lambda n: (0, int(n), n) if n.isdigit() else (1, 0, n))
    if len(ids) == len(names) and all(known.get(i, n) == n for i, n in zip(ids, names)):
        return {**dict(zip(ids, names)), **known}
    return known


def _int(v: Any, where: str) -> int:
    """An int, or its decimal text (JSON dumps write the counters as strings)."""
    if isinstance(v, bool):
        raise BadDump(f"{where} is a bool, not an int")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and _DIGITS.fullmatch(v.strip()):
        return int(v)
    raise BadDump(f"{where} is not an int")


def _status_row(key: Any, value: Any, names: dict[int, str],
                cfg: dict[str, tuple[str | None, list[int]]]) -> tuple[Any, ...]:
    pg_id = _int(key, "pg_status key")
    if not isinstance(value, dict):
        raise BadDump(f"pg_status[{key}] is not a dict")
    counters = [_int(value.get(k, -1), f"pg_status[{key}].{k}") for k in _STATUS_KEYS]
    name = names.get(pg_id)
    desc, ranks = cfg.get(name, (None, None)) if name is not None else (None, None)
    return (pg_id, name, desc, ranks, *counters, "pg_status")


def _dump_row(dump: dict[str, Any], entries: _Entries | None, fmt: str, tag: dict[str, Any]) -> dict[str, Any]:
    n = entries.n if entries is not None else 0
    latest = None
    if entries is not None:
        f = entries.flat
        seen = [pc.max(f["time_created_ns"]).as_py()] + [
            pc.max(pc.filter(f[c], pc.greater(f[c], 0))).as_py()
            for c in ("time_discovered_started_ns", "time_discovered_completed_ns")]
        latest = max((t for t in seen if t is not None), default=None)
    return {**tag, "format": fmt, "version": dump.get("version"),
            "comm_lib_version": dump.get("comm_lib_version") or dump.get("nccl_version"),
            "entries": n, "pg_count": len(dump["pg_config"]) if dump.get("pg_config") else None,
            "has_status": bool(dump.get("pg_status")), "has_stacks": False, "latest_ns": latest}
