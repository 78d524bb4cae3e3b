"""Remote shards cached on local disk: ``list_files(url_pattern, cache_dir=, cache_limit=)``.

The idea of Mosaic streaming's shard cache and tf.data's snapshot: the first epoch
downloads each remote shard once, a few shards ahead of the one being read (``ahead``
downloads run in the background while the reader reads), and ``list_files`` yields the
local path; later epochs (and later runs) find the shard on disk and make no request.

A shard's local name is a digest of its URL, size and ETag (as the listing gave them)
plus its base name, so a changed object is a new entry. A download is written to a
``.part-<pid>-<random>`` name, checked (its size, and its MD5 where the ETag is one: a
single-part S3 upload), then renamed atomically: a half-written file is never taken for
a shard, and one left by a killed process is removed when a later run opens the cache.
Past ``limit`` bytes the least recently used shards are deleted, never one in use: being
downloaded, downloaded but not yet listed, or among the last ``PINNED`` listed (the ones
the readers may not have opened yet). Runs in one process may share a ``cache_dir``;
processes should not (each limits and pins only what it knows of).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import hashlib
import os
import re
import secrets
from typing import Any

from aioflow._core.run import ChunkIter, Ctx
from aioflow.errors import PipelineError
from aioflow.io._streams import BLOCK_MAX, check_path, open_stream

__all__ = ["PINNED", "ShardCache", "cached_files", "check_cache"]

#: how many of the last listed shards count as in use (queued for or open in a reader)
PINNED = 8

_PART = re.compile(r"\.part-(\d+)-[0-9a-f]+$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


def check_cache(cache_dir: Any, cache_limit: int | None, cache_ahead: int) -> str | None:
    """``list_files``' cache arguments checked; the cache directory as an absolute path."""
    if cache_limit is not None and (
        isinstance(cache_limit, bool) or not isinstance(cache_limit, int) or cache_limit < 1
    ):
        raise PipelineError(f"cache_limit must be a positive int (bytes), got {cache_limit!r}")
    if isinstance(cache_ahead, bool) or not isinstance(cache_ahead, int) or cache_ahead < 0:
        raise PipelineError(f"cache_ahead must be an int >= 0, got {cache_ahead!r}")
    if cache_dir is None:
        if cache_limit is not None:
            raise PipelineError("cache_limit needs a cache_dir")
        return None
    return os.path.abspath(check_path(cache_dir, "list_files cache_dir"))


def _etag(info: dict[str, Any]) -> str:
    return str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or "").strip('"')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ShardCache:
    """The shards of ``directory``: their sizes and last use, for one run.

    ``local(url)`` is where a shard lives; ``get(url, ctx)`` returns it, downloading it
    first if needed (after making room under ``limit``).
    """

    def __init__(self, directory: str, limit: int | None, infos: dict[str, dict[str, Any]]):
        self.dir = directory
        self.limit = limit
        self.infos = infos
        os.makedirs(directory, exist_ok=True)
        # name -> (size, last use); in memory for the run, the files' mtimes across runs
        self.entries: dict[str, tuple[int, float]] = {}
        with os.scandir(directory) as found:
            for e in found:
                m = _PART.search(e.name)
                if m is not None:
                    if not _alive(int(m.group(1))):
                        _remove(e.path)  # a download that never finished
                    continue
                if e.is_file():
                    st = e.stat()
                    self.entries[e.name] = (st.st_size, st.st_mtime)
        self.reserved: dict[str, int] = {}  # downloads in flight
        self.pinned: collections.Counter[str] = collections.Counter()

    def name(self, url: str) -> str:
        info = self.infos.get(url, {})
        key = f"{url}\0{info.get('size')}\0{_etag(info)}".encode()
        base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        return f"{hashlib.sha256(key).hexdigest()[:20]}-{base}"

    def local(self, url: str) -> str:
        return os.path.join(self.dir, self.name(url))

    def size(self) -> int:
        """Bytes of the complete shards plus those of the downloads in flight."""
        return sum(s for s, _ in self.entries.values()) + sum(self.reserved.values())

    def touch(self, name: str) -> None:
        """``name`` was used now (LRU order; its mtime keeps the order across runs)."""
        path = os.path.join(self.dir, name)
        try:
            os.utime(path)
            self.entries[name] = (self.entries[name][0], os.stat(path).st_mtime)
        except (OSError, KeyError):
            pass

    def _make_room(self, need: int) -> None:
        if self.limit is None:
            return
        over = self.size() + need - self.limit
        if over <= 0:
            return
        for name, (size, _) in sorted(self.entries.items(), key=lambda kv: kv[1][1]):
            if over <= 0:
                break
            if self.pinned[name] or name in self.reserved:
                continue
            _remove(os.path.join(self.dir, name))
            del self.entries[name]
            over -= size

    def _cached(self, name: str, size: int | None) -> bool:
        entry = self.entries.get(name)
        if entry is None:
            return False
        if size is not None and entry[0] != size:  # not ours, or cut by hand: fetch anew
            _remove(os.path.join(self.dir, name))
            del self.entries[name]
            return False
        return True

    async def get(self, url: str, ctx: Ctx) -> str:
        """The local path of ``url``'s shard, downloaded and checked if not cached."""
        name = self.name(url)
        info = self.infos.get(url, {})
        size = info.get("size")
        if self._cached(name, size):
            return os.path.join(self.dir, name)
        need = int(size or 0)
        self._make_room(need)
        self.reserved[name] = need
        try:
            got = await self._download(url, name, info, ctx)
        finally:
            del self.reserved[name]
        self.entries[name] = (got, 0.0)
        self.touch(name)
        return os.path.join(self.dir, name)

    async def _download(self, url: str, name: str, info: dict[str, Any], ctx: Ctx) -> int:
        final = os.path.join(self.dir, name)
        tmp = f"{final}.part-{os.getpid()}-{secrets.token_hex(4)}"
        loop = asyncio.get_running_loop()
        pool = ctx.run.thread_pool()
        opening = loop.run_in_executor(pool, open, tmp, "wb")
        f = None
        md5 = hashlib.md5(usedforsecurity=False)
        n = 0
        try:
            f = await _settled(opening)
            async with open_stream(url, ctx) as s:
                while True:
                    data = await s.read(BLOCK_MAX)
                    if not data:
                        break
                    await _settled(loop.run_in_executor(pool, _write, f, md5, data))
                    n += len(data)
            await _settled(loop.run_in_executor(pool, f.close))
            _check(url, info, n, md5.hexdigest())
            os.replace(tmp, final)  # atomic: the shard is there whole, or not at all
        except BaseException:
            if f is None and opening.done() and not opening.cancelled() and not opening.exception():
                f = opening.result()  # opened while the cancel came
            if f is not None:
                f.close()
            _remove(tmp)
            raise
        return n


