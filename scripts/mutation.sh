#!/usr/bin/env bash
# Mutation testing (cosmic-ray) of the core modules, each against its own test files, on a
# seeded random sample of its mutants. Not run by CI: a mutant costs one run of those tests.
#
# usage: bash scripts/mutation.sh [MUTANTS_PER_MODULE=8] [SEED=0] [MODULE...]
#   BEFORE=<git ref>  also run the same mutants against that commit's tests first, and
#                     against this tree's tests only those that survived them (the
#                     "before" and "after" survival rates of one sample)
# cosmic-ray edits the file it mutates in place, so it works on a copy of HEAD (committed
# code only) in a temporary directory, never on this tree. It prints each module's counts
# and writes the diffs of the mutants that survive to $OUT (default mutants.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY="$ROOT/.venv/bin/python"
N="${1:-8}"
SEED="${2:-0}"
shift $(($# < 2 ? $# : 2))
MODULES=("$@")
[ ${#MODULES[@]} -gt 0 ] || MODULES=(_core/run _calls/maps ops/ordering ops/combine ops/interleave ops/cache)
OUT="${OUT:-$ROOT/mutants.txt}"
"$PY" -c "import cosmic_ray" 2>/dev/null || {
  echo "needs cosmic-ray: .venv/bin/python -m pip install -c scripts/constraints.txt -e '.[mutation]'" >&2
  exit 2
}

# the test files that exercise each module (the whole suite would take minutes per mutant)
declare -A TESTS=(
  [_core/run]="test_runtime.py test_pipeline.py"
  [_calls/maps]="test_calls.py test_procs.py"
  [ops/ordering]="test_ordering.py"
  [ops/combine]="test_combine.py test_combine_sampling.py"
  [ops/interleave]="test_interleave.py test_io_npy.py"
  [ops/cache]="test_cache.py"
)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git archive HEAD | tar -x -C "$WORK"
if [ -n "${BEFORE:-}" ]; then
  mkdir "$WORK/old" && git archive "$BEFORE" tests | tar -x -C "$WORK/old"
fi
: >"$OUT"
cd "$WORK"

config() { # module, tests directory, session name
  local files=""
  for f in ${TESTS[$1]}; do [ -f "$2/$f" ] && files+=" $2/$f"; done
  cat >"$3.toml" <<EOF
[cosmic-ray]
module-path = "aioflow/$1.py"
timeout = 240.0
excluded-modules = []
test-command = "$PY -m pytest -x -q -p no:cacheprovider$files"

[cosmic-ray.distributor]
name = "local"
EOF
}

for m in "${MODULES[@]}"; do
  n="${m//\//.}"
  config "$m" tests "$n"
  "$PY" -m cosmic_ray.cli init "$n.toml" "$n.sqlite" >/dev/null
  # a sample that does not depend on the job ids (random at each init): by position
  "$PY" - "$n.sqlite" "$N" "$SEED" <<'EOF'
import random, sys
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult
path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with use_db(path, WorkDB.Mode.open) as db:
    def where(item):
        m = item.mutations[0]
        return (str(m.module_path), m.operator_name, m.occurrence)
    items = sorted(db.work_items, key=where)
    keep = {i.job_id for i in random.Random(seed).sample(items, min(n, len(items)))}
    for item in items:
        if item.job_id not in keep:
            db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    print(f"{path}: {len(keep)} of {len(items)} mutants sampled", file=sys.stderr)
EOF
  if [ -n "${BEFORE:-}" ]; then
    cp "$n.sqlite" "$n-before.sqlite"
    config "$m" old/tests "$n-before"
    "$PY" -m cosmic_ray.cli exec "$n-before.toml" "$n-before.sqlite"
    # this tree's tests are a superset: what the old ones killed stays killed
    "$PY" - "$n-before.sqlite" "$n.sqlite" <<'EOF'
import sys
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome
with use_db(sys.argv[1], WorkDB.Mode.open) as old, use_db(sys.argv[2], WorkDB.Mode.open) as new:
    for job, r in old.results:
        if r.test_outcome != TestOutcome.SURVIVED:
            new.set_result(job, r)
EOF
  fi
  "$PY" -m cosmic_ray.cli exec "$n.toml" "$n.sqlite"
  for s in ${BEFORE:+"$n-before"} "$n"; do
    "$PY" - "$s" "$s.sqlite" "$OUT" <<'EOF'
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
done
