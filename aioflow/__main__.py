"""Command line: python -m aioflow demo, and python -m aioflow bench MODULE:ATTR.

``bench`` loads a Pipeline, or a function returning one, from ``MODULE:ATTR`` (MODULE is
a dotted module importable from the current directory, or the path of a ``.py`` file;
ATTR may be dotted), runs it with ``af.bench`` and prints items/s, time to first item and
the per-stage stats table; ``--plot`` draws the stats, ``--trace`` writes the run as a
timeline (``RunStats.trace``). ``demo`` runs a realistic pipeline over a dataset it writes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any

import cloudpickle

from aioflow._bench import bench
from aioflow._demo import run_demo
from aioflow.errors import PipelineError
from aioflow.pipeline import Pipeline

__all__ = ["load_pipeline", "main"]


class UsageError(Exception):
    """A command-line argument that cannot be used (printed, exit status 2)."""


def _load_module(spec: str) -> Any:
    if spec.endswith(".py") or os.sep in spec or (os.altsep and os.altsep in spec):
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise UsageError(f"no such file: {spec}")
        name = "_aioflow_bench_" + os.path.splitext(os.path.basename(path))[0]
        mspec = importlib.util.spec_from_file_location(name, path)
        if mspec is None or mspec.loader is None:  # pragma: no cover - not a Python file
            raise UsageError(f"cannot load {spec} as a Python module")
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        # its own directory first, as when it runs as a script (for its sibling imports)
        sys.path.insert(0, os.path.dirname(path))
        mspec.loader.exec_module(module)
        # worker processes cannot import a module loaded from a path: ship it by value
        cloudpickle.register_pickle_by_value(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name is not None and spec.startswith(e.name):
            raise UsageError(f"no module named {spec!r} (from {os.getcwd()})") from None
        raise


def load_pipeline(target: str) -> Any:
    """The Pipeline named by ``MODULE:ATTR``: the attribute, or what calling it returns.

    Example:
        >>> load_pipeline("aioflow._demo:small_pipeline")  # doctest: +ELLIPSIS
        <Pipeline range -> ...>
    """
    mod_spec, sep, attr = target.rpartition(":")
    if not sep or not mod_spec or not attr:
        raise UsageError(f"expected MODULE:ATTR (e.g. mypkg.data:train_pipeline), got {target!r}")
    obj = _load_module(mod_spec)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{mod_spec!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Pipeline) and callable(obj):
        obj = obj()
    if not isinstance(obj, Pipeline):
        raise UsageError(
            f"{target} is of type {type(obj).__name__}, not a Pipeline or a function returning one"
        )
    return obj


def _bench(args: argparse.Namespace) -> int:
    p = load_pipeline(args.target)
    r = bench(
        p,
        num_items=args.items,
        seconds=args.seconds,
        warmup=args.warmup,
        progress=not args.no_progress,
    )
    print(r.stats)
    first = "-" if r.first_item_s is None else f"{r.first_item_s:.3f} s"
    print(
        f"{r.items:,} {r.unit} in {r.seconds:.3f} s: {r.items_per_s:,.1f} {r.unit}/s"
        f" (first {r.one} after {first})"
    )
    if args.plot:
        r.stats.plot(args.plot)
        print(f"wrote {args.plot}")
    if args.trace:
        r.stats.trace(args.trace)
        print(f"wrote {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m aioflow`` (and the ``aioflow`` script).

    Example:
        >>> main(["bench", "aioflow._demo:small_pipeline", "--no-progress"])  # doctest: +SKIP
        0
    """
    ap = argparse.ArgumentParser(prog="python -m aioflow", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a realistic pipeline over data it generates")
    d.add_argument("--items", type=int, default=2000, help="images to generate (default 2000)")
    d.add_argument("--workers", type=int, default=2, help="decoding processes (default 2)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.add_argument("--plot", metavar="FILE", help="draw where each stage spends its time (PNG)")
    d.add_argument("--trace", metavar="FILE", help="write the run as a timeline (trace JSON)")
    b = sub.add_parser(
        "bench",
        help="measure how fast a pipeline runs",
        description="Run a Pipeline (or a function returning one) and print items/s, the"
        " time to first item and the per-stage stats.",
    )
    b.add_argument("target", metavar="MODULE:ATTR", help="e.g. mypkg.data:train or train.py:p")
    b.add_argument(
        "--items", type=int, default=None, help="stop after N items (batches, if it yields batches)"
    )
    b.add_argument("--seconds", type=float, default=None, help="stop after S seconds")
    b.add_argument("--warmup", type=int, default=0, help="items (or batches) to read before timing")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--plot", metavar="FILE", help="draw where each stage spends its time (PNG)")
    b.add_argument(
        "--trace", metavar="FILE", help="write the run as a timeline: Chrome trace JSON (Perfetto)"
    )
    args = ap.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        ap.exit(
            2,
            f"{ap.prog} {args.cmd}: error: --plot needs matplotlib: pip install 'aioflow[plot]'\n",
        )
    try:
        if args.cmd == "demo":
            return run_demo(
                items=args.items,
                workers=args.workers,
                progress=not args.no_progress,
                plot=args.plot,
                trace=args.trace,
            )
        return _bench(args)
    except (UsageError, PipelineError) as e:
        ap.exit(2, f"{ap.prog} {args.cmd}: error: {e}\n")
    return 2  # pragma: no cover - ap.exit raised


if __name__ == "__main__":
    sys.exit(main())
