"""Functions shipped to worker processes by value: cloudpickled, with their real file
names (a worker's traceback shows the user's file and line, not ``<dynamic-code>``) and
the source lines of files a worker lacks (a notebook cell's); ``_process/worker`` loads them."""

from __future__ import annotations

import functools
import io
import linecache
import os
import pickle
import types
from typing import Any

import cloudpickle

__all__ = ["ship"]


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, but code keeps its ``co_filename`` (tracebacks name the real file)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=5)
        self.files: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, functools._lru_cache_wrapper):
            fn = obj.__wrapped__
            if not cloudpickle.cloudpickle._should_pickle_by_reference(fn):
                # (pickled by name it would need the user's __main__ in the worker; made
                # with functools' own type, so that no aioflow module is named in it)
                params = obj.cache_parameters()
                args = (fn, params["maxsize"], params["typed"], functools._CacheInfo)
                return functools._lru_cache_wrapper, args
        if type(obj) is types.CodeType:
            fn, args = cloudpickle.cloudpickle._code_reduce(obj)
            self.files.add(obj.co_filename)
            real = obj.co_filename
            dyn = "<dynamic-code>"
            return fn, tuple(real if isinstance(a, str) and a == dyn else a for a in args)
        return super().reducer_override(obj)


def ship(fn: Any) -> bytes:
    """Cloudpickle ``fn`` with its name and the source lines of files a worker lacks."""
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(fn)
    lines = {f: linecache.getlines(f) for f in p.files if not os.path.exists(f)}
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return pickle.dumps((buf.getvalue(), {f: v for f, v in lines.items() if v}, name), 5)
