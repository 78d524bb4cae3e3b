"""Command line: ``python -m aioflow demo`` and ``python -m aioflow bench MODULE:ATTR``."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m aioflow`` (and the ``aioflow`` script).

    Example:
        >>> main(["demo", "--items", "64", "--no-progress"])  # doctest: +SKIP
        0
    """
    ap = argparse.ArgumentParser(prog="python -m aioflow", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a realistic pipeline over data it generates")
    d.add_argument("--items", type=int, default=2000, help="number of samples to generate")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.add_argument("--plot", metavar="FILE", help="draw the per-stage time picture (PNG)")
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        from ._demo import run_demo

        return run_demo(items=args.items, progress=not args.no_progress, plot=args.plot)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
