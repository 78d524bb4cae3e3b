#!/usr/bin/env bash
# Mutation testing (cosmic-ray) of the core modules, each against its own test files, on a
# random sample of its mutants. Not run by CI: a mutant costs one run of those test files.
#
# usage: bash scripts/mutation.sh [MUTANTS_PER_MODULE=12] [SEED=0] [MODULE...]
#   TESTS_REF=main bash scripts/mutation.sh ...   the same mutants, the tests of another
#                                                 commit (the "before" survival rate)
# cosmic-ray edits the files it mutates in place, so it works on a copy of HEAD (committed
# code only) in a temporary directory, never on this tree. Prints each module's killed and
# surviving counts, and writes the surviving mutants' diffs to $OUT (default mutants.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY="$ROOT/.venv/bin/python"
N="${1:-12}"
SEED="${2:-0}"
shift $(($# < 2 ? $# : 2))
MODULES=("$@")
[ ${#MODULES[@]} -gt 0 ] || MODULES=(_runtime _calls ordering combine cache)
OUT="${OUT:-$ROOT/mutants.txt}"
"$PY" -c "import cosmic_ray" 2>/dev/null || {
  echo "needs cosmic-ray: .venv/bin/python -m pip install -c scripts/constraints.txt -e '.[mutation]'" >&2
  exit 2
}

declare -A TESTS=(
  [_runtime]="tests/test_runtime.py tests/test_pipeline.py tests/test_transforms.py"
  [_calls]="tests/test_parallel.py tests/test_transforms.py"
  [ordering]="tests/test_ordering.py"
  [combine]="tests/test_combine.py tests/test_interleave.py tests/test_combine_sampling.py"
  [cache]="tests/test_cache.py"
)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git archive HEAD | tar -x -C "$WORK"
if [ -n "${TESTS_REF:-}" ]; then
  rm -rf "$WORK/tests"
  git archive "$TESTS_REF" tests | tar -x -C "$WORK"
fi
: >"$OUT"
cd "$WORK"
for m in "${MODULES[@]}"; do
  cat >"$m.toml" <<EOF
[cosmic-ray]
module-path = "aioflow/$m.py"
timeout = 240.0
excluded-modules = []
test-command = "$PY -m pytest -x -q -p no:cacheprovider ${TESTS[$m]}"

[cosmic-ray.distributor]
name = "local"
EOF
  "$PY" -m cosmic_ray.cli init "$m.toml" "$m.sqlite" >/dev/null
  # keep a random sample of the mutants: the others are marked skipped before exec
  "$PY" - "$m.sqlite" "$N" "$SEED" <<'EOF'
import random, sys
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult
path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with use_db(path, WorkDB.Mode.open) as db:
    jobs = sorted(item.job_id for item in db.work_items)
    keep = set(random.Random(seed).sample(jobs, min(n, len(jobs))))
    for job in jobs:
        if job not in keep:
            db.set_result(job, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    print(f"{path}: {len(keep)} of {len(jobs)} mutants sampled", file=sys.stderr)
EOF
  "$PY" -m cosmic_ray.cli exec "$m.toml" "$m.sqlite"
  "$PY" - "$m" "$m.sqlite" "$OUT" <<'EOF'
import sys
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome
name, path, out = sys.argv[1:]
with use_db(path, WorkDB.Mode.open) as db, open(out, "a") as f:
    ran = [(i, r) for i, r in db.results if r.worker_outcome != WorkerOutcome.SKIPPED]
    survived = [(i, r) for i, r in ran if r.test_outcome == TestOutcome.SURVIVED]
    for job, r in survived:
        f.write(f"== {name} {job}\n{r.diff}\n")
    rate = 100 * len(survived) / max(len(ran), 1)
    print(f"MUTATION {name}: {len(ran)} run, {len(survived)} survived ({rate:.0f}%)")
EOF
done
