"""Run discovery: walk RUN_DIR, decide what every file is by its content, and parse it.

Never follows a symlink out of RUN_DIR and never writes into it. Every file becomes one row of the
``sources`` frame, whatever became of it, so nothing is silently dropped.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import time
import traceback
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import polars as pl
from forensics.parsers import registry, sniff
from forensics.parsers.bounded_read import GZIP_MAGIC, read_head, read_tail
from forensics.parsers.result import ParseContext, Parser, ParseResult

from forensics.base import frames as fr
from forensics.base.errors import is_bug
from forensics.base.ray_engine import ray_map, ray_session
from forensics.base.workers import Started, run_pool

HEAD_BYTES = 1 << 20
TAIL_BYTES = 1 << 20
QUICK_HEAD_BYTES = 64 << 10
HEAD_DIGEST_BYTES = 64 << 10  # duplicates: files of one size are compared by this much first
# Parse in worker processes only when there is enough work to pay for their start-up.
PARALLEL_MIN_BYTES = 32 << 20
PARALLEL_MIN_FILES = 64
# Small files are parsed in units of several: one worker round trip per unit, and the files of a
# unit whose kind has a batch parser have their frames built together (Polars' fixed cost per
# call, a few ms a file, is paid once per unit). A file above SMALL_FILE_BYTES is a unit alone.
UNIT_MAX_FILES = 512
UNIT_MAX_BYTES = 16 << 20
# A unit for a worker process is smaller: a worker's peak (the unit's column staging, its frames and their
# copy on the way to the parent) grows with the unit, and two workers' peaks add to the frames the parent
# holds. 1,024 simulated ranks, 428 traces parsed in units of 214 / 107 / 54 traces (16 / 8 / 4 MB of
# gzipped JSON): peak 494 / 297 / 217 MiB a process, the CPU seconds within the noise of each other.
WORKER_UNIT_MAX_BYTES = 4 << 20
SMALL_FILE_BYTES = 4 << 20
# Kinds whose parser can take several files at once ("module:class", see ``BatchParser``).
BATCH_PARSERS = {"kineto": "forensics.parsers.kineto:KinetoBatch", "nccl_log": "forensics.parsers.nccl_log:NcclBatch",
                 "dmesg": "forensics.parsers.kernel_log:KernelLogBatch",
                 "flight_recorder": "forensics.parsers.flight_recorder:FlightRecorderBatch"}

# Names that make an empty or undecompressable file count as a broken trace rather than noise.
_TRACE_NAME = re.compile(r"\.json(\.gz)?$|\.pt\.trace|trace", re.IGNORECASE)
# Names that make JSON of the wrong shape a broken trace; a plain `config.json` stays ignored.
_STRONG_TRACE_NAME = re.compile(r"\.pt\.trace|trace|(rank|worker)[-_]?\d", re.IGNORECASE)
# JSON documents people keep in run folders that are known not to be traces.
_KNOWN_JSON = (
    (re.compile(rb'"schema"\s*:\s*"forensics-sim-truth/'), "forensics simulator ground truth (truth.json)"),
    (re.compile(rb'"tool"\s*:\s*\{\s*"name"\s*:\s*"forensics"'), "a forensics report (findings.json)"),
)


@dataclass
class DiscoveredFile:
    path: Path
    rel_path: str
    kind: str
    size_bytes: int
    status: str | None = None  # set when decided without parsing (ignored / failed)
    message: str | None = None


class BatchParser(Protocol):
    """Parses several files of one kind: ``add`` reads one (a failed result, or None when its
    result comes later), ``finish`` returns the results of the files added, and their frames."""

    def add(self, path: Path, ctx: ParseContext) -> ParseResult | None: ...

    def finish(self) -> tuple[list[ParseResult], dict[str, pl.DataFrame]]: ...


@dataclass
class SharedFrames:
    """Frames holding the rows of several files (a batch); each row names its file in ``source``."""

    frames: dict[str, pl.DataFrame]
    sources: list[str]


@dataclass
class ParsedSource:
    file: DiscoveredFile
    result: ParseResult
    parse_ns: int
    # Set when this file's rows are in frames shared with other files (``result.frames`` is empty).
    shared: SharedFrames | None = None


ProgressFn = Callable[[str, int, int], None]
FoundFn = Callable[[str, int], None]  # (relative path, files found before it)


def walk(run_dir: Path) -> list[tuple[Path, str, str | None]]:
    """(absolute path, relative path, reason-if-not-followed) for every file below ``run_dir``;
    ``run_dir`` may also be a single file (then its only entry, named by its file name)."""
    if not run_dir.is_dir():
        return [(run_dir.resolve(), run_dir.name, None)]
    root = run_dir.resolve()
    found: list[tuple[Path, str, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in list(dirnames):
            if (base / name).is_symlink():
                found.append((base / name, _rel(base / name, root), "symlinked directory: not followed"))
        found.extend(_walk_file(base / name, root) for name in sorted(filenames))
    return sorted(found, key=lambda item: item[1])


def _walk_file(path: Path, root: Path) -> tuple[Path, str, str | None]:
    rel = _rel(path, root)
    if path.is_symlink():
        try:
            target = Path(os.path.realpath(path, strict=True))
        except (OSError, RuntimeError):  # dangling, or a loop of links
            return path, rel, "dangling symlink (or a loop of links)"
        if not target.is_relative_to(root):
            return path, rel, "symlink to a file outside RUN_DIR: not followed"
        if not target.is_file():
            return path, rel, "symlink to something that is not a regular file"
    elif not path.is_file():
        return path, rel, "not a regular file (FIFO, socket or device): not read"
    return path, rel, None


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def classify(path: Path, rel_path: str) -> DiscoveredFile:
    """Decide the kind of one file from its content."""
    size = path.stat().st_size
    name_says_trace = bool(_TRACE_NAME.search(rel_path))
    if size == 0:
        kind = "kineto" if name_says_trace else "unknown"
        status = "failed" if kind == "kineto" else "ignored"
        return DiscoveredFile(path, rel_path, kind, size, status, "empty file")
    quick = _quick_trace(path, rel_path, size)
    if quick is not None:
        return quick
    head, error = read_head(path, HEAD_BYTES)
    if error:
        return DiscoveredFile(path, rel_path, "kineto" if name_says_trace else "unknown", size, "failed", error)
    binary = _classify_binary(path, rel_path, head)
    if binary is not None:
        kind, why = binary
        return DiscoveredFile(path, rel_path, kind, size, None if kind != "unknown" else "ignored", why)
    return _classify_text(path, rel_path, size, head)


def _quick_trace(path: Path, rel_path: str, size: int) -> DiscoveredFile | None:
    """A trace told by its first QUICK_HEAD_BYTES (most are), else None: decompressing a whole
    megabyte of every trace cost more than the rest of discovery. The answer is the one the full
    head gives: every check before the Kineto score reads only the first 8 KiB (a shorter head is
    the whole file), and a key found in a prefix is in the longer head too."""
    head, error = read_head(path, QUICK_HEAD_BYTES)
    if error:
        return None
    binary = _classify_binary(path, rel_path, head)
    if binary == ("flight_recorder", None):
        # the same answer as the full head's (the checks before it read the first bytes, and the dump's keys found
        # in a prefix are in the longer head too): a 4,096-rank job's dumps are not read a second time, 1 MiB each
        return DiscoveredFile(path, rel_path, "flight_recorder", size)
    if binary is not None:
        return None
    if any(pattern.search(head[:4096]) for pattern, _ in _KNOWN_JSON) or sniff.score_kineto(head) < 100:
        return None
    return DiscoveredFile(path, rel_path, "kineto", size)


def _classify_binary(path: Path, rel_path: str, head: bytes) -> tuple[str, str | None] | None:
    """(kind, reason to ignore) of a binary file; None for text."""
    if head.startswith((b"NVIDIA Tegra Profiler Report", b"NSYS")) or rel_path.endswith((".nsys-rep", ".qdrep")):
        return "unknown", "Nsight Systems report: export it with `nsys export --type sqlite` to analyze it"
    if head.startswith(sniff.SQLITE_MAGIC):
        # A binary container: the text sniffers' regexes would only scan (slowly) binary pages.
        # The nsys parser tells an Nsight Systems export from any other SQLite database.
        return "nsys", None
    if head.startswith(GZIP_MAGIC):
        return "unknown", "compressed twice (gzip inside gzip): gunzip it once to analyze it"
    if sniff.score_flight_recorder_pickle(head):
        return "flight_recorder", None
    if not sniff.is_binary(head):
        return None
    if not head.strip(b"\x00") and not read_tail(path, TAIL_BYTES).strip(b"\x00"):
        return "unknown", "only zero bytes (space allocated but never written, e.g. by a crash)"
    return "unknown", "binary file of no known format"


def _classify_text(path: Path, rel_path: str, size: int, head: bytes) -> DiscoveredFile:
    """A text file (or JSON): the kind whose sniffer scores its head (and tail) highest."""
    for pattern, what in _KNOWN_JSON:
        if pattern.search(head[:4096]):
            return DiscoveredFile(path, rel_path, "unknown", size, "ignored", f"{what}, not an input")
    if sniff.score_kineto(head) >= 100:
        # Unmistakably a trace: scanning its text for log lines would only cost time.
        return DiscoveredFile(path, rel_path, "kineto", size)
    text_sample = head + b"\n" + read_tail(path, TAIL_BYTES) if size > HEAD_BYTES else head
    best_kind, best_score = "unknown", 0
    for kind in registry.KINDS:
        score = kind.score(text_sample if kind.text else head)
        if score > best_score:
            best_kind, best_score = kind.kind, score
    if best_kind == "unknown":
        stripped = head.lstrip()
        if _STRONG_TRACE_NAME.search(rel_path) and stripped[:1] in (b"{", b"["):
            # Named like a trace but shaped otherwise: the parser gives the precise reason.
            return DiscoveredFile(path, rel_path, "kineto", size)
        what = "JSON, but not a trace" if stripped[:1] in (b"{", b"[") else "not a recognised trace or log"
        return DiscoveredFile(path, rel_path, "unknown", size, "ignored", what)
    return DiscoveredFile(path, rel_path, best_kind, size)


def parse_one(file: DiscoveredFile, run_dir: Path) -> ParsedSource:
    """Parse one classified file. Never raises (but for interrupts): failures become a failed ParseResult."""
    start = time.perf_counter_ns()
    if file.status is not None:
        result = ParseResult(status=file.status, message=file.message)
    else:
        parser = registry.load_parser(file.kind)
        if parser is None:
            result = ParseResult(status="ignored", message=f"recognised as {file.kind}; no parser for it yet")
        else:
            result = _run_parser(parser, file, run_dir)
    return ParsedSource(file, result, time.perf_counter_ns() - start)


def _run_parser(parser: Parser, file: DiscoveredFile, run_dir: Path) -> ParseResult:
    ctx = ParseContext(run_dir=run_dir, rel_path=file.rel_path)
    result = _guarded(lambda: parser(file.path, ctx), file)
    assert result is not None
    return result


def _guarded(call: Callable[[], ParseResult | None], file: DiscoveredFile) -> ParseResult | None:
    """``call()``, with every failure but an interrupt turned into a failed result."""
    if not os.path.lexists(file.path):
        return ParseResult.failed("the file vanished between discovery and parsing")
    try:
        return call()
    except MemoryError:
        return ParseResult.failed("out of memory while parsing")
    except FileNotFoundError:
        return ParseResult.failed("the file vanished between discovery and parsing")
    except OSError as exc:
        return ParseResult.failed(f"unreadable: {exc.strerror or exc}")
    except RecursionError:
        return ParseResult.failed("nesting too deep to parse")
    except BaseException as exc:  # a parser bug (a Rust panic too) must not take the whole analysis down
        if not is_bug(exc):
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return ParseResult.failed(
            f"internal parser error (please report): {type(exc).__name__}: {exc} "
            f"at {Path(where.filename).name}:{where.lineno}"
        )


def parse_unit(files: list[DiscoveredFile], run_dir: Path) -> list[ParsedSource]:
    """Parse a unit of files (in order); files of a kind with a batch parser are parsed together."""
    out: list[ParsedSource] = []
    batches: dict[str, tuple[BatchParser, list[ParsedSource]]] = {}
    for f in files:
        spec = BATCH_PARSERS.get(f.kind) if f.status is None else None
        if spec is None:
            out.append(parse_one(f, run_dir))
            continue
        batch, pending = batches.get(f.kind) or batches.setdefault(f.kind, (_load_batch(spec), []))
        ctx = ParseContext(run_dir=run_dir, rel_path=f.rel_path)
        start = time.perf_counter_ns()
        early = _guarded(partial(batch.add, f.path, ctx), f)
        placeholder = ParseResult(status="failed", message="not parsed")  # until the batch finishes
        item = ParsedSource(f, early if early is not None else placeholder, time.perf_counter_ns() - start)
        out.append(item)
        if early is None:
            pending.append(item)
    for batch, pending in batches.values():
        _finish_batch(batch, pending, run_dir)
    for item in out:
        if item.result.status in ("ok", "partial"):
            for spec in registry.ALSO_READ.get(item.file.kind, ()):
                _also_read(item, run_dir, spec)
    return out


def _also_read(item: ParsedSource, run_dir: Path, spec: str) -> None:
    """A further scanner of a kind (``registry.ALSO_READ``) over a parsed file: its frames join the file's
    own (``result.frames``, also when the file's other rows sit in a batch's shared frames)."""
    module, _, name = spec.partition(":")
    scan: Any = getattr(importlib.import_module(module), name)
    ctx = ParseContext(run_dir=run_dir, rel_path=item.file.rel_path)
    res = item.result
    start = time.perf_counter_ns()
    try:
        frames, note, damaged = scan(item.file.path, ctx, res.rank, res.host)
    except (OSError, MemoryError, RecursionError, ValueError) as exc:  # the file's own parse stands
        frames, note, damaged = {}, f"not read by {module}: {type(exc).__name__}: {exc}", True
    item.parse_ns += time.perf_counter_ns() - start
    res.frames = {**res.frames, **frames}
    if not note:
        return
    res.message = f"{res.message}; {note}" if res.message else note
    if damaged and res.status == "ok":
        res.status = "partial"


def _load_batch(spec: str) -> BatchParser:
    module, _, name = spec.partition(":")
    factory: Any = getattr(importlib.import_module(module), name)
    return factory()


def _finish_batch(batch: BatchParser, items: list[ParsedSource], run_dir: Path) -> None:
    if not items:
        return
    start = time.perf_counter_ns()
    try:
        results, frames = batch.finish()
    except BaseException as exc:  # a parser bug on one file must cost that file only: parse them one by one
        if not is_bug(exc):
            raise
        for item in items:
            redo = parse_one(item.file, run_dir)
            item.result, item.parse_ns = redo.result, item.parse_ns + redo.parse_ns
        return
    share = (time.perf_counter_ns() - start) // len(items)
    shared = SharedFrames(frames, [item.file.rel_path for item in items]) if len(items) > 1 else None
    for item, result in zip(items, results):
        if shared is None:
            result.frames = frames
        item.result, item.parse_ns, item.shared = result, item.parse_ns + share, shared


def units(files: list[DiscoveredFile], n_workers: int) -> list[list[DiscoveredFile]]:
    """Consecutive files grouped into units of work (see UNIT_MAX_FILES); a big file is alone.
    ``n_workers`` 0: parsed in this process, so no more units than the size caps make; else units for worker
    processes, at most WORKER_UNIT_MAX_BYTES each."""
    per_unit = UNIT_MAX_FILES if n_workers == 0 else max(1, min(UNIT_MAX_FILES, -(-len(files) // (4 * n_workers))))
    max_bytes = UNIT_MAX_BYTES if n_workers == 0 else WORKER_UNIT_MAX_BYTES
    out: list[list[DiscoveredFile]] = []
    unit: list[DiscoveredFile] = []
    size = 0
    for f in files:
        big = f.size_bytes > SMALL_FILE_BYTES
        if unit and (big or len(unit) >= per_unit or size + f.size_bytes > max_bytes):
            out.append(unit)
            unit, size = [], 0
        unit.append(f)
        size += f.size_bytes
        if big:
            out.append(unit)
            unit, size = [], 0
    if unit:
        out.append(unit)
    return out


def _parse_worker(args: tuple[list[DiscoveredFile], Path]) -> list[ParsedSource]:
    return parse_unit(*args)


def discover(run_dir: Path, found: FoundFn | None = None,
             walked: list[tuple[Path, str, str | None]] | None = None) -> list[DiscoveredFile]:
    """Every file below ``run_dir`` (or ``run_dir`` itself, a file), classified; duplicates marked.
    ``found(rel_path, n_before)`` before each file is classified; ``walked``: :func:`walk`'s answer, if known."""
    files: list[DiscoveredFile] = []
    for path, rel, reason in walked if walked is not None else walk(run_dir):
        if found:
            found(rel, len(files))
        if reason:
            files.append(DiscoveredFile(path, rel, "unknown", _lsize(path), "ignored", reason))
            continue
        try:
            files.append(classify(path, rel))
        except FileNotFoundError:
            files.append(DiscoveredFile(path, rel, "unknown", 0, "failed", "the file vanished during discovery"))
        except OSError as exc:
            files.append(DiscoveredFile(path, rel, "unknown", 0, "failed", f"unreadable: {exc.strerror or exc}"))
    mark_duplicates(files)
    return files


