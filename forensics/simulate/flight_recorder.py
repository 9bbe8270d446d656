"""Flight Recorder dumps of a hung Megatron-style job (TP x PP x DP), with the truth of who is stuck where.

Each scenario sets every rank's per-group counters at the moment of the dump and writes one dump per rank, in
the layout PyTorch uses: process groups created in the same order on every rank (``default_pg``, then the tensor,
pipeline and data parallel groups), group names handed out globally and ids (``pg_id``) per rank. Scenarios:

* ``gpu_error``: one rank's GPU stops completing work (device-stuck);
* ``host_stuck``: one rank's CPU thread stops issuing collectives (nothing of its own pending);
* ``two_groups``: a device-stuck rank in one tensor-parallel group and a host-stuck rank in another;
* ``size_mismatch``: one rank issues a data-parallel all-reduce of another size than its peers;
* ``pipeline_behind``: no hang; the pipeline stages are merely behind each other (nobody to blame);
* ``missing_dump``: ``host_stuck`` with the culprit's dump missing (the verdict must say it cannot decide).

Formats: ``pickle`` (the torch pickler's bytes, :mod:`forensics.simulate.fr_pickle`) or ``json`` (``dump_json``:
counters and ranks as strings, 0 for unseen times, ``process_group`` a list, no ``entries`` key when empty).
Versions: ``1.1`` (``seq_id``, no ``pg_config`` / ``pg_status``: the counters come from the entries), ``2.2``,
``2.9`` (nvidia-resiliency-ext's: ``nccl_version``, ``thread_name``, only active entries), ``2.10``
(``comm_lib_version``, ``duration_ms``). ``stacks`` adds ``frames`` to every entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from forensics.simulate.fr_pickle import dumps

SCENARIOS = ("gpu_error", "host_stuck", "two_groups", "size_mismatch", "pipeline_behind", "missing_dump")
VERSIONS = ("1.1", "2.2", "2.9", "2.10")
SUMMARIES = {
    "gpu_error": "Flight Recorder dumps of a hang: one rank's GPU stops completing work (device-stuck)",
    "host_stuck": "Flight Recorder dumps of a hang: one rank stops issuing collectives (host-stuck)",
    "two_groups": "Flight Recorder dumps: a device-stuck rank in one TP group, a host-stuck one in another",
    "size_mismatch": "Flight Recorder dumps: one rank's data-parallel all-reduce has another size",
    "pipeline_behind": "Flight Recorder dumps, no hang: pipeline stages merely behind each other (no blame)",
    "missing_dump": "Flight Recorder dumps of a host-stuck hang with the culprit's dump missing (undecided)",
}
EPOCH_NS = 1_760_000_000_000_000_000
TIMEOUT_MS = 600_000
_BASE = {"default": 50, "TP": 4000, "PP": 900, "DP": 300}
_OPS = {"default": "barrier", "TP": "_all_gather_base", "PP": "all_reduce", "DP": "all_reduce"}
_DESC = {"default": "default_pg", "TP": "TENSOR_MODEL_PARALLEL_GROUP", "PP": "PIPELINE_MODEL_PARALLEL_GROUP",
         "DP": "DATA_PARALLEL_GROUP"}
_STACK_FWD = [{"name": "all_gather_into_tensor", "filename": "torch/distributed/distributed_c10d.py", "line": 3800},
              {"name": "forward", "filename": "megatron/core/tensor_parallel/layers.py", "line": 512},
              {"name": "train_step", "filename": "pretrain_gpt.py", "line": 210}]
_STACK_BWD = [{"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2501},
              {"name": "finish_grad_sync", "filename": "megatron/core/distributed/distributed_data_parallel.py",
               "line": 330},
              {"name": "train_step", "filename": "pretrain_gpt.py", "line": 231}]


@dataclass
class _Group:
    name: str
    kind: str
    ranks: list[int]
    enq: dict[int, int] = field(default_factory=dict)
    comp: dict[int, int] = field(default_factory=dict)
    sizes: dict[int, list[list[int]]] = field(default_factory=dict)


def layout(world: int, tp: int = 2, pp: int = 2) -> list[_Group]:
    """The job's groups in creation order (Megatron: tensor, pipeline, then data parallel)."""
    dp = world // (tp * pp)
    groups = [_Group("0", "default", list(range(world)))]
    rank = lambda t, d, p: p * tp * dp + d * tp + t  # noqa: E731 - Megatron order: tp fastest, then dp, then pp
    groups += [_Group("", "TP", [rank(t, d, p) for t in range(tp)]) for p in range(pp) for d in range(dp)]
    groups += [_Group("", "PP", [rank(t, d, p) for p in range(pp)]) for d in range(dp) for t in range(tp)]
    groups += [_Group("", "DP", [rank(t, d, p) for d in range(dp)]) for p in range(pp) for t in range(tp)]
    for i, g in enumerate(groups):
        g.name = str(i)
    return groups


