"""Run discovery: walk RUN_DIR, decide what every file is by its content, and parse it.

Never follows a symlink out of RUN_DIR and never writes into it. Every file becomes one row of the
``sources`` frame, whatever became of it, so nothing is silently dropped.
"""

from __future__ import annotations

import os
import re
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import polars as pl
from forensics.parsers import registry, sniff
from forensics.parsers.common import ParseContext, ParseResult, read_head, read_tail

from forensics import frames as fr

HEAD_BYTES = 1 << 20
TAIL_BYTES = 1 << 20
# Parse in worker processes only when there is enough work to pay for their start-up.
PARALLEL_MIN_BYTES = 32 << 20

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


@dataclass
class ParsedSource:
    file: DiscoveredFile
    result: ParseResult
    parse_ns: int


ProgressFn = Callable[[str, int, int], None]


def walk(run_dir: Path) -> list[tuple[Path, str, str | None]]:
    """(absolute path, relative path, reason-if-not-followed) for every file below ``run_dir``."""
    root = run_dir.resolve()
    found: list[tuple[Path, str, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in list(dirnames):
            if (base / name).is_symlink():
                found.append((base / name, _rel(base / name, root), "symlinked directory: not followed"))
        for name in sorted(filenames):
            path = base / name
            rel = _rel(path, root)
            if path.is_symlink():
                target = Path(os.path.realpath(path))
                if not target.is_relative_to(root):
                    found.append((path, rel, "symlink to a file outside RUN_DIR: not followed"))
                    continue
                if not target.is_file():
                    found.append((path, rel, "dangling symlink"))
                    continue
            found.append((path, rel, None))
    return sorted(found, key=lambda item: item[1])


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
    head, error = read_head(path, HEAD_BYTES)
    if error:
        return DiscoveredFile(path, rel_path, "kineto" if name_says_trace else "unknown", size, "failed", error)
    if rel_path.endswith(".nsys-rep") or head.startswith(b"NSYS"):
        return DiscoveredFile(
            path, rel_path, "unknown", size, "ignored",
            "Nsight Systems report: export it with `nsys export --type sqlite` to analyze it",
        )
    if head.startswith(sniff.SQLITE_MAGIC):
        # A binary container: the text sniffers' regexes would only scan (slowly) binary pages.
        # The nsys parser tells an Nsight Systems export from any other SQLite database.
        return DiscoveredFile(path, rel_path, "nsys", size)
    binary = sniff.is_binary(head)
    if binary:
        return DiscoveredFile(path, rel_path, "unknown", size, "ignored", "binary file of no known format")
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
    """Parse one classified file. Never raises: failures become a failed ParseResult."""
    start = time.perf_counter_ns()
    if file.status is not None:
        result = ParseResult(status=file.status, message=file.message)
    else:
        parser = registry.load_parser(file.kind)
        if parser is None:
            result = ParseResult(status="ignored", message=f"recognised as {file.kind}; no parser for it yet")
        else:
            ctx = ParseContext(run_dir=run_dir, rel_path=file.rel_path)
            try:
                result = parser(file.path, ctx)
            except MemoryError:
                result = ParseResult.failed("out of memory while parsing")
            except Exception as exc:  # a parser bug must not take the whole analysis down
                where = traceback.extract_tb(exc.__traceback__)[-1]
                result = ParseResult.failed(
                    f"internal parser error (please report): {type(exc).__name__}: {exc} "
                    f"at {Path(where.filename).name}:{where.lineno}"
                )
    return ParsedSource(file, result, time.perf_counter_ns() - start)


def _parse_worker(args: tuple[DiscoveredFile, Path]) -> ParsedSource:
    return parse_one(*args)


def discover_and_parse(
    run_dir: Path,
    progress: ProgressFn | None = None,
    workers: int | None = None,
) -> list[ParsedSource]:
    """Classify and parse every file below ``run_dir``; results in path order."""
    files: list[DiscoveredFile] = []
    for path, rel, reason in walk(run_dir):
        if reason:
            size = 0 if not path.exists() else path.lstat().st_size
            files.append(DiscoveredFile(path, rel, "unknown", size, "ignored", reason))
        else:
            try:
                files.append(classify(path, rel))
            except OSError as exc:
                files.append(DiscoveredFile(path, rel, "unknown", 0, "failed", f"unreadable: {exc.strerror or exc}"))
    to_parse = [f for f in files if f.status is None]
    total_bytes = sum(f.size_bytes for f in to_parse)
    n_workers = workers if workers is not None else min(os.cpu_count() or 1, len(to_parse))
    results: list[ParsedSource] = []
    done = 0

    def tick(item: ParsedSource) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(item.file.rel_path, done, len(files))

    if n_workers > 1 and len(to_parse) > 1 and total_bytes >= PARALLEL_MIN_BYTES:
        # spawn, not fork: Polars' thread pool does not survive fork.
        with ProcessPoolExecutor(max_workers=n_workers, mp_context=get_context("spawn")) as pool:
            for item in pool.map(_parse_worker, [(f, run_dir) for f in files], chunksize=1):
                results.append(item)
                tick(item)
    else:
        for f in files:
            item = parse_one(f, run_dir)
            results.append(item)
            tick(item)
    _reject_duplicate_ranks(results)
    return results


def _reject_duplicate_ranks(results: Iterable[ParsedSource]) -> None:
    """Two trace files claiming the same rank: the later one (in path order) is failed, not merged."""
    owner: dict[int, str] = {}
    for item in results:
        res = item.result
        if item.file.kind not in ("kineto", "nsys") or res.status not in ("ok", "partial") or res.rank is None:
            continue
        first = owner.setdefault(res.rank, item.file.rel_path)
        if first != item.file.rel_path:
            item.result = ParseResult(
                status="failed",
                message=f"rank {res.rank} is already claimed by {first}; this file was not used",
                rank=res.rank,
                host=res.host,
            )


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
