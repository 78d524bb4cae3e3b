"""What the pyarrow readers share (``read_parquet``, ``read_csv``, ``read_jsonl(batches=n)``).

pyarrow's readers are synchronous, so every step of one (opening, reading the next
batch, cutting it, closing) runs in the loop's default thread pool, one at a time: the
loop is never blocked, and a reader closed early waits for the step in flight before it
closes the file (at most one block read).

Batches are re-cut to exactly ``n`` rows (the last of a file may be shorter), at rows
``0, n, 2n, ...`` of the file whatever the sizes of pyarrow's blocks: cutting is a zero-copy
slice, and joining the ends of two blocks one copy of one batch. So a reader's position
is its file and a row: after ``k`` items it is at row ``start + k * n`` (``k`` for row
dicts), and a resumed reader opens the file again and leaves out the rows before
(Parquet from the row group holding that row; CSV and JSON by reading past them in
pyarrow's C++ parser), cutting the same batches as the interrupted one. This holds for
URLs and compressed files too.

A file pyarrow cannot parse (``ArrowInvalid``, or an ``OSError`` without an errno)
raises ``BadInput`` naming it, with pyarrow's error as the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.run import CHUNK_MAX, ChunkIter, Ctx, Node, aclosing
from aioflow.errors import BadInput, PipelineError, StateMismatch
from aioflow.io._streams import bad_input, is_url, local_path, reader
from aioflow.io.remote import open_url_sync

__all__ = [
    "Opened",
    "arrow_compression",
    "check_rows",
    "named",
    "open_bytes",
    "pyarrow",
    "table_reader",
]

#: What a format's opener gives for a start row (and, for a URL, the file the run opened
#: on its own file system, which it then owns): pyarrow's batches from some row at or
#: before it, how many rows of them to leave out, and how to close what it opened.
Opened = tuple[Iterator[Any], int, Callable[[], None]]


def pyarrow(module: str, what: str) -> Any:
    """``pyarrow.<module>``, or an ImportError saying which extra installs it."""
    try:
        return importlib.import_module(f"pyarrow.{module}" if module else "pyarrow")
    except ImportError as e:
        raise ImportError(f"{what} needs pyarrow: pip install 'aioflow[parquet]'") from e


def check_rows(batches: Any, what: str) -> int | None:
    """``batches=n`` of a reader: rows per batch, or None (row dicts)."""
    if batches is None:
        return None
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise PipelineError(f"{what}: batches must be a positive int or None, got {batches!r}")
    return batches


def arrow_compression(compression_type: str | None, what: str) -> str | None:
    """tf.data's ``compression_type`` as pyarrow's codec name ("GZIP" -> "gzip")."""
    if not compression_type:
        return None
    if str(compression_type).upper() == "GZIP":
        return "gzip"
    raise PipelineError(
        f'{what}: compression_type must be None or "GZIP" here, got {compression_type!r}'
    )


@contextlib.contextmanager
def named(path: str, what: str) -> Iterator[None]:
    """Turn pyarrow's "cannot parse this" into ``BadInput`` naming ``path``."""
    try:
        yield
    except Exception as e:
        invalid = type(e).__name__ == "ArrowInvalid" or (type(e) is OSError and e.errno is None)
        if not invalid:
            raise  # a missing file, a permission: as they are
        raise bad_input(None, path, f"{what}: {e}") from e


def open_bytes(path: str, compression: str | None, raw: Any) -> tuple[Any, Callable[[], None]]:
    """A pyarrow input stream of the file's bytes (``raw``: a URL's file, as the run
    opened it), and its closer, which closes ``raw`` too."""
    pa = pyarrow("", "reading with pyarrow")
    source: Any = None
    try:
        source = pa.PythonFile(raw, mode="r") if raw is not None else pa.OSFile(local_path(path))
        stream = pa.input_stream(source, compression=compression)
    except BaseException:
        if source is not None:
            source.close()
        if raw is not None:
            raw.close()
        raise

    def close() -> None:
        stream.close()
        source.close()
        if raw is not None:
            raw.close()

    return stream, close


