"""External sort_by vs sorted() in memory: wall time and peak RSS.

N (key, payload) records (a random 32-bit key, a 16-byte payload) made by a generator,
sorted by key; each variant runs in a fresh subprocess that reports its wall time
(making the records included), its peak RSS (``ru_maxrss``) and a checksum of the
payloads in output order (equal checksums: the same, stable, order).

    python bench/external_sort.py [--n 5000000] [--max-in-memory 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from operator import itemgetter

HERE = os.path.dirname(os.path.abspath(__file__))


def records(n: int) -> Iterator[tuple[int, bytes]]:
    rnd = random.Random(0)
    bits = rnd.getrandbits
    for i in range(n):
        yield bits(32), b"%016d" % i


def checksum(out: Iterable[tuple[int, bytes]]) -> tuple[int, int, bool]:
    crc, count, last, ordered = 0, 0, -1, True
    for key, payload in out:
        crc = zlib.crc32(payload, crc)
        ordered &= key >= last
        last = key
        count += 1
    return crc, count, ordered


def child(kind: str, n: int, max_in_memory: int) -> None:
    t0 = time.perf_counter()
    if kind == "sorted":
        crc, count, ordered = checksum(sorted(records(n), key=itemgetter(0)))
    else:
        sys.path.insert(0, os.path.join(HERE, ".."))
        import aioflow as af

        with tempfile.TemporaryDirectory() as spill:
            p = af.from_iterable(lambda: records(n)).sort_by(
                itemgetter(0), max_in_memory=max_in_memory, spill_dir=spill
            )
            crc, count, ordered = checksum(p)
            assert os.listdir(spill) == [], "the sort left files behind"
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        json.dumps(
            {"seconds": seconds, "rss_mib": rss, "crc": crc, "count": count, "ordered": ordered}
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5_000_000)
    ap.add_argument("--max-in-memory", type=int, default=200_000)
    ap.add_argument("--child", choices=["sorted", "aioflow"])
    a = ap.parse_args()
    if a.child:
        child(a.child, a.n, a.max_in_memory)
        return
    res = {}
    for kind in ("sorted", "aioflow"):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--n",
            str(a.n),
            "--max-in-memory",
            str(a.max_in_memory),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        res[kind] = json.loads(out.strip().splitlines()[-1])
        r = res[kind]
        assert r["count"] == a.n and r["ordered"], r
        print(f"{kind:8s} {r['seconds']:7.1f} s  peak RSS {r['rss_mib']:7.0f} MiB")
    s, x = res["sorted"], res["aioflow"]
    assert s["crc"] == x["crc"], "the external sort's order differs from sorted()"
    print(f"n={a.n:,} max_in_memory={a.max_in_memory:,}: same order as sorted() (stable)")
    print(
        f"external sort: {x['seconds'] / s['seconds']:.2f}x the time of sorted(),"
        f" {x['rss_mib'] / s['rss_mib']:.2f}x its peak RSS"
    )


if __name__ == "__main__":
    main()