def _lsize(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def discover_and_parse(
    run_dir: Path,
    progress: ProgressFn | None = None,
    workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    found: FoundFn | None = None,
) -> list[ParsedSource]:
    """Classify and parse every file below ``run_dir`` (or the one file ``run_dir``); results in path order.
    ``found``: told each file before it is classified (:func:`discover`); ``progress``: once when parsing
    starts (done 0), then each file once parsed.

    ``engine`` "local": this process, or a pool of worker processes when there is enough to parse;
    "ray": the same units of files as Ray tasks (``ray_address``: an existing cluster, whose nodes
    see RUN_DIR at the same path; None: a local one). KeyboardInterrupt and SystemExit (a SIGTERM
    handler's) propagate as soon as the worker processes are gone: pending files are cancelled and
    running workers terminated.
    """
    walked = walk(run_dir)
    early = _early_pool(engine, workers, len(walked))
    try:
        files = discover(run_dir, found, walked)
        if progress:  # discovery is over: parsing starts
            progress("", 0, len(files))
        root = run_dir if run_dir.is_dir() else run_dir.parent
        to_parse = [f for f in files if f.status is None]
        total_bytes = sum(f.size_bytes for f in to_parse)
        n_workers = workers if workers is not None else min(os.cpu_count() or 1, len(to_parse))
        results: list[ParsedSource] = []

        def tick(item: ParsedSource) -> None:
            results.append(item)
            if progress:
                progress(item.file.rel_path, len(results), len(files))

        if engine == "ray":
            _parse_on_ray(files, root, tick, ray_address)
        elif n_workers > 1 and len(to_parse) > 1 and (total_bytes >= PARALLEL_MIN_BYTES
                                                      or len(to_parse) >= PARALLEL_MIN_FILES):
            _parse_in_pool(files, root, n_workers, tick, early)
        else:
            for unit in units(files, 0):
                for item in parse_unit(unit, root):
                    tick(item)
    finally:
        if early is not None:
            early.stop()  # not needed after all (or an interrupt): run_pool took and ended those it used
    _reject_duplicate_ranks(results)
    settle_guessed_ranks(results)
    return results


def _in_order(tick: Callable[[ParsedSource], None]) -> Callable[[int, list[ParsedSource]], None]:
    """A ``done(index, items)`` that hands the units' items to ``tick`` in unit (so path) order."""
    out: dict[int, list[ParsedSource]] = {}
    emitted = 0

    def done(index: int, items: list[ParsedSource]) -> None:
        nonlocal emitted
        out[index] = items
        while emitted in out:
            for item in out.pop(emitted):
                tick(item)
            emitted += 1

    return done


def _parse_on_ray(files: list[DiscoveredFile], root: Path, tick: Callable[[ParsedSource], None],
                  address: str | None) -> None:
    """The pool's units of work, parsed by the pool's function, as Ray tasks (one unit per CPU at a time
    and a few more queued, as many units as the pool makes for that many CPUs)."""
    with ray_session(address) as cpus:
        ray_map(_parse_worker, [(unit, root) for unit in units(files, cpus)], _lost, _in_order(tick))


def _early_pool(engine: str, workers: int | None, n_files: int) -> Started | None:
    """The parse workers started before discovery when the files alone make a pool likely (PARALLEL_MIN_FILES):
    their start-up (interpreter, Polars, the parsers: about 1 s each) runs while this process classifies the
    files, instead of after. Stopped unused if discovery leaves too little to parse."""
    n_workers = workers if workers is not None else min(os.cpu_count() or 1, n_files)
    if engine != "local" or n_workers < 2 or n_files < PARALLEL_MIN_FILES:
        return None
    return Started(_parse_worker, n_workers)


def _parse_in_pool(files: list[DiscoveredFile], root: Path, n_workers: int,
                   tick: Callable[[ParsedSource], None], started: Started | None = None) -> None:
    """Parse in worker processes (``started``: some already running); ``tick`` sees the results in path order."""
    run_pool(_parse_worker, [(unit, root) for unit in units(files, n_workers)], n_workers, _lost, _in_order(tick),
             started=started)


def _lost(args: tuple[list[DiscoveredFile], Path], why: str) -> list[ParsedSource]:
    return [ParsedSource(f, ParseResult.failed(f"not parsed: {why} (out of memory?)"), 0) for f in args[0]]


def _reject_duplicate_ranks(results: Iterable[ParsedSource]) -> None:
    """Two trace files claiming the same rank: the later one (in path order) is failed, not merged.
    Guessed ranks are settled afterwards (``settle_guessed_ranks``)."""
    owner: dict[int, str] = {}
    for item in results:
        res = item.result
        if not _is_trace(item) or res.rank is None or res.rank_guessed:
            continue
        first = owner.setdefault(res.rank, item.file.rel_path)
        if first != item.file.rel_path:
            item.result = ParseResult(
                status="failed",
                message=f"rank {res.rank} is already claimed by {first}; this file was not used",
                rank=res.rank,
                host=res.host,
            )


def _is_trace(item: ParsedSource) -> bool:
    return item.file.kind in ("kineto", "nsys") and item.result.status in ("ok", "partial")


def settle_guessed_ranks(results: list[ParsedSource]) -> None:
    """A trace that names no rank was numbered from 0 by its parser. That holds when it is the job's
    only trace; beside other traces its ranks would be made up, so it is ignored, saying why."""
    traces = [item for item in results if _is_trace(item)]
    if len(traces) <= 1:
        return
    for item in traces:
        if item.result.rank_guessed:
            item.result = ParseResult(
                status="ignored",
                message=f"names no rank (no distributedInfo, environment or rank in the file name) "
                f"and is not the only trace of the job ({len(traces)} traces): not used",
                host=item.result.host,
            )


def mark_duplicates(files: list[DiscoveredFile]) -> None:
    """A file reachable under several paths (hard link, symlink, or a copy with the same bytes) is
    analysed once: the first regular file in path order; the others are ignored as duplicates of it."""
    by_identity: dict[tuple[int, int] | tuple[int, str], DiscoveredFile] = {}
    by_size: dict[int, list[DiscoveredFile]] = {}
    for f in sorted((f for f in files if f.status is None), key=lambda f: (f.path.is_symlink(), f.rel_path)):
        try:
            st = f.path.stat()
        except OSError:
            continue
        first = by_identity.setdefault((st.st_dev, st.st_ino), f)
        if first is not f:
            _mark_duplicate(f, first, "the same file")
        else:
            by_size.setdefault(st.st_size, []).append(f)
    for group in by_size.values():
        for same_head in _same_heads(group):
            for f in same_head:
                digest = _digest(f.path)
                if digest is None:
                    continue
                first = by_identity.setdefault((-1, digest), f)
                if first is not f:
                    _mark_duplicate(f, first, "the same content")


def _same_heads(group: list[DiscoveredFile]) -> list[list[DiscoveredFile]]:
    """Files of one size grouped by the digest of their first 64 KiB, groups of two or more (in order): only these
    can be copies, and only they are read whole (thousands of per-rank dumps of one size differ early)."""
    if len(group) < 2:
        return []
    by_head: dict[int, list[DiscoveredFile]] = {}
    for f in group:
        head = _head_crc(f.path)
        if head is not None:
            by_head.setdefault(head, []).append(f)
    return [g for g in by_head.values() if len(g) > 1]


def _mark_duplicate(f: DiscoveredFile, first: DiscoveredFile, how: str) -> None:
    f.kind, f.status, f.message = first.kind, "ignored", f"duplicate of {first.rel_path} ({how}): analysed once"


def _head_crc(path: Path) -> int | None:
    """CRC-32 of the file's first HEAD_DIGEST_BYTES: only groups files to compare whole (files with equal heads have
    equal CRCs; a collision costs one whole-file digest, never a wrong answer). 4x cheaper than blake2b: 0.8 of
    discovery's 1.9 s at 4,096 Flight Recorder dumps of one size."""
    try:
        with open(path, "rb") as fh:
            return zlib.crc32(fh.read(HEAD_DIGEST_BYTES))
    except OSError:
        return None


def _digest(path: Path) -> str | None:
    """The digest of the file's bytes."""
    h = hashlib.blake2b(digest_size=20)
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def sources_frame(results: Iterable[ParsedSource]) -> pl.DataFrame:
    rows = [
        {
            "path": item.file.rel_path,
            "kind": item.file.kind,
            "rank": item.result.rank,
            "host": item.result.host,
            "status": item.result.status,
            "message": item.result.message,
            "size_bytes": item.file.size_bytes,
            "parse_ns": item.parse_ns,
        }
        for item in results
    ]
    if not rows:
        return fr.empty("sources")
    return fr.conform("sources", pl.DataFrame(rows, schema=fr.schema("sources")))
