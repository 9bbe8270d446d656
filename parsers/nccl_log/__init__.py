"""NCCL_DEBUG=INFO logs (NCCL 2.4 ... 2.30), PyTorch ProcessGroupNCCL messages, NCCL RAS output and
nccl-tests tables, from files that are mostly training output.

Every line is classified; NCCL-envelope lines whose message is not understood are counted per file
(``nccl_files.nccl_unknown`` and the ParseResult message), never silently dropped. Formats follow
``research/nccl.md`` §A (format strings per release tag).
"""

from __future__ import annotations

from forensics.parsers.nccl_log.batch import NcclBatch, parse

__all__ = ["NcclBatch", "parse"]
