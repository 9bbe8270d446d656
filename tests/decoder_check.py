"""The typed Kineto decoder against the stream reader: what each hands the frame builder, for one file.

Both read the file into a fresh ``Extractor``; everything the frames are built from is compared: the GPU and
host column buffers (bytes, so NaN compares equal), the collective and shape args rows, the events counted
and not tabulated, the malformed count, the metadata and the read's outcome. The frame building after that
is one code for both. Usable from tests and as a script over files and folders.
"""

from __future__ import annotations

import sys
from pathlib import Path

from forensics.parsers.bounded_read import DEFAULT_MAX_DECOMPRESSED
from forensics.parsers.kineto_extract import Extractor
from forensics.parsers.kineto_stream import TraceReadError, read_trace
from forensics.parsers.kineto_typed import TypedRejected, read_trace_compiled, read_trace_typed


def _state(ex: Extractor, outcome: object) -> dict:
    o = outcome
    return {
        "gpu": {c: a.tobytes() for c, a in ex.g.items()},
        "cpu": {c: a.tobytes() for c, a in ex.c.items()},
        "names": [name for name, _ in sorted(ex.names.items(), key=lambda kv: kv[1])],
        "gpu_comm_args": ex.gpu_comm_args,
        "comm_ops": ex.comm_ops,
        "shape_ops": ex.shape_ops,
        "not_tabulated": sum(ex.skipped.values()) + o.flows,  # type: ignore[attr-defined]
        "malformed": ex.malformed,
        "events": o.events,  # type: ignore[attr-defined]
        "meta": o.meta,  # type: ignore[attr-defined]
        "complete": o.complete,  # type: ignore[attr-defined]
        "problem": o.problem,  # type: ignore[attr-defined]
    }


def _names_by_row(state: dict) -> dict:
    """Name codes depend on the order names were first met (the typed reader meets a chunk's GPU names before its
    host names): compare the names of the rows instead of the codes."""
    import array

    out = dict(state)
    for side in ("gpu", "cpu"):
        codes = array.array("q")
        codes.frombytes(state[side]["name"])
        out[side] = {**state[side], "name": [state["names"][c] for c in codes]}
    out.pop("names")
    return out


def compare(path: Path, limit: int = DEFAULT_MAX_DECOMPRESSED) -> tuple[str, list[str]]:
    """('typed' or the rejection's reason or 'unreadable: ...', the fields that differ: [] when identical)."""
    typed_ex = Extractor()
    typed_ex.begin_file()
    try:
        typed_out = read_trace_typed(path, limit, typed_ex.feed_typed)
    except TypedRejected as exc:
        return f"rejected: {exc}", []
    except TraceReadError as exc:
        return f"unreadable: {exc}", []
    stream_ex = Extractor()
    stream_ex.begin_file()
    stream_out = read_trace(path, limit, stream_ex.feed)
    a, b = _names_by_row(_state(typed_ex, typed_out)), _names_by_row(_state(stream_ex, stream_out))
    return "typed", [key for key in a if a[key] != b[key]]


def compare_compiled(path: Path, limit: int = DEFAULT_MAX_DECOMPRESSED) -> tuple[str, list[str]]:
    """The compiled reader (parsers/kineto_columns.c) against the typed one: ('compiled' or 'refused: ...' or
    'unreadable: ...', the fields that differ). Reading a file the typed reader rejects is a difference."""
    ex = Extractor()
    ex.begin_file()
    try:
        out = read_trace_compiled(path, limit, ex.feed_text)
    except TypedRejected as exc:
        return f"refused: {exc}", []
    except TraceReadError as exc:
        return f"unreadable: {exc}", []
    typed_ex = Extractor()
    typed_ex.begin_file()
    try:
        typed_out = read_trace_typed(path, limit, typed_ex.feed_typed)
    except TypedRejected as exc:
        return f"compiled, though the typed reader rejects it ({exc})", ["accepted"]
    a, b = _names_by_row(_state(ex, out)), _names_by_row(_state(typed_ex, typed_out))
    return "compiled", [key for key in a if a[key] != b[key]]


def trace_files(*roots: Path) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        if root.is_file():
            out.append(root)
        else:
            out += sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                          and "truth" not in p.name)
    return out


def main(argv: list[str]) -> int:
    bad = 0
    check = compare
    if argv[:1] == ["--compiled"]:  # the compiled reader against the typed one
        check, argv = compare_compiled, argv[1:]
    for path in trace_files(*map(Path, argv)):
        how, diff = check(path)
        bad += bool(diff)
        print(f"{'DIFFERENT ' + ','.join(diff) if diff else 'same':<12} {how[:100]:<60} {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