class _Cutter:
    """The sync side: the opened batches, re-cut to ``size`` rows (None: row dicts)."""

    def __init__(
        self,
        opener: Callable[[int, Any], Opened],
        row: int,
        size: int | None,
        path: str,
        what: str,
        raw: Any,
    ) -> None:
        self.path, self.what, self.size = path, what, size
        with named(path, what):
            self.it, self.skip, self.close = opener(row, raw)
        self.held: list[Any] = []
        self.nheld = 0

    def step(self) -> list[Any] | None:
        """The next items (never an empty list), None at the end of the file."""
        while True:
            with named(self.path, self.what):
                b = next(self.it, None)
            if b is None:
                if self.size is None or not self.held:
                    return None
                last = self._joined()
                return [last]
            if self.skip:
                if b.num_rows <= self.skip:
                    self.skip -= b.num_rows
                    continue
                b, self.skip = b.slice(self.skip), 0
            out = b.to_pylist() if self.size is None else self._cut(b)
            if out:
                return out

    def _cut(self, b: Any) -> list[Any]:
        n = self.size
        assert n is not None
        out: list[Any] = []
        if self.held:
            need = n - self.nheld
            if b.num_rows < need:
                self.held.append(b)
                self.nheld += b.num_rows
                return out
            self.held.append(b.slice(0, need))
            out.append(self._joined())
            b = b.slice(need)
        full = b.num_rows - b.num_rows % n
        out.extend(b.slice(i, n) for i in range(0, full, n))
        if full < b.num_rows:
            self.held, self.nheld = [b.slice(full)], b.num_rows - full
        return out

    def _joined(self) -> Any:
        held, self.held, self.nheld = self.held, [], 0
        if len(held) == 1:
            return held[0]
        return pyarrow("", "reading with pyarrow").concat_batches(held)


def open_reader(make: Callable[[], Any], row: int, close: Callable[[], None], empty: str) -> Opened:
    """What an opener returns for a pyarrow streaming reader that ``make()`` opens on a
    file's bytes (``close`` closes them): a file without rows (pyarrow's ``ArrowInvalid``
    starting with ``empty``) gives none; ``close`` runs when opening fails."""
    try:
        r = make()
    except Exception as e:
        close()
        if type(e).__name__ == "ArrowInvalid" and str(e).startswith(empty):
            return iter(()), 0, lambda: None  # an empty file has no rows
        raise
    except BaseException:
        close()
        raise
    return iter(r), row, close


def _close_opened(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


def _start_row(ctx: Ctx) -> int:
    st = ctx.resume
    if st is None:
        return 0
    row = st.get("row") if isinstance(st, dict) else None
    if isinstance(row, bool) or not isinstance(row, int) or row < 0:
        raise StateMismatch(f"{ctx.name}: bad state {st!r:.200}")
    return row


def table_reader(
    name: str,
    path: Any,
    opener: Callable[[str], Callable[[int, Any], Opened]],
    size: int | None,
    what: str,
    key: tuple[Any, ...],
) -> Node:
    """The node of a pyarrow reader: ``opener(path)(row, raw)`` opens the file at ``row``
    (``raw``: a URL opened on the run's file system, else None);
    items are batches of ``size`` rows, or row dicts (``size=None``); ``what`` starts the
    message of a ``BadInput`` ("corrupt Parquet file")."""

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        try:
            async with aclosing(_read(p, ctx)) as chunks:
                async for c in chunks:
                    yield c
        except BadInput as e:
            e.stage = ctx.name
            raise

    async def _read(p: str, ctx: Ctx) -> ChunkIter:
        row = _start_row(ctx)
        per = 1 if size is None else size
        ctx.seeker(lambda k: {"row": row + k * per})
        loop = asyncio.get_running_loop()
        raw = await open_url_sync(p, ctx) if is_url(p) else None
        opening = loop.run_in_executor(None, _Cutter, opener(p), row, size, p, what, raw)
        try:
            # shielded: if we are cancelled, the opening goes on and is closed when done
            r: _Cutter = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_opened)  # it may still open: close it then
            raise
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                pending = loop.run_in_executor(None, r.step)
                got = await asyncio.shield(pending)
                if got is None:
                    return
                for i in range(0, len(got), CHUNK_MAX):
                    yield got[i : i + CHUNK_MAX]
        finally:
            if pending is not None and not pending.done():
                try:  # never close the file under a running read
                    await asyncio.wait([pending])
                except asyncio.CancelledError:
                    pending.add_done_callback(lambda _: r.close())
                    raise
            r.close()

    return reader(name, path, gen, key=key)
