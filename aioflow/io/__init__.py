"""Sources that read files: local paths through aiofiles, URLs through fsspec.

Each reader takes one path and returns a ``Pipeline``, so that ``list_files(...)``
composes with them through ``flat_map`` or ``interleave``. Modules by format family:
``files`` (list_files, lines, whole files), ``jsonl`` (JSON Lines), ``npy``,
``tfrecord``, ``tar`` (WebDataset shards), ``parquet`` and ``csv`` (through pyarrow, with
``tables``, what the pyarrow readers share); ``remote`` holds the fsspec side and
``_streams`` what every reader shares (opening, buffering, errors naming the file and
position).
"""

from __future__ import annotations

from aioflow.io.csv import read_csv
from aioflow.io.files import list_files, read_bytes, read_lines
from aioflow.io.jsonl import read_jsonl
from aioflow.io.npy import read_npy
from aioflow.io.parquet import read_parquet
from aioflow.io.tar import read_tar
from aioflow.io.tfrecord import read_tfrecord

__all__ = [
    "list_files",
    "read_bytes",
    "read_csv",
    "read_jsonl",
    "read_lines",
    "read_npy",
    "read_parquet",
    "read_tar",
    "read_tfrecord",
]
