"""Whole-file fast path for small, well-formed Kineto traces: Polars' native JSON reader.

``read_native`` decodes a trace with ``pl.read_json`` against a fixed schema (only the fields the
extractor reads) and hands the extractor the raw columns and arg rows its per-event loop would have
built (``Extractor.add_segment``). It first proves that they are the same; on any doubt it returns
None, having changed nothing, and the file goes through the stream reader as before, so results
never depend on which path ran. Where Polars' reader differs from orjson plus the extractor
(checked on Polars 1.x, tests/parsers/test_kineto_native.py):

- a bool where the schema says a number reads as 1 / 1.0, and a number where it says String reads
  as its text (7.0 as ``"7"``): the text is searched for such values of the fields read (``_ODD``);
- a float where it says Int64 is truncated: ids are read as Float64 and converted as ``_to_int``
  converts them (integral: the int, else null); an id of 2**53 or more is a doubt;
- a scalar where it says List reads as a one-element list: grid / block / shape lists are checked
  in the text;
- null and absent read the same: a doubt where the extractor tells them apart (a null name, a
  ``Collective name`` key with a null value, shapes);
- a string where it says a number, a list or object where it says a scalar, NaN, nesting past 1,024
  levels (orjson's limit too), invalid JSON: the read fails.

Flow and instant events (``ph`` s/f/t/i) are counted with the other events not tabulated; the
stream reader cuts most of them out before parsing, which changes which counter they land in but
not the sum the message reports. One with a tabulated category is a doubt (the stream reader would
cut it or not depending on its key order).

Memory: ``read_json`` holds the whole text and a parsed tree of it, about 11x the JSON at peak
(measured on a 53.7 MB trace: +600 MB), against the stream reader's bounded chunks; only files up
to ``MAX_NATIVE_BYTES`` of JSON take this path.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

import orjson
import polars as pl
from forensics.parsers.common import GZIP_MAGIC
from forensics.parsers.kineto_extract import (
    COMM_ARG_KEYS,
    COMM_OP_PREFIXES,
    CPU_CATS,
    GPU_ARG_KEYS,
    GPU_CATS,
    NULL,
    Extractor,
    _to_int,
)
from forensics.parsers.kineto_stream import _EVENTS_KEY, ReadOutcome, _loads

from forensics.flops import SHAPED_OPS

# Off only for tests and benchmarks that compare the two paths (FORENSICS_KINETO_NATIVE=0).
ENABLED = os.environ.get("FORENSICS_KINETO_NATIVE", "1") != "0"
# Decompressed JSON above this goes to the stream reader: read_json's peak is ~11x the JSON.
MAX_NATIVE_BYTES = 8 << 20

_F, _S = pl.Float64, pl.String
_INT_COLS = {"in_nelems", "out_nelems", "group_size", "seq", "src_rank", "dst_rank"}
# Ids are read as text: ``_to_int`` treats 7, 7.0 and "7" alike, and text keeps a bool visible
# ("true") where a number type would read it as 1.
_ARGS = pl.Struct({
    "device": _S, "stream": _S, "correlation": _S, "External id": _S, "external id": _S,
    "grid": pl.List(_S), "block": pl.List(_S), "blocks per SM": _F,
    **{key: _S for key, _ in COMM_ARG_KEYS},
    "Input Dims": pl.List(pl.List(pl.Int64)), "Input type": pl.List(_S),
})
_EVENT = pl.Struct({"ph": _S, "cat": _S, "name": _S, "pid": _S, "tid": _S, "ts": _F, "dur": _F, "args": _ARGS})
_SCHEMA = {"traceEvents": pl.List(_EVENT)}
_AXES = tuple(f"{lst}_{axis}" for lst in ("grid", "block") for axis in "xyz")
_STR_ARGS = tuple(key for key, col in COMM_ARG_KEYS if col not in _INT_COLS)
_IDS = ("pid", "tid", "device", "stream", "correlation", "External id", "external id", *_AXES,
        *[key for key, col in COMM_ARG_KEYS if col in _INT_COLS])
_FLOW_PH = ["s", "f", "t", "i"]
_LEAD = re.compile(rb"[ \t\r\n]*\{")
_WS = b" \t\r\n"
_TAB = pl.col("cat").is_in(list(GPU_CATS) + list(CPU_CATS))
_COUNTS = [
    (pl.col("ph").is_in(_FLOW_PH) & _TAB).sum().alias("flow_tab"),
    pl.col("ph").is_in(_FLOW_PH).sum().alias("flows"),
    pl.col("ph").is_not_null().sum().alias("ph"),
    _TAB.sum().alias("tab"),
    (_TAB & pl.col("ts").is_null()).sum().alias("malformed"),
    (_TAB & pl.col("name").is_null()).sum().alias("no_name"),
]
_KEEP = _TAB & pl.col("ts").is_not_null()
_COMM_OP = pl.any_horizontal([pl.col("name").str.starts_with(p) for p in COMM_OP_PREFIXES])
_SPLIT = [pl.col(lst).list.get(i, null_on_oob=True).alias(f"{lst}_{axis}")
          for lst in ("grid", "block") for i, axis in enumerate("xyz")]


def _int(c: str) -> pl.Expr:
    return pl.col(c).cast(pl.Int64, strict=False)


_NUMERIC = r"^-?[0-9]"
# One row of facts about the tabulated rows that say whether a slower check is needed.
_FLAGS = [
    pl.any_horizontal([pl.col(c).is_not_null() & _int(c).is_null() for c in _IDS]).any().alias("odd_ids"),
    pl.any_horizontal([pl.col(c).str.starts_with("+") for c in _IDS]).any().alias("plus"),
    pl.any_horizontal([_int(c).abs() >= 2**53 for c in _IDS]).any().alias("big"),
    *[pl.col(c).is_in([0.0, 1.0]).any().alias(c) for c in ("ts", "dur", "blocks per SM")],
    pl.any_horizontal([pl.col(c).list.len() != 3 for c in ("grid", "block")]).any().alias("grid"),
    pl.col("name").str.contains(r"^-?[0-9.]+(?:[eE][-+]?[0-9]+)?$|^(?:true|false)$").any().alias("name"),
    *[(pl.col(k).str.contains(_NUMERIC) | pl.col(k).is_in(["true", "false"])).any().alias(k) for k in _STR_ARGS],
    (pl.col("Collective name").is_null() & pl.col("In msg nelems").is_null()
     & pl.any_horizontal([pl.col(k).is_not_null() for k, _ in GPU_ARG_KEYS])).any().alias("args_null"),
]
# The text searches run only when a flag says a value could have been coerced.
_BOOL = r"\s*:\s*(?:true|false)"
_FLAG_TEXT = {
    "ts": rb'"ts"\s*:\s*(?:true|false)',
    "dur": rb'"dur"\s*:\s*(?:true|false)',
    "blocks per SM": rb'"blocks per SM"\s*:\s*(?:true|false)',
    "grid": rb'"(?:grid|block)"\s*:\s*[^\[\sn]',
    "name": rb'"name"\s*:\s*[-0-9tf]',
    "args_null": rb'"(?:Collective name|In msg nelems)"\s*:\s*null',
    **{k: b'"' + k.encode() + rb'"\s*:\s*(?:-?[0-9]+[.eE]|-0[^0-9]|true|false)' for k in _STR_ARGS},
}
_DIMS_KEY, _TYPES_KEY = rb'"Input Dims"\s*:', rb'"Input type"\s*:'
_DIMS_OK = rb'"Input Dims"\s*:\s*\[(?:\s*\[[-0-9,\s]*\]\s*,?)*\s*\]'
_TYPES_OK = rb'"Input type"\s*:\s*(?:null|\[\s*(?:"(?:[^"\\]|\\.)*"\s*,?\s*)*\])'


class _Doubt(Exception):
    """The fast path cannot prove its result identical: the stream reader takes the file."""


def read_native(path: Path, limit: int, ex: Extractor) -> ReadOutcome | None:
    """The trace read whole into ``ex``, or None (nothing committed) when the file is too big,
    not plainly well-formed, or holds anything the fast path does not prove it reads the same."""
    if not ENABLED:
        return None
    text = _whole_text(path, min(limit, MAX_NATIVE_BYTES))
    if text is None or not _LEAD.match(text):
        return None
    try:
        return _read(text, ex)
    except (_Doubt, pl.exceptions.PolarsError, ValueError, TypeError, KeyError, IndexError,
            OverflowError, RecursionError):
        return None


def _whole_text(path: Path, cap: int) -> bytes | None:
    """The decompressed text, or None past ``cap`` bytes or on any gzip problem (the stream reader
    says what it is)."""
    try:
        if path.stat().st_size > cap:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if data[:2] != GZIP_MAGIC:
        return data
    out: list[bytes] = []
    total = 0
    while data:
        dec = zlib.decompressobj(31)
        try:
            chunk = dec.decompress(data, cap + 1 - total)
        except zlib.error:
            return None
        total += len(chunk)
        out.append(chunk)
        if total > cap or not dec.eof:  # too big, or truncated
            return None
        data = dec.unused_data
        if not data.strip(b"\x00"):  # zero padding ends the stream, as in the stream reader
            break
    return b"".join(out)


def _read(text: bytes, ex: Extractor) -> ReadOutcome:
    meta, start = _header(text)
    events = pl.read_json(text, schema=_SCHEMA).get_column("traceEvents")
    if events.null_count():
        raise _Doubt("no traceEvents list")
    n = int(events.list.len().item())
    ev = events.explode().head(n)
    if ev.null_count():
        raise _Doubt("an event that is not an object")
    df = ev.struct.unnest()
    meta.update(_trailer(text, start, df))
    rows = df.lazy().filter(_KEEP).unnest("args").with_columns(_SPLIT)
    counts, flags = pl.collect_all([df.lazy().select(_COUNTS), rows.select(_FLAGS)])
    c = counts.row(0, named=True)
    # A "ph" key anywhere but in the events themselves could be cut out by the stream reader.
    if c["flow_tab"] or c["no_name"] or text.count(b'"ph"') != c["ph"]:
        raise _Doubt("flow event with a tabulated category, null name, or nested ph")
    odd = _check(flags.row(0, named=True), rows, text)
    ex.add_segment(*_stage(rows, odd, text, ex))
    ex.malformed = c["malformed"]
    if n - c["tab"] - c["flows"]:
        ex.skipped[(None, None)] += n - c["tab"] - c["flows"]
    return ReadOutcome(meta=meta, events=n, flows=c["flows"], decompressed_bytes=len(text))


def _header(text: bytes) -> tuple[dict, int]:
    """The metadata before the event array, as the stream reader parses it, and where the array starts."""
    m = _EVENTS_KEY.search(text)
    if m is None or text.find(b'"traceEvents"', 0, m.start()) >= 0:
        raise _Doubt("no single traceEvents array")
    header = _loads(text[: m.end()] + b"]}")
    if not isinstance(header, dict):
        raise _Doubt("header")
    header.pop("traceEvents", None)
    return header, m.end()


def _trailer(text: bytes, start: int, df: pl.DataFrame) -> dict:
    """The metadata after the event array, parsed as the stream reader parses the end of the file:
    ``{"traceEvents":[`` + the last event and all that follows it. The last event is found from
    the end (a ``{`` after ``},``, or the array's first) and must be the last event Polars read."""
    if df.height == 0:
        doc = _loads(b'{"traceEvents":[' + text[start:])
        return _trailer_keys(doc, None)
    last = df.row(df.height - 1, named=True)
    pos = len(text)
    for _ in range(64):
        pos = text.rfind(b"{", start, pos)
        if pos < 0:
            break
        k = pos - 1
        while k >= start and text[k] in _WS:
            k -= 1
        if k >= start:  # not the array's first event: needs `}` `,` before it
            if text[k] != ord(","):
                continue
            k -= 1
            while k >= start and text[k] in _WS:
                k -= 1
            if k < start or text[k] != ord("}"):
                continue
        try:
            doc = _loads(b'{"traceEvents":[' + text[pos:])
        except ValueError:
            continue
        if isinstance(doc, dict):
            return _trailer_keys(doc, last)
    raise _Doubt("end of the event array not found")


def _trailer_keys(doc: object, last: dict | None) -> dict:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise _Doubt("trailer")
    events = doc.pop("traceEvents")
    if last is None:
        if events:
            raise _Doubt("trailer")
        return doc
    if len(events) != 1 or not isinstance(events[0], dict):
        raise _Doubt("trailer")
    e = events[0]
    if (e.get("name"), e.get("ts"), e.get("ph"), e.get("cat")) != (last["name"], last["ts"], last["ph"], last["cat"]):
        raise _Doubt("trailer")
    return doc


def _check(flags: dict[str, bool], rows: pl.LazyFrame, text: bytes) -> dict[str, int]:
    """Doubts from the values read, confirmed or cleared in the text; the odd ids' values as
    ``_to_int`` gives them (legacy ``"stream 7"``)."""
    if flags.pop("plus") or flags.pop("big"):
        raise _Doubt("an id past 2**53, or written +N")
    odd = _odd_ids(rows) if flags.pop("odd_ids") else {}
    for key, flagged in flags.items():
        if flagged and re.search(_FLAG_TEXT[key], text):
            raise _Doubt(f"a value Polars coerces ({key})")
    return odd


def _odd_ids(rows: pl.LazyFrame) -> dict[str, int]:
    odd = [rows.filter(pl.col(c).is_not_null() & _int(c).is_null()).select(pl.col(c).unique().alias("v")) for c in _IDS]
    values = set(pl.concat(pl.collect_all(odd)).get_column("v").to_list())
    if values & {"true", "false"}:
        raise _Doubt("a bool id")
    return {v: _to_int(v) for v in values}


def _id(c: str, odd: dict[str, int]) -> pl.Expr:
    """``_to_int`` of an id read as text."""
    if not odd:
        return _int(c).fill_null(NULL)
    return pl.coalesce(_int(c), pl.col(c).replace_strict(odd, default=NULL, return_dtype=pl.Int64), pl.lit(NULL))


def _arg_cols(keys: tuple[tuple[str, str], ...], odd: dict[str, int]) -> list[pl.Expr]:
    """Values as ``_arg_value`` gives them: int columns through ``_to_int``, null for NULL."""
    return [(pl.when(_id(key, odd) != NULL).then(_id(key, odd)) if col in _INT_COLS else pl.col(key)).alias(col)
            for key, col in keys]


def _stage(rows: pl.LazyFrame, odd: dict[str, int], text: bytes, ex: Extractor) -> tuple:
    """(GPU raw columns, host raw columns, GPU arg rows, comm op rows, shape rows) of the tabulated
    events, positioned after the extractor's rows."""
    ext = pl.col("External id")
    gpu_row, cpu_row = pl.col("_g").is_not_null(), pl.col("_c").is_not_null()
    rows = rows.with_columns(
        pl.col("cat").replace_strict(GPU_CATS, default=None, return_dtype=pl.Int64).alias("_g"),
        pl.col("cat").replace_strict(CPU_CATS, default=None, return_dtype=pl.Int64).alias("_c"),
    ).with_columns(
        pl.col("dur").fill_null(float("nan")),
        pl.when(ext.is_not_null()).then(_id("External id", odd)).otherwise(_id("external id", odd)).alias("_ext"),
        *[_id(c, odd).alias(f"_{c}") for c in ("pid", "tid", "correlation", *_AXES)],
        *[pl.when(pl.col(k).is_not_null()).then(_id(k, odd)).otherwise(_id(f, odd)).alias(f"_{k}")
          for k, f in (("device", "pid"), ("stream", "tid"))],
        (gpu_row.cum_sum() - 1 + ex.g_rows()).alias("_gr"),
        (cpu_row.cum_sum() - 1 + ex.c_rows()).alias("_cr"),
    )
    has_args = pl.col("Collective name").is_not_null() | pl.col("In msg nelems").is_not_null()
    shaped = pl.col("name").is_in(list(SHAPED_OPS)) & ~_COMM_OP & pl.col("Input Dims").is_not_null()
    gpu, cpu, gargs, cops, shapes = pl.collect_all([
        rows.filter(gpu_row).select(_GPU_COLS),
        rows.filter(cpu_row).select(_CPU_COLS),
        rows.filter(gpu_row & has_args).select("_gr", *_arg_cols(GPU_ARG_KEYS, odd)),
        rows.filter(cpu_row & _COMM_OP & pl.col("_c").is_in([0, 1])).select("_cr", *_arg_cols(COMM_ARG_KEYS, odd)),
        rows.filter(cpu_row & shaped).select("_cr", "Input Dims", "Input type"),
    ])
    _name_codes(gpu, cpu, ex)
    return gpu, cpu, gargs.rows(), cops.rows(), _shape_rows(shapes, text)


def _name_codes(gpu: pl.DataFrame, cpu: pl.DataFrame, ex: Extractor) -> None:
    """Names as codes of the extractor's name table (interned in first-seen order)."""
    for df in (gpu, cpu):
        names = df.get_column("name")
        uniq = names.unique(maintain_order=True).to_list()
        codes = [ex._name_id(nm) for nm in uniq]
        df.replace_column(1, names.replace_strict(uniq, codes, return_dtype=pl.Int64))


_GPU_COLS = [
    pl.col("_g").alias("kind"), "name", pl.col("_device").alias("device"),
    pl.col("_stream").alias("stream"), "ts", "dur", pl.col("_correlation").alias("correlation"),
    pl.col("_ext").alias("external_id"), *[pl.col(f"_{a}").alias(a) for a in _AXES],
    pl.col("blocks per SM").fill_null(float("nan")).alias("blocks_per_sm"),
]
_CPU_COLS = [
    pl.col("_c").alias("category"), "name", pl.col("_pid").alias("pid"),
    pl.col("_tid").alias("tid"), "ts", "dur", pl.col("_correlation").alias("correlation"),
    pl.col("_ext").alias("external_id"),
]
assert [e.meta.output_name() if isinstance(e, pl.Expr) else e for e in _GPU_COLS] == list(Extractor._G)
assert [e.meta.output_name() if isinstance(e, pl.Expr) else e for e in _CPU_COLS] == list(Extractor._C)


def _shape_rows(shapes: pl.DataFrame, text: bytes) -> list[tuple]:
    """GEMM / attention ops with their shapes as the JSON text orjson writes for them."""
    if not shapes.height:
        return []
    # Every "Input Dims" a list of int lists and every "Input type" null or a list of strings: then
    # Polars read them as written (no scalar wrapped, no null for a present key).
    for key, ok in ((_DIMS_KEY, _DIMS_OK), (_TYPES_KEY, _TYPES_OK)):
        if len(re.findall(key, text)) != len(re.findall(ok, text)):
            raise _Doubt("shapes not plain lists")
    out = []
    for row, dims, types in shapes.iter_rows():
        if any(d is None or None in d for d in dims):  # an int past 64 bits, or a null
            raise _Doubt("null in shapes")
        out.append((row, orjson.dumps(dims).decode(), orjson.dumps(types).decode()))
    return out
