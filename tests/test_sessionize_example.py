"""examples/sessionize_events.py runs and does what it says."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "sessionize_events.py"


def test_sessionize_example_sorts_sessionizes_joins_balances_and_batches():
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--events", "12000", "--files", "3", "--lateness", "32"],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    )
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["events"] == 12000
    assert summary["out_of_order_in"] > 1000  # the files really are out of order ...
    assert summary["out_of_order_after_sort"] == 0  # ... and sort_by repaired it
    assert summary["late"] == 0  # nothing later than max_delay
    assert summary["sessions_with_profile"] > summary["sessions"] * 0.9
    assert summary["profile_leaks"] == 0  # no profile from after the session's end
    assert summary["positive_share_before"] < 0.15
    assert 0.3 < summary["positive_share_after"] < 0.7
    assert summary["rows"] == summary["sessions_kept"] > 0
    assert summary["batches"] > 0
    assert all(len(s) == 2 and s[0] <= 64 for s in summary["batch_shapes"])
