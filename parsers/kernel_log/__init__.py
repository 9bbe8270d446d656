"""Kernel logs (dmesg, journalctl -k, syslog, /dev/kmsg, fabric-manager log) -> ``kernel_events``.

Every timestamp style of docs/gpu_health.md is recognised: monotonic ``[  123.456]`` (with an optional
``[T123]`` caller), ``dmesg -T`` ctime (any locale: whatever ends in ``HH:MM:SS YYYY``), ``dmesg -H``
absolute + ``[+delta]`` lines, ``--time-format iso``, syslog without a year, journalctl short /
short-iso / short-full / short-monotonic, raw ``/dev/kmsg``, talosctl, fabric-manager
``[Mon DD YYYY HH:MM:SS]``. Wrapper prefixes (grep file name, ``host:`` from pdsh/clush/srun -l, AWS
alert text, syslogd wall broadcasts, ``==> file <==`` headers) are peeled off repeatedly, so several
nodes concatenated in one file keep their hosts. A line that starts with 2+ spaces and carries no
stamp continues the previous record.

Times: ``mono_ns`` is what the line says; ``wall_ns`` only when the log lets us place the record on
the wall clock (an absolute stamp, or a monotonic stamp whose boot time is derived from lines that
carry both a wall and a monotonic stamp on the same host and boot). Nothing is guessed beyond the
year of year-less syslog stamps (taken from the file's own absolute stamps, else its mtime).
"""

from __future__ import annotations

from forensics.parsers.kernel_log.batch import KernelLogBatch, parse, parse_text

__all__ = ["KernelLogBatch", "parse", "parse_text"]
