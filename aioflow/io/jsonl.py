"""``read_jsonl``: the values of a JSON Lines file, or record batches of its objects.

By default each line is parsed by ``json.loads``, a block of lines at a time (the text
machinery of ``files``: blocks split at newlines, resuming at a block's byte offset).
With ``batches=n`` the file is parsed by pyarrow's streaming JSON reader
(``pyarrow.json.open_json``) in C++, with no Python object per row, and read through
``tables`` (a thread-pool step at a time, batches of exactly ``n`` rows, resuming at a row).
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.base import pipeline_of
from aioflow._core.run import ChunkIter, Ctx
from aioflow._state.logs import SeekLog
from aioflow.errors import PipelineError
from aioflow.io._streams import bad_input, check_compression, is_url, reader
from aioflow.io.files import _check_encoding, _line_blocks, _Undecodable, chunked
from aioflow.io.tables import (
    Opened,
    arrow_compression,
    check_rows,
    open_bytes,
    open_reader,
    pyarrow,
    table_reader,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["read_jsonl"]

BLOCK = 4 << 20  # bytes pyarrow parses at a time: a line must fit in one


def _opener(path: str, compression: str | None) -> Callable[[int, Any], Opened]:
    def open_at(row: int, raw: Any) -> Opened:
        pj = pyarrow("json", "read_jsonl(batches=n)")
        stream, close = open_bytes(path, compression, raw)
        return open_reader(
            lambda: pj.open_json(stream, read_options=pj.ReadOptions(block_size=BLOCK)),
            row,
            close,
            "Empty JSON stream",
        )

    return open_at


def _batches(
    path: str | os.PathLike[str],
    size: int,
    encoding: str,
    compression_type: str | None,
    on_error: str | int,
) -> Pipeline[Any]:
    if codecs.lookup(encoding).name != "utf-8":
        raise PipelineError(f"read_jsonl(batches=n) reads UTF-8 only, got encoding={encoding!r}")
    if on_error != "raise":
        raise PipelineError(
            "read_jsonl(batches=n) cannot skip bad lines (pyarrow parses blocks, not lines):"
            f" on_error must be 'raise', got {on_error!r}"
        )
    comp = arrow_compression(compression_type, "read_jsonl(batches=n)")

    def opener(p: str) -> Callable[[int, Any], Opened]:
        return _opener(p, comp)

    key = ("batches", size, comp)
    return pipeline_of(
        table_reader("read_jsonl", path, opener, size, "malformed JSON Lines file", key)
    )


def read_jsonl(
    path: str | os.PathLike[str],
    *,
    encoding: str = "utf-8",
    compression_type: str | None = None,
    on_error: str | int = "raise",
    batches: int | None = None,
) -> Pipeline[Any]:
    """The JSON values of a JSON Lines file, one per line (blank lines skipped).

    A line that is not JSON raises ``af.BadInput`` (a ``ValueError``) naming
    ``path:line``, with the ``json.JSONDecodeError`` as its cause; with
    ``on_error="skip"`` such lines are skipped, counted in the stage's stats and logged
    once, and every good line still arrives. ``compression_type`` and ``encoding``
    (``"utf-8-sig"`` for a file that starts with a BOM): as in ``read_lines``.

    ``batches=n`` yields ``pyarrow.RecordBatch``es of ``n`` rows (the last one shorter)
    of a file whose lines are JSON objects, parsed by pyarrow's JSON reader with no
    Python object per row: the objects' keys are the columns (a missing key is null), and
    the column types are inferred from the file's first 4 MiB (a later value that does
    not fit raises ``af.BadInput``, as a malformed line does). It reads UTF-8, and
    ``compression_type`` None or "GZIP"; bad lines cannot be skipped.

    Example:
        >>> import pathlib, tempfile, aioflow as af
        >>> path = pathlib.Path(tempfile.mkdtemp(), "a.jsonl")
        >>> _ = path.write_text('{"a": 1}\\n\\n[2, 3]\\n')
        >>> af.read_jsonl(path).to_list()
        [{'a': 1}, [2, 3]]
        >>> _ = path.write_text('{"a": 1}\\n{"a": 2, "b": "x"}\\n{"a": 3}\\n')
        >>> [b.to_pydict() for b in af.read_jsonl(path, batches=2)]
        [{'a': [1, 2], 'b': [None, 'x']}, {'a': [3], 'b': [None]}]
    """
    size = check_rows(batches, "read_jsonl")
    if size is not None:
        return _batches(path, size, encoding, compression_type, on_error)
    _check_encoding(encoding)
    comp = check_compression(compression_type)
    loads = json.loads

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        log = SeekLog(ctx, comp is None and not is_url(p), offset=0, line=1)
        async for lineno, lines, bad in _line_blocks(p, ctx, encoding, comp, log):
            if not bad:
                try:
                    objs = [loads(s) for s in lines if s and not s.isspace()]
                except ValueError:
                    objs = None  # find the bad line(s) on the slow path below
                if objs is not None:
                    for c in chunked(log.drop(objs)):
                        yield c
                    continue
            out: list[Any] = []
            for i, s in enumerate(lines):
                exc: Exception
                if isinstance(s, _Undecodable):
                    exc = s.exc
                elif not s or s.isspace():
                    continue
                else:
                    try:
                        out.append(loads(s))
                        continue
                    except ValueError as e:
                        exc = e
                err = bad_input(ctx, p, f"malformed JSON line: {exc}", line=lineno + i)
                if policy.skip(err, ctx, lineno + i - 1):
                    continue
                for c in chunked(log.drop(out)):
                    yield c
                raise err from exc
            for c in chunked(log.drop(out)):
                yield c

    return pipeline_of(reader("read_jsonl", path, gen, on_error=on_error, key=(encoding, comp)))
