"""Which folders under the triage roots are jobs, and a fingerprint of each job's files.

The rule (docs/triage.md): jobs are the folders ``depth`` levels below each root. The default follows
how people call it: one root is a folder of jobs (depth 1: ``forensics triage fleet/``), several roots
are the jobs themselves (depth 0: ``forensics triage runs/*/``); nested layouts name the depth
(``fleet/<date>/<job>/``: ``--job-depth 2``). Everything below a job folder belongs to that job (per-rank,
per-host, ``profiler/`` and ``logs/`` subfolders): which folder holds the sources directly cannot tell a
job's parts from a day's jobs, so it is not used. A folder at job depth is a job when a source lies
somewhere below it: a regular file that content sniffing recognises as a trace or a log
(:func:`forensics.parsers.discovery.classify`), stopping at the first one recognised.

Symlinked folders are followed after the real folders, and only when their target lies inside one of
the roots; a target reached before (a loop, or a second link to one job) is analysed once. Every folder
or file that is neither a job nor inside one is listed as skipped, with the reason.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from forensics.base.errors import UsageError
from forensics.parsers.discovery import classify, walk


@dataclass(frozen=True)
class JobRef:
    job_id: str
    """The job's path relative to its root (the root's name first when there are several roots); also
    the folder of its reports under OUT/jobs/."""
    path: str
    """Absolute path of the job folder as reached (a symlink is kept, not resolved)."""


@dataclass(frozen=True)
class SkippedPath:
    path: str
    reason: str


@dataclass
class Discovery:
    jobs: list[JobRef] = field(default_factory=list)
    skipped: list[SkippedPath] = field(default_factory=list)


@dataclass
class _Walk:
    real_roots: list[Path]
    labels: list[str]
    depth: int
    found: Discovery = field(default_factory=Discovery)
    visited: dict[str, str] = field(default_factory=dict)  # real path -> the path it was first reached by
    job_reals: list[Path] = field(default_factory=list)
    links: list[tuple[Path, int, str]] = field(default_factory=list)  # deferred symlinked folders

    def skip(self, path: Path | str, reason: str) -> None:
        self.found.skipped.append(SkippedPath(str(path), reason))


def find_jobs(roots: list[Path], depth: int | None = None) -> Discovery:
    """Jobs under ``roots`` in a stable order (root, then path), and everything skipped, with why."""
    for r in roots:
        if not r.is_dir():
            raise UsageError(f"{r}: no such directory")
    level = depth if depth is not None else (1 if len(roots) == 1 else 0)
    walk = _Walk([r.resolve() for r in roots], _labels(roots, level), level)
    for i, root in enumerate(roots):
        _visit(walk, Path(os.path.abspath(root)), i, "")
    while walk.links:  # after every real folder: a real path wins over a link to it
        link, i, rel = walk.links.pop(0)
        why = _why_not_follow(walk, link, Path(os.path.realpath(link)))
        if why:
            walk.skip(link, why)
        else:
            _visit(walk, link, i, rel)
    if not walk.found.jobs:
        why = "; ".join(f"{s.path}: {s.reason}" for s in walk.found.skipped[:5])
        raise UsageError(f"no job found {level} folder level(s) below {', '.join(map(str, roots))} "
                         f"(a job is a folder holding a trace or log; see --job-depth): {why}")
    return walk.found


def _labels(roots: list[Path], level: int) -> list[str]:
    """The root's name prefixes job ids when there are several roots or the roots are the jobs (made
    unique with -2, -3...)."""
    if len(roots) == 1 and level > 0:
        return [""]
    labels: list[str] = []
    for r in roots:
        base = Path(os.path.abspath(r)).name or "root"
        label, n = base, 1
        while label in labels:
            n += 1
            label = f"{base}-{n}"
        labels.append(label)
    return labels


def _visit(walk: _Walk, path: Path, i: int, rel: str) -> None:
    """A folder ``rel`` below root ``i``: a job at job depth, else a folder of jobs to walk into."""
    real = os.path.realpath(path)
    if real in walk.visited:
        walk.skip(path, f"the same folder as {walk.visited[real]}, reached already: analysed once")
        return
    walk.visited[real] = str(path)
    level = len(rel.split("/")) if rel else 0
    if level == walk.depth:
        if _source_below(path):
            walk.found.jobs.append(JobRef("/".join(p for p in (walk.labels[i], rel) if p), str(path)))
            walk.job_reals.append(Path(real))
        else:
            walk.skip(path, "no trace or log in it or below it")
        return
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        walk.skip(path, f"unreadable folder: {exc.strerror or exc}")
        return
    for e in entries:
        sub_rel = f"{rel}/{e.name}" if rel else e.name
        if e.is_symlink() and (os.path.isdir(e.path) or not os.path.exists(e.path)):
            walk.links.append((Path(e.path), i, sub_rel))  # a dangling one is reported there
        elif e.is_dir(follow_symlinks=False):
            _visit(walk, Path(e.path), i, sub_rel)
        else:
            walk.skip(e.path, f"a file above the job folders (job depth {walk.depth}): not read")


def _source_below(path: Path) -> bool:
    """Whether a trace or log lies in ``path`` or below it (regular files, as analysis walks them:
    symlinked folders not followed); stops at the first one recognised, shallowest folders first."""
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        rel = base.relative_to(path).as_posix()
        for name in sorted(filenames):
            f = base / name
            if f.is_symlink() or not f.is_file():
                continue
            try:
                kind = classify(f, name if rel == "." else f"{rel}/{name}").kind
            except OSError:
                continue
            if kind != "unknown":  # a broken trace (empty, truncated) still makes a job: it fails with a reason
                return True
    return False


def _why_not_follow(walk: _Walk, link: Path, real: Path) -> str | None:
    if not real.is_dir():
        return "symlink whose target is gone (or a loop of links)"
    if not any(real == r or real.is_relative_to(r) for r in walk.real_roots):
        return f"symlink to a folder outside the given roots ({real}): not followed"
    if Path(os.path.realpath(link.parent)).is_relative_to(real):
        return f"symlink loop: points to its own parent folder {real}"
    inside = next((j for j in walk.job_reals if real != j and real.is_relative_to(j)), None)
    if inside is not None:
        return f"symlink into the job folder {walk.visited.get(str(inside), inside)}: analysed as part of that job"
    if str(real) in walk.visited:
        return f"symlink to {walk.visited[str(real)]}, reached already: analysed once"
    return None


def fingerprint(path: Path) -> str:
    """Hash of every file's relative path, size and modification time (ns), as analysis walks them.

    Metadata, not content: a stat per file costs microseconds where digesting would read every byte of
    every trace on every run (as much I/O as the analysis). A rewrite that keeps both size and mtime
    (e.g. ``touch -r``) goes unnoticed: ``--rebuild`` covers it.
    """
    h = hashlib.blake2b(digest_size=16)
    for p, rel, reason in walk(path):
        if reason:
            line = f"{rel}\0!{reason}"
        else:
            try:
                st = p.stat()
                line = f"{rel}\0{st.st_size}\0{st.st_mtime_ns}"
            except OSError as exc:
                line = f"{rel}\0?{exc.errno}"
        h.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()
