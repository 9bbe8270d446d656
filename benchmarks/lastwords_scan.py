"""Cost of reading the job's last words: CPU seconds and peak memory of the last-words parser over synthetic
rank logs (100k NCCL INFO lines with a traceback at the end; 100k progress lines; a 100k-frame recursion
traceback; 64 ranks' tracebacks interleaved). Prints figures; asserts nothing.

    .venv/bin/python benchmarks/lastwords_scan.py
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

from forensics.parsers.lastwords import parse
from forensics.parsers.result import ParseContext

TAIL = "[rank3]: Traceback (most recent call last):\n[rank3]:   File \"/job/train.py\", line 3, in <module>\n" \
       "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.\n"
CASES = {
    "100k NCCL INFO lines + traceback": "".join(f"n1:1:2 [3] NCCL INFO Channel {i % 32:02d}/0 : 3[3] -> 4[4] via "
                                                f"P2P/IPC\n"
                                                for i in range(100_000)) + TAIL,
    "100k progress lines + traceback": "".join(f" iteration {i:8d}/ 100000 | lm loss: 2.5E+00 |\n"
                                               for i in range(100_000)) + TAIL,
    "100k-frame recursion traceback": "Traceback (most recent call last):\n"
    + "  File \"/job/r.py\", line 3, in r\n    r()\n"
                                      * 100_000 + "RecursionError: maximum recursion depth exceeded\n",
    "64 ranks interleaved x 1k frames": "".join(f"[rank{r}]: Traceback (most recent call last):\n" for r in range(64))
                                        + "".join(f"[rank{r}]:   File \"/job/t.py\", line {i}, in f\n"
                                                  for i in range(1000)
                                                  for r in range(64)),
}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in CASES.items():
            path = Path(tmp) / "rank3.log"
            path.write_text(text)
            start = time.process_time()
            res = parse(path, ParseContext(Path(tmp), "rank3.log"))
            cpu = time.process_time() - start
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{name:38s} {len(text) / 1e6:6.1f} MB  {cpu:6.2f} CPU s  peak RSS so far {rss:6.0f} MB  "
                  f"{res.status}: {res.message}")


if __name__ == "__main__":
    main()
