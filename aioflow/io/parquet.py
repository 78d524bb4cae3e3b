"""``read_parquet``: rows or record batches of a Parquet file (extra ``parquet``: pyarrow).

The reading machinery (a thread-pool step at a time, batches re-cut to exact sizes,
resuming at a row) is ``tables``'; this module opens a Parquet file at a row: from the
row group that holds it, found in the footer's metadata, so that resuming reads no row
group before. A file pyarrow cannot parse (``ArrowInvalid``, or an ``OSError`` without
an errno: a thrift footer or a page that does not decode) raises ``BadInput`` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aioflow._core.base import pipeline_of
from aioflow.errors import PipelineError
from aioflow.io._streams import local_path
from aioflow.io.tables import Opened, pyarrow, table_reader

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["read_parquet"]


def _opener(
    path: str, columns: Sequence[str] | None, batch_size: int
) -> Callable[[int, Any], Opened]:
    def open_at(row: int, raw: Any) -> Opened:
        pq = pyarrow("parquet", "read_parquet")
        pf: Any = None

        def close() -> None:
            if pf is not None:
                pf.close()
            if raw is not None:
                raw.close()

        try:
            pf = pq.ParquetFile(raw if raw is not None else local_path(path))
            meta = pf.metadata
            group, first = 0, 0  # the row group holding ``row``, and its first row
            while group < meta.num_row_groups and first + meta.row_group(group).num_rows <= row:
                first += meta.row_group(group).num_rows
                group += 1
            if group == meta.num_row_groups:
                return iter(()), 0, close
            it = pf.iter_batches(
                batch_size=batch_size,
                row_groups=range(group, meta.num_row_groups),
                columns=list(columns) if columns is not None else None,
            )
            return it, row - first, close
        except BaseException:
            close()
            raise

    return open_at


def read_parquet(
    path: str | os.PathLike[str],
    *,
    batches: bool | int = False,
    columns: Sequence[str] | None = None,
    batch_size: int = 65_536,
) -> Pipeline[Any]:
    """The rows of a Parquet file as dicts, or its ``pyarrow.RecordBatch``es.

    ``batches=True`` yields record batches of ``batch_size`` rows (``batches=n``: of
    ``n`` rows), the last one shorter: no per-row Python objects, the fast way into numpy
    or torch (``af.collate.to_numpy``); by default each row is a dict ``{column:
    value}``. ``columns`` reads only those columns. pyarrow runs in the loop's thread
    pool; memory is one batch. A URL is read through fsspec (extra ``remote``) with ranged
    reads on the run's own file system. A resumed
    run starts at the row where the interrupted one was, from the row group holding it.

    Example:
        >>> import os, tempfile, aioflow as af
        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
        >>> pq.write_table(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}), path)
        >>> af.read_parquet(path).to_list()[:2]
        [{'x': 1, 'y': 'a'}, {'x': 2, 'y': 'b'}]
        >>> [b.num_rows for b in af.read_parquet(path, batches=2)]
        [2, 1]
    """
    pyarrow("parquet", "read_parquet")  # fail when described if pyarrow is missing
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise PipelineError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(batches, bool) and (not isinstance(batches, int) or batches < 1):
        raise PipelineError(
            f"read_parquet: batches must be a bool or a positive int, got {batches!r}"
        )
    size = None if batches is False else batch_size if batches is True else batches
    cols = tuple(columns) if columns is not None else None
    read = size if size is not None else batch_size

    def opener(p: str) -> Callable[[int, Any], Opened]:
        return _opener(p, cols, read)

    node = table_reader(
        "read_parquet", path, opener, size, "corrupt Parquet file", key=(batches, cols, batch_size)
    )
    return pipeline_of(node)
