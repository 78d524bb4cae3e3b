"""``read_parquet``: rows or record batches of a Parquet file (extra ``parquet``: pyarrow).

pyarrow's reader is synchronous, so every step of it (opening, reading the next batch,
turning it into rows, closing) runs in the loop's default thread pool, one at a time:
the loop is never blocked, and when the reader is closed early it waits for the step in
flight before closing the file (at most one batch read). A file pyarrow cannot parse
(``ArrowInvalid``, or an ``OSError`` without an errno: a thrift footer or a page that does
not decode) raises ``BadInput`` naming it, with pyarrow's error as the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.base import pipeline_of
from aioflow._core.run import ChunkIter, Ctx, aclosing
from aioflow.errors import BadInput, PipelineError
from aioflow.io._streams import bad_input, is_url, local_path, reader
from aioflow.io.files import chunked
from aioflow.io.remote import open_url_sync

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["read_parquet"]


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("read_parquet needs pyarrow: pip install 'aioflow[parquet]'") from e
    return pq


@contextlib.contextmanager
def _named(path: str) -> Iterator[None]:
    """Turn pyarrow's "cannot parse this" into ``BadInput`` naming ``path``."""
    try:
        yield
    except Exception as e:
        invalid = type(e).__name__ == "ArrowInvalid" or (type(e) is OSError and e.errno is None)
        if not invalid:
            raise  # a missing file, a permission: as they are
        raise bad_input(None, path, f"corrupt Parquet file: {e}") from e


class _ParquetReader:
    """The sync side: a ParquetFile (and the fsspec file under it, for a URL)."""

    def __init__(
        self, path: str, columns: Sequence[str] | None, batch_size: int, raw: Any = None
    ) -> None:
        pq = _pyarrow_parquet()
        self.raw: Any = raw  # a URL's file (remote.open_url_sync), closed with the reader
        source: Any = raw if raw is not None else local_path(path)
        self.path = path
        try:
            with _named(path):
                self.pf = pq.ParquetFile(source)
            self.it = self.pf.iter_batches(
                batch_size=batch_size, columns=list(columns) if columns is not None else None
            )
        except BaseException:
            self.close()
            raise

    def next_batch(self) -> Any:
        with _named(self.path):
            return next(self.it, None)

    def next_rows(self) -> list[dict[str, Any]] | None:
        with _named(self.path):
            b = next(self.it, None)
        return None if b is None else b.to_pylist()

    def close(self) -> None:
        pf = getattr(self, "pf", None)
        if pf is not None:
            pf.close()
        if self.raw is not None:
            self.raw.close()


def _close_opened(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()


def read_parquet(
    path: str | os.PathLike[str],
    *,
    batches: bool = False,
    columns: Sequence[str] | None = None,
    batch_size: int = 65_536,
) -> Pipeline[Any]:
    """The rows of a Parquet file as dicts, or its ``pyarrow.RecordBatch``es.

    ``batches=True`` yields record batches of up to ``batch_size`` rows (no per-row
    Python objects: the fast way into numpy or torch); by default each row is a dict
    ``{column: value}``. ``columns`` reads only those columns. pyarrow runs in the
    loop's thread pool; memory is one batch. A URL is read through fsspec (extra
    ``remote``) with ranged reads on the run's own file system.

    Example:
        >>> import os, tempfile, aioflow as af
        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
        >>> pq.write_table(pa.table({"x": [1, 2], "y": ["a", "b"]}), path)
        >>> af.read_parquet(path).to_list()
        [{'x': 1, 'y': 'a'}, {'x': 2, 'y': 'b'}]
        >>> [b.num_rows for b in af.read_parquet(path, batches=True)]
        [2]
    """
    _pyarrow_parquet()  # fail when described if pyarrow is missing
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise PipelineError(f"batch_size must be a positive int, got {batch_size!r}")
    cols = tuple(columns) if columns is not None else None

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        try:
            async with aclosing(_read(p, ctx)) as chunks:
                async for c in chunks:
                    yield c
        except BadInput as e:
            e.stage = ctx.name
            raise

    async def _read(p: str, ctx: Ctx) -> ChunkIter:
        loop = asyncio.get_running_loop()
        raw = await open_url_sync(p, ctx) if is_url(p) else None
        opening = loop.run_in_executor(None, _ParquetReader, p, cols, batch_size, raw)
        try:
            # shielded: if we are cancelled, the opening goes on and is closed when done
            r: _ParquetReader = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_opened)  # it may still open: close it then
            raise
        pending: asyncio.Future[Any] | None = None
        try:
            step = r.next_batch if batches else r.next_rows
            while True:
                pending = loop.run_in_executor(None, step)
                got = await asyncio.shield(pending)
                if got is None:
                    return
                if batches:
                    yield [got]
                else:
                    for c in chunked(got):
                        yield c
        finally:
            if pending is not None and not pending.done():
                try:  # never close the file under a running read
                    await asyncio.wait([pending])
                except asyncio.CancelledError:
                    pending.add_done_callback(lambda _: r.close())
                    raise
            r.close()

    return pipeline_of(reader("read_parquet", path, gen, key=(batches, cols, batch_size)))