def _healthy(groups: list[_Group], blocked: bool) -> None:
    """Everyone at the same place: each group blocked in its next collective (or all complete); pipeline
    stages behind each other by two per stage (by design)."""
    for g in groups:
        base = _BASE[g.kind]
        for pos, r in enumerate(g.ranks):
            lag = 2 * pos if g.kind == "PP" else 0
            g.enq[r] = base - lag
            g.comp[r] = base - lag - (1 if blocked and g.kind != "PP" else 0)
            g.sizes[r] = [[4096, 5120]]


def healthy(world: int, blocked: bool = True) -> list[_Group]:
    """The groups of a ``world``-rank job with nobody at fault (see :func:`_healthy`)."""
    groups = layout(world)
    _healthy(groups, blocked)
    return groups


def device_stuck(groups: list[_Group], c: int) -> None:
    for g in groups:
        if c in g.ranks and g.kind != "PP":
            g.comp[c] = g.enq[c] - 3


def host_stuck(groups: list[_Group], c: int) -> None:
    for g in groups:
        if c in g.ranks and g.kind != "PP":
            g.enq[c] = g.comp[c] = g.enq[c] - 1


def build(scenario: str, world: int) -> tuple[list[_Group], dict[str, Any]]:
    """The groups' counters and the truth for ``scenario``."""
    groups = healthy(world, blocked=scenario != "pipeline_behind")
    c = world // 2 + 1
    truth: dict[str, Any] = {"device": [], "host": [], "missing_dumps": [], "mismatch": None}
    if scenario == "gpu_error":
        device_stuck(groups, c)
        truth["device"] = [c]
    elif scenario in ("host_stuck", "missing_dump"):
        host_stuck(groups, c)
        truth["host" if scenario == "host_stuck" else "missing_dumps"] = [c]
    elif scenario == "two_groups":
        other = next(r for r in range(world) if not any({r, 1} <= set(g.ranks) for g in groups if g.kind != "default"))
        device_stuck(groups, 1)
        host_stuck(groups, other)
        truth["device"], truth["host"] = [1], [other]
    elif scenario == "size_mismatch":
        dp = next(g for g in groups if g.kind == "DP" and c in g.ranks)
        dp.sizes[c] = [[4096, 2560]]
        truth["mismatch"] = {"kind": "size", "ranks": [c], "pg_name": dp.name}
    elif scenario != "pipeline_behind":
        raise ValueError(f"unknown Flight Recorder scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    return groups, truth


def _entry(g: _Group, pg_id: int, r: int, seq: int, version: str, stacks: bool, record: int) -> dict[str, Any]:
    done = seq <= g.comp[r]
    created = EPOCH_NS + seq * 1_000_000 + record
    e: dict[str, Any] = {"record_id": record, "pg_id": pg_id, "process_group": (g.name, _DESC[g.kind])}
    e["seq_id" if version == "1.1" else "collective_seq_id"] = seq
    if version != "1.1":
        e.update(p2p_seq_id=0, op_id=seq)
    e.update(profiling_name=f"nccl:{_OPS[g.kind]}", time_created_ns=created)
    if version == "2.10" and done:
        e["duration_ms"] = 1.25
    sizes = g.sizes[r] if seq == g.enq[r] else [[4096, 5120]]
    e.update(input_sizes=sizes, output_sizes=sizes)
    if version != "1.1":
        e.update(input_dtypes=["BFloat16"], output_dtypes=["BFloat16"])
    e.update(state="completed" if done else "scheduled", time_discovered_started_ns=created + 1000 if done else None,
             time_discovered_completed_ns=created + 2000 if done else None, retired=done, timeout_ms=TIMEOUT_MS)
    if version in ("2.9", "2.10"):
        e.update(is_p2p=False, thread_name="pt_autograd_0", thread_id=str(140_000_000 + r))
    if stacks:
        e["frames"] = _STACK_FWD if done else _STACK_BWD
    return e


def dump_doc(groups: list[_Group], r: int, version: str, stacks: bool, keep: int = 8) -> dict[str, Any]:
    """Rank ``r``'s dump: its groups' last ``keep`` collectives (only the pending ones for 2.9, `onlyActive`)."""
    mine = [g for g in groups if r in g.ranks]
    entries: list[dict[str, Any]] = []
    for pg_id, g in enumerate(mine):
        first = max(1, g.enq[r] - keep + 1)
        for seq in range(first, g.enq[r] + 1):
            if version == "2.9" and seq <= g.comp[r]:
                continue
            entries.append(_entry(g, pg_id, r, seq, version, stacks, len(entries)))
    entries.sort(key=lambda e: e["time_created_ns"])
    for i, e in enumerate(entries):
        e["record_id"] = 1000 + i
    doc: dict[str, Any] = {"version": version}
    if version != "1.1":
        doc["pg_config"] = {g.name: {"name": g.name, "desc": _DESC[g.kind], "ranks": str(g.ranks)} for g in mine}
        if version == "2.10":
            doc["comm_lib_version"] = "2.27.3"
        elif version == "2.9":
            doc["nccl_version"] = "2.27.3"
        doc["pg_status"] = {str(i): {"last_enqueued_collective": g.enq[r], "last_started_collective": -1,
                                     "last_completed_collective": g.comp[r]} for i, g in enumerate(mine)}
    doc["entries"] = entries
    return doc


def to_json_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as torch's ``dump_json`` writes it: counters and ranks as strings, unseen times 0, lists for
    tuples, no stacks, no ``entries`` key when there are none."""
    out = {k: v for k, v in doc.items() if k != "entries"}
    if "pg_status" in doc:
        out["pg_status"] = {k: {n: str(x) for n, x in v.items()} for k, v in doc["pg_status"].items()}
    entries = []
    for e in doc.get("entries") or []:
        e = {k: v for k, v in e.items() if k != "frames"}
        e["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            if e.get(k) is None and k in e:
                e[k] = 0
        entries.append(e)
    if entries:
        out["entries"] = entries
    return out


def file_name(r: int, fmt: str, version: str, host: str | None) -> str:
    """The name each producer gives the dump of rank ``r``."""
    if version == "2.9" and host is None:
        return f"_dump_{r}" + (".json" if fmt == "json" else "")
    prefix = "comm_lib_trace_rank_" if version == "2.10" else "nccl_trace_rank_"
    return prefix + (f"{host}_" if host else "") + str(r) + (".json" if fmt == "json" else "")


def write(scenario: str, out: Path, *, world: int = 16, fmt: str = "pickle", version: str = "2.9",
          stacks: bool = False, host_names: bool = False) -> dict[str, Any]:
    """Write ``out/fr/<dump per rank>`` and ``out/truth.json``; return the truth."""
    groups, expected = build(scenario, world)
    (out / "fr").mkdir(parents=True, exist_ok=True)
    hosts = [f"node{r // 8:02d}" for r in range(world)]
    written = {}
    for r in range(world):
        if r in expected["missing_dumps"]:
            continue
        doc = dump_doc(groups, r, version, stacks)
        name = file_name(r, fmt, version, hosts[r] if host_names else None)
        data = dumps(doc) if fmt == "pickle" else orjson.dumps(to_json_doc(doc), option=orjson.OPT_INDENT_2)
        (out / "fr" / name).write_bytes(data)
        written[r] = f"fr/{name}"
    truth = {"schema": "forensics-sim-truth/1", "scenario": f"fr_{scenario}", "healthy": scenario == "pipeline_behind",
             "flight_recorder": {"format": fmt, "version": version, "stacks": stacks,
                                 "dumps": {str(r): p for r, p in written.items()}},
             "job": {"world_size": world, "tp": 2, "pp": 2, "dp": world // 4},
             "hosts": {str(r): h for r, h in enumerate(hosts)} if host_names else {},
             "process_groups": [{"pg_name": g.name, "kind": g.kind, "pg_desc": _DESC[g.kind], "ranks": g.ranks}
                                for g in groups],
             "expected": expected}
    (out / "truth.json").write_bytes(orjson.dumps(truth, option=orjson.OPT_INDENT_2) + b"\n")
    return truth