async def _settled(fut: asyncio.Future[Any]) -> Any:
    """``await fut`` (a call running in a thread); cancelled meanwhile, the call is let
    finish before the cancel goes on: a thread cannot be stopped, and the file it opens
    or writes must be closed after it, not left open behind the run's close. The wait
    is one ``open`` or one block's write."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            try:
                await asyncio.wait([fut])
            except asyncio.CancelledError:
                pass  # cancelled again: still bounded by the one call, then raised below
        raise


def _write(f: Any, md5: Any, data: bytes) -> None:
    f.write(data)
    md5.update(data)


def _check(url: str, info: dict[str, Any], n: int, md5: str) -> None:
    size = info.get("size")
    if size is not None and n != int(size):
        raise OSError(errno.EIO, f"downloaded {n} bytes of {url!r}, the listing said {size}")
    etag = _etag(info).lower()
    if _MD5.match(etag) and etag != md5:
        raise OSError(
            errno.EIO,
            f"the download of {url!r} does not match its ETag (MD5 {md5}, ETag {etag}):"
            " the object changed since it was listed",
        )


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


async def cached_files(cache: ShardCache, order: list[str], ahead: int, ctx: Ctx) -> ChunkIter:
    """The local paths of ``order``'s shards, each once it is cached, one per chunk, with
    up to ``ahead`` more downloads running in the background (and the shard awaited)."""
    tasks: collections.deque[tuple[str, asyncio.Task[str]]] = collections.deque()
    listed: collections.deque[str] = collections.deque()
    nxt = 0

    def launch() -> None:
        nonlocal nxt
        while nxt < len(order) and len(tasks) <= ahead:
            url = order[nxt]
            nxt += 1
            cache.pinned[cache.name(url)] += 1  # downloaded but not yet listed: in use
            tasks.append((url, asyncio.ensure_future(cache.get(url, ctx))))

    try:
        launch()
        while tasks:
            url, task = tasks[0]
            path = await task
            tasks.popleft()
            name = cache.name(url)
            cache.touch(name)
            listed.append(name)  # still pinned: now among the last listed
            if len(listed) > PINNED:
                cache.pinned[listed.popleft()] -= 1
            launch()
            yield [path]
    finally:
        running = [t for _, t in tasks]
        for t in running:
            t.cancel()
        if running:
            await asyncio.wait(running)  # each removes its temporary file
        for t in running:
            if not t.cancelled():
                t.exception()  # retrieved: a download that failed after the error raised
