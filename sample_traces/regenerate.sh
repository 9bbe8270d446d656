#!/bin/sh
# Regenerate every sample run under sample_traces/ with `forensics simulate`.
# Deterministic: the same code and seed give the same files (tests/test_simulator_samples.py checks it).
# Each run folder holds only what a real job leaves behind; its ground truth is NAME.truth.json beside it.
# Usage (from anywhere):  sh sample_traces/regenerate.sh      [PYTHON=/path/to/python]
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

gen() {
    name=$1
    shift
    rm -rf "sample_traces/$name" "sample_traces/$name.truth.json"
    "$PY" -m forensics.cli simulate "$@" --seed 0 --out "sample_traces/$name" --truth "sample_traces/$name.truth.json"
}

# The README demo: 8 ranks on one node, rank 5's GPU computes 15% slower; the others wait for it
# inside their NCCL all-reduce kernels. Per-rank NCCL INFO logs and a (benign) kernel log.
gen ddp_straggler ddp_straggler --ranks 8 --steps 4
# Pipeline parallel (PP=4 x DP=2, 1F1B) with too few micro-batches: bubble (p-1)/(m+p-1) = 60%.
gen pp_small_m pp_small_m --ranks 8 --steps 3
# GPU 4 falls off the bus (Xid 79 in the kernel log); rank 4 never reaches all-reduce SeqNum N,
# the other seven spin in NCCL until the PyTorch watchdog kills them (logs carry the timeout).
gen xid79 xid79 --ranks 8 --steps 3
# Two nodes, NCCL_ALGO=Tree forced on large all-reduces (env echo and TUNING lines in rank 0's log).
gen algo_forced algo_forced --ranks 16 --steps 2 --param layers=4
