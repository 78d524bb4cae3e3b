"""What a process map sends by value: its function, and the classes of its items that a
worker cannot import.

Functions are cloudpickled with their real file names (a worker's traceback shows the
user's file and line, not ``<dynamic-code>``) and the source lines of files a worker
lacks (a notebook cell's); ``_process/worker`` loads them. Items are pickled by name
(``dumps``: plain pickle) unless an instance of a class a worker cannot import is met:
one of ``__main__`` (the user's script, a notebook cell), of a function, or of a module a
worker's ``sys.path`` does not lead to (``importable``); then the whole value goes by
value (``dumps_by_value``: cloudpickle, which pickles such classes and functions by
value). A worker unpickles either with plain pickle (cloudpickle is importable there).
"""

from __future__ import annotations

import functools
import io
import linecache
import os
import pickle
import sys
import types
from typing import Any

import cloudpickle

from aioflow._process.wire import by_name_dumps, named

__all__ = ["dumps", "dumps_by_value", "importable", "ship"]

_dynamic_class_reduce = cloudpickle.cloudpickle._dynamic_class_reduce


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, but code keeps its ``co_filename`` (tracebacks name the real file),
    and the classes and functions of modules a worker cannot import go by value."""

    def __init__(self, file: Any, buffer_callback: Any = None) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self.files: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type):
            if not importable(getattr(obj, "__module__", None)):
                return _dynamic_class_reduce(obj)
        elif type(obj) is types.FunctionType:
            if not importable(obj.__module__):
                return self._dynamic_function_reduce(obj)
        elif isinstance(obj, functools._lru_cache_wrapper):
            fn = obj.__wrapped__
            if not cloudpickle.cloudpickle._should_pickle_by_reference(fn):
                # (pickled by name it would need the user's __main__ in the worker; made
                # with functools' own type, so that no aioflow module is named in it)
                params = obj.cache_parameters()
                args = (fn, params["maxsize"], params["typed"], functools._CacheInfo)
                return functools._lru_cache_wrapper, args
        elif type(obj) is types.CodeType:
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


def dumps_by_value(obj: Any, protocol: int = 5, buffer_callback: Any = None) -> bytes:
    """``obj`` cloudpickled (protocol 5) for a worker: what it cannot import, by value."""
    buf = io.BytesIO()
    _Pickler(buf, buffer_callback).dump(obj)
    return buf.getvalue()


# -- which modules a worker can import ----------------------------------------------------
_verdicts: dict[str, tuple[Any, bool]] = {}


def importable(name: str | None) -> bool:
    """Whether a worker (a fresh interpreter with this process's ``sys.path``) imports the
    module ``name`` as this process did: not ``__main__``, nor a module loaded from a file
    under a name that does not lead to it (a test runner's or a tool's ``importlib``).
    Modules that are not Python files (built in, extensions) are left to pickle."""
    if name is None:
        return True
    mod = sys.modules.get(name)
    known = _verdicts.get(name)
    if known is None or known[0] is not mod:
        known = _verdicts[name] = (mod, _importable(name, mod))
    return known[1]


def _importable(name: str, mod: Any) -> bool:
    if name == "__main__":
        return False
    file = getattr(mod, "__file__", None)
    if mod is None or not isinstance(file, str) or not file.endswith((".py", ".pyc")):
        return True
    spec = getattr(mod, "__spec__", None)
    if spec is None or spec.name != name:
        return False
    parts = name.split(".")
    try:  # each package on the way found where this process found it
        for i in range(1, len(parts) + 1):
            here = sys.modules.get(".".join(parts[:i]))
            path = getattr(sys.modules.get(".".join(parts[: i - 1])), "__path__", None)
            if here is None or _where(_find(".".join(parts[:i]), path)) != _where(here.__spec__):
                return False
    except Exception:  # (a finder that fails here: pickle decides)
        return True
    return True


def _find(name: str, path: Any) -> Any:
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec
    return None


def _where(spec: Any) -> Any:
    if spec is None:
        return None
    if spec.origin is not None and spec.has_location:
        return os.path.realpath(spec.origin)
    return spec.origin, sorted(os.path.realpath(p) for p in spec.submodule_search_locations or ())


def _by_name(cls: type) -> bool:
    return named(cls) and importable(cls.__module__)


#: ``pickle.dumps`` for items, raising ``wire.ByValue`` when one needs ``dumps_by_value``.
dumps = by_name_dumps(_by_name)
