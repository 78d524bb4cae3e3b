#!/usr/bin/env bash
# The README's first command: make .venv, install aioflow (with uvloop), run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --disable-pip-version-check --no-input -q -e ".[fast]"
exec .venv/bin/python -m aioflow demo "$@"
