"""An independent reading of a Kineto trace's steps on the GPU timeline, for tests (plain json, no forensics code).

Rules, written from the definition rather than from the code under test: a GPU event (kernel, memcpy,
memset) belongs to the ``ProfilerStep#N`` whose CPU range began last before the runtime call that launched
it (same ``correlation``); an event with no launch in the trace belongs to no step. Step N's window starts
at min(its first event's start, max(its CPU start, end of the events of earlier steps, and of unattributed
events that started before the rank's first attributed event)); it ends at the next step's window start,
the last one at max(its last event's end, its CPU end). Times in ns (trace µs x 1000, rounded).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
LAUNCH = re.compile(r"(?i)launch|memcpy|memset")
STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class GpuEvent:
    name: str
    cat: str
    start: int
    end: int
    step: int | None

    @property
    def is_comm(self) -> bool:
        return "nccl" in self.name.lower()

    @property
    def is_compute(self) -> bool:
        return self.cat.lower() == "kernel" and not self.is_comm


def _ns(us: float | int) -> int:
    # epoch µs as floats exceed a double's exact integers once multiplied: split off the whole µs first
    whole = int(us)
    return whole * 1000 + round((float(us) - whole) * 1000)


def union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in union(iv))


def clip(iv: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(s, lo), min(e, hi)) for s, e in iv if min(e, hi) > max(s, lo)]


def minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """|a \\ b| for interval lists."""
    return length(a) - length(clip_all(union(a), union(b)))


def clip_all(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [x for s, e in b for x in clip(a, s, e)]


@dataclass
class TraceSteps:
    steps: dict[int, tuple[int, int]]  # step -> CPU (start, end)
    events: list[GpuEvent]
    windows: dict[int, tuple[int, int]]  # step -> GPU window (start, end)

    def in_window(self, step: int, pred) -> list[tuple[int, int]]:
        lo, hi = self.windows[step]
        return clip([(e.start, e.end) for e in self.events if pred(e)], lo, hi)

    def idle_ns(self, step: int) -> int:
        lo, hi = self.windows[step]
        return hi - lo - length(self.in_window(step, lambda e: True))

    def exposed_comm_ns(self, step: int) -> int:
        """NCCL kernel time in the window with no compute kernel running."""
        return minus(self.in_window(step, lambda e: e.is_comm), self.in_window(step, lambda e: e.is_compute))


def read(path: Path) -> TraceSteps:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps: dict[int, tuple[int, int]] = {}
    launch: dict[int, int] = {}
    gpu = []
    for e in events:
        if e.get("ph") != "X":
            continue
        m = STEP.match(str(e.get("name", "")))
        if m and e.get("cat") in ("cpu_op", "user_annotation", "Operator"):
            steps[int(m.group(1))] = (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and LAUNCH.search(e["name"]):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch[int(corr)] = min(launch.get(int(corr), 1 << 62), _ns(e["ts"]))
        elif e.get("cat") in GPU_CATS:
            gpu.append(e)
    order = sorted(steps, key=lambda s: steps[s][0])
    out = []
    for e in gpu:
        t = launch.get(int((e.get("args") or {}).get("correlation", -1)))
        before = [s for s in order if t is not None and steps[s][0] <= t]
        out.append(GpuEvent(e["name"], e["cat"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]),
                            before[-1] if before else None))
    return TraceSteps(steps, out, _windows(steps, order, out))


def _windows(steps: dict[int, tuple[int, int]], order: list[int], ev: list[GpuEvent]) -> dict[int, tuple[int, int]]:
    own = [e for e in ev if e.step is not None]
    first_own = min(e.start for e in own)
    prev_end = max([e.end for e in ev if e.step is None and e.start < first_own], default=None)
    starts: dict[int, int] = {}
    last: dict[int, int | None] = {}
    for s in order:
        mine = [e for e in own if e.step == s]
        cand = steps[s][0] if prev_end is None else max(steps[s][0], prev_end)
        w = min([cand] + [e.start for e in mine])
        starts[s] = max([w] + list(starts.values()))
        last[s] = max((e.end for e in mine), default=None)
        if last[s] is not None:
            prev_end = last[s] if prev_end is None else max(prev_end, last[s])
    out = {}
    for i, s in enumerate(order):
        end = starts[order[i + 1]] if i + 1 < len(order) else max(steps[s][1], last[s] or steps[s][1])
        out[s] = (starts[s], end)
    return out
