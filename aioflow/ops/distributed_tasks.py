"""How many splits each Dask task of ``distribute`` takes (``Sizer``), and its constants."""

from __future__ import annotations

__all__ = ["DOWNSTREAM_CHUNKS", "TASK_SECONDS", "TASK_SPLITS", "Sizer", "chunk_of"]

#: A Dask task takes as many splits as make about this much work (measured as it goes):
#: enough to make the scheduler's per-task cost small, little enough to share the work.
TASK_SECONDS = 0.2
#: ... and at most this many.
TASK_SPLITS = 64


class Sizer:
    """How many splits the next task takes: one at first, then ~TASK_SECONDS of work, and
    toward the end of the epoch no more than a ``window``-th of what is left (guided
    self-scheduling), so that the last tasks are small and the workers finish together
    instead of one of them idling through another's last 0.2 s.

    With a ``budget`` (``max_outstanding``), the elements of the tasks submitted and not
    yet read stay within it, each split counted at the most elements a split has made so
    far: one split at a time until the first one is read, and the budget spread over the
    ``window`` tasks; the elements read and not yet handed on count too. A split is the
    least a task takes: one whose elements exceed the budget is still submitted alone
    (``distribute`` cuts a range or ``from_source`` into splits small enough)."""

    def __init__(self, window: int, budget: int | None = None) -> None:
        self.per_split: float | None = None
        self.most: int | None = None  # elements per split, the most seen
        self.window = window
        self.budget = budget

    def size(self, left: int, running: int, held: int = 0) -> int:
        """Splits for the next task, with ``left`` splits of the epoch not yet submitted,
        ``running`` submitted and not yet read, and ``held`` elements read and not yet
        handed on; 0: submit nothing now."""
        if left <= 0:
            return 0
        cap = TASK_SPLITS
        if self.budget is not None:
            busy = running or held
            if self.most is None:
                return 0 if busy else 1
            most = max(self.most, 1)
            room = (self.budget - running * most - held) // most
            if room < 1:
                return 0 if busy else 1
            cap = min(room, max(1, self.budget // (most * self.window)))
        if self.per_split is None:
            return 1
        by_time = int(TASK_SECONDS / max(self.per_split, 1e-6))
        return max(1, min(cap, by_time, -(-left // self.window)))

    def done(self, splits: int, elements: int, seconds: float) -> None:
        per = seconds / splits
        self.per_split = per if self.per_split is None else 0.7 * self.per_split + 0.3 * per
        self.most = max(self.most or 0, -(-elements // splits))


#: With ``max_outstanding``, the most chunks that sit between ``distribute`` and a ``for``
#: loop over it (its channel, the hand-off to the consumer's thread, what the consumer took
#: at once): each of at most ``chunk_of(max_outstanding)`` elements.
DOWNSTREAM_CHUNKS = 12


def chunk_of(budget: int | None, most: int) -> int:
    """Elements per chunk that ``distribute`` hands on: ``most`` (``CHUNK_MAX``), or with a
    budget of ``max_outstanding`` elements, so few that the chunks on their way to the
    consumer hold a small part of it (one element each below 128).

    Example:
        >>> chunk_of(None, 256), chunk_of(8, 256), chunk_of(1024, 256)
        (256, 1, 16)
    """
    return most if budget is None else max(1, min(most, budget // 64))
