"""Content sniffing on long lines: the CPU time of classifying each of tests/test_discovery.py's LONG_LINES
inputs (1 MB one-line documents), which must stay linear (the old NCCL-line regex took 8.6 s on 100 KB of
compact JSON). Prints one line per input.

    python benchmarks/sniff_bench.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forensics.parsers.discovery import classify  # noqa: E402

from tests.test_discovery import LONG_LINES  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in LONG_LINES.items():
            path = Path(tmp) / name
            path.write_bytes(data)
            start = time.process_time()
            kind = classify(path, name).kind
            print(f"{name:14s} {len(data) / 2**20:5.2f} MB  {kind:8s} {time.process_time() - start:7.3f} s CPU")


if __name__ == "__main__":
    main()
