"""The `forensics` command and `python -m forensics`.

``--version`` alone is answered here, before the command line machinery (typer, rich: about 220 modules) is
imported; everything else goes to :func:`forensics.cli.main`.
"""

from __future__ import annotations

import gc
import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from forensics import __version__

        sys.stdout.write(f"forensics {__version__}\n")
        return
    # Start-up creates about 200,000 objects that live as long as the process (modules, classes, functions); the
    # cyclic collector would scan them again and again while they are created (docs/performance.md, tenth pass).
    gc.disable()
    try:
        from forensics.cli import main as cli_main
    finally:
        gc.freeze()  # what exists now is never collected: later collections skip it
        gc.enable()
    cli_main()


if __name__ == "__main__":
    main()
