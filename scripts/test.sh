#!/usr/bin/env bash
# The README's test command: make .venv, install aioflow with its test extras, run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check --no-input -q)
"${PIP[@]}" --upgrade pip
# torch (pulled in by the integration extras) must be the local CPU build, installed first.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -c scripts/constraints.txt -e ".[test,dev]"
.venv/bin/python -m ruff check aioflow
.venv/bin/python -m mypy aioflow
.venv/bin/python -m pytest -q "$@"
