"""A process map's results stacked in the worker, for the ``batch`` right after it.

``map(fn, executor="process").batch(n)`` sends its workers tasks that each hold items of
one batch only, a whole batch when items are cheap (``tf.data``'s map-and-batch fusion;
DataLoader's workers collate likewise). A worker stacks a task's results column by
column (``stack``): every numpy array field becomes one array, which reaches the parent
in one piece of shared memory instead of a pickled copy per item. The parent rebuilds
the items as ``Rows`` (each array a row view of its column), so every stage sees the
same items as without it; ``batch``, when ``Rows`` make up exactly its next batch,
collates it from their columns (``joined``, ``collated``) without stacking the items
again.

Stacking is all or nothing: every result must have the first one's structure (the
same ``dict`` keys, ``tuple``/``list`` lengths and namedtuple types) and each array
field the first one's shape and dtype, with at least one array field; otherwise, or
when a result is a failure, the task answers item by item as any other. An array field
is a plain ``np.ndarray`` of a native byte order and no objects in the first result;
other fields (numbers, strings, objects, other arrays) travel as a list of the items'
own values, which the collate gets as it would without stacking.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from operator import itemgetter
from typing import Any

__all__ = ["Rows", "collated", "cut", "joined", "rows", "stack"]

# a template is the first result with each field replaced by its column's index:
# ("a", i, shape, dtype) an array column, ("o", i) a list column; containers as
# ("d", keys, parts), ("t", parts), ("n", namedtuple type, parts), ("l", parts)
Template = tuple[Any, ...]


class Rows(list[Any]):
    """A stacked task's results as items (row views), with the columns they came from."""

    __slots__ = ("cols", "template")

    template: Template
    cols: list[Any]


def stack(ys: list[Any]) -> tuple[Template, list[Any]] | None:
    """``(template, columns)`` of the results, or None when they do not stack."""
    np = sys.modules.get("numpy")  # (no array can be among them without it loaded)
    if np is None or not ys:
        return None
    leaves: list[list[Any]] = []
    kinds: list[str] = []
    template = _shape(ys[0], leaves, kinds, np)
    if "a" not in kinds:
        return None
    for y in ys[1:]:
        if not _match(y, template, leaves, np):
            return None
    cols: list[Any] = []
    for kind, col in zip(kinds, leaves, strict=True):
        cols.append(_stacked(col, np) if kind == "a" else col)
    return template, cols


def _stacked(col: list[Any], np: Any) -> Any:
    """``np.stack`` of plain arrays of one shape and dtype (``_match`` checked them): one
    ``np.concatenate`` and a reshape, ~3x faster for many small rows (as
    ``aioflow.collate.stack``, which this module may not import); 0-d ones: ``np.stack``."""
    shape = col[0].shape
    if not shape:
        return np.stack(col)
    return np.concatenate(col).reshape((len(col), *shape))


def _shape(y: Any, leaves: list[list[Any]], kinds: list[str], np: Any) -> Template:
    t = type(y)
    if t is dict:
        keys = tuple(y)
        return ("d", keys, tuple(_shape(y[k], leaves, kinds, np) for k in keys))
    if t is tuple:
        return ("t", tuple(_shape(v, leaves, kinds, np) for v in y))
    if t is list:
        return ("l", tuple(_shape(v, leaves, kinds, np) for v in y))
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        return ("n", t, tuple(_shape(v, leaves, kinds, np) for v in y))
    leaves.append([y])
    if t is np.ndarray and y.dtype.isnative and not y.dtype.hasobject:
        kinds.append("a")
        return ("a", len(leaves) - 1, y.shape, y.dtype)
    kinds.append("o")
    return ("o", len(leaves) - 1)


def _match(y: Any, tpl: Template, leaves: list[list[Any]], np: Any) -> bool:
    tag = tpl[0]
    t = type(y)
    if tag == "a":
        if t is not np.ndarray or y.shape != tpl[2] or y.dtype != tpl[3]:
            return False
        leaves[tpl[1]].append(y)
        return True
    if tag == "o":  # (any value: its column is collated as a list, as without stacking)
        leaves[tpl[1]].append(y)
        return True
    if tag == "d":
        if t is not dict or tuple(y) != tpl[1]:
            return False
        return all(_match(y[k], p, leaves, np) for k, p in zip(tpl[1], tpl[2], strict=True))
    parts = tpl[-1]
    want = {"t": tuple, "l": list}.get(tag) or tpl[1]
    if t is not want or len(y) != len(parts):
        return False
    return all(_match(v, p, leaves, np) for v, p in zip(y, parts, strict=True))


def rows(template: Template, cols: list[Any], n: int) -> Rows:
    """The ``n`` items of stacked columns: arrays as row views, other fields as sent."""
    # (``[i, ...]``: a 0-d row stays an array, not a numpy scalar)
    out = Rows(collated(template, cols, itemgetter((i, ...)), itemgetter(i)) for i in range(n))
    out.template = template
    out.cols = cols
    return out


def cut(r: Rows, start: int, stop: int) -> Rows:
    """Rows ``start:stop`` of ``r``, with their columns (views of its arrays)."""
    out = Rows(r[start:stop])
    out.template = r.template
    out.cols = [c[start:stop] for c in r.cols]
    return out


def joined(parts: list[Rows]) -> tuple[Template, list[Any]] | None:
    """The template and columns of consecutive ``Rows`` (their arrays concatenated: one
    copy, unless there is one part), or None when they were stacked differently."""
    first = parts[0]
    if len(parts) == 1:
        return first.template, first.cols
    if any(p.template != first.template for p in parts[1:]):
        return None
    np = sys.modules["numpy"]
    cols: list[Any] = []
    for i, col in enumerate(first.cols):
        if isinstance(col, list):
            cols.append([x for p in parts for x in p.cols[i]])
        else:
            cols.append(np.concatenate([p.cols[i] for p in parts]))
    return first.template, cols


def collated(
    tpl: Template,
    cols: list[Any],
    array: Callable[[Any], Any],
    collate: Callable[[list[Any]], Any],
) -> Any:
    """The value ``tpl`` describes, its fields made of their columns: ``array(column)``
    for an array field, ``collate(values)`` for any other; containers as the template's
    (dict, tuple, namedtuple, list). With the column itself and a field-by-field collate
    (the default's, torch's), the batch of the stacked items; with a row's index, the
    row's item.
    """
    tag = tpl[0]
    if tag == "a":
        return array(cols[tpl[1]])
    if tag == "o":
        return collate(cols[tpl[1]])
    if tag == "d":
        return {k: collated(p, cols, array, collate) for k, p in zip(tpl[1], tpl[2], strict=True)}
    if tag == "t":
        return tuple(collated(p, cols, array, collate) for p in tpl[1])
    if tag == "l":
        return [collated(p, cols, array, collate) for p in tpl[1]]
    return tpl[1](*(collated(p, cols, array, collate) for p in tpl[2]))
