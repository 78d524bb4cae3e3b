"""``read_csv``: the rows of a CSV file, as dicts or record batches (extra ``parquet``: pyarrow).

pyarrow's streaming CSV reader (``pyarrow.csv.open_csv``) parses the file block by block
in C++; the column types are inferred from the first block. The reading machinery (a
thread-pool step at a time, batches re-cut to exact sizes, resuming at a row) is
``tables``'.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aioflow._core.base import pipeline_of
from aioflow.errors import PipelineError
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

__all__ = ["read_csv"]

BLOCK = 1 << 20  # bytes pyarrow parses at a time (its default)


def _opener(
    path: str, compression: str | None, delimiter: str, columns: Sequence[str] | None
) -> Callable[[int, Any], Opened]:
    def open_at(row: int, raw: Any) -> Opened:
        pc = pyarrow("csv", "read_csv")
        stream, close = open_bytes(path, compression, raw)
        return open_reader(
            lambda: pc.open_csv(
                stream,
                read_options=pc.ReadOptions(block_size=BLOCK),
                parse_options=pc.ParseOptions(delimiter=delimiter),
                convert_options=pc.ConvertOptions(
                    include_columns=list(columns) if columns is not None else None,
                    strings_can_be_null=True,
                ),
            ),
            row,
            close,
            "Empty CSV file",
        )

    return open_at


def read_csv(
    path: str | os.PathLike[str],
    *,
    batches: int | None = None,
    columns: Sequence[str] | None = None,
    delimiter: str = ",",
    compression_type: str | None = None,
) -> Pipeline[Any]:
    """The rows of a CSV file with a header line, as dicts or ``pyarrow.RecordBatch``es.

    ``batches=n`` yields record batches of ``n`` rows (the last one shorter), parsed by
    pyarrow's streaming CSV reader with no Python object per row; by default each row is
    a dict ``{column: value}``; an empty field is None. Column types are inferred from
    the file's first MiB (a later value that does not fit raises ``af.BadInput``).
    ``columns`` keeps only those columns; ``compression_type="GZIP"`` decompresses as it
    reads. pyarrow runs in the
    loop's thread pool; memory is about a block (1 MiB of text) and a batch. A URL is read
    through fsspec (extra ``remote``). A resumed run starts at the row where the
    interrupted one was.

    Example:
        >>> import pathlib, tempfile, aioflow as af
        >>> path = pathlib.Path(tempfile.mkdtemp(), "a.csv")
        >>> _ = path.write_text("t,user\\n3,a\\n1,b\\n2,a\\n")
        >>> af.read_csv(path).to_list()[0]
        {'t': 3, 'user': 'a'}
        >>> [b.num_rows for b in af.read_csv(path, batches=2)]
        [2, 1]
    """
    pyarrow("csv", "read_csv")  # fail when described if pyarrow is missing
    size = check_rows(batches, "read_csv")
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise PipelineError(f"read_csv: delimiter must be one character, got {delimiter!r}")
    comp = arrow_compression(compression_type, "read_csv")
    cols = tuple(columns) if columns is not None else None

    def opener(p: str) -> Callable[[int, Any], Opened]:
        return _opener(p, comp, delimiter, cols)

    key = (size, cols, delimiter, comp)
    return pipeline_of(table_reader("read_csv", path, opener, size, "malformed CSV file", key))
