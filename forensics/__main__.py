"""The `forensics` command and `python -m forensics`.

``--version`` alone is answered here, before the command line machinery (typer, rich: about 220 modules) is
imported; everything else goes to :func:`forensics.cli.main`.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from forensics import __version__

        sys.stdout.write(f"forensics {__version__}\n")
        return
    from forensics.base.lazy import imports_without_gc  # not for --version: typing alone is 4 ms

    with imports_without_gc():
        from forensics.cli import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
