#!/usr/bin/env bash
# The README's test command: make a venv, install aioflow with its test extras, run the suite.
#   PYTHON  the interpreter to test with (default python3)
#   VENV    the venv folder (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check --no-input -q)
"${PIP[@]}" --upgrade pip
EXTRAS="test,dev"
# torch must be the local CPU build, installed first; only CPython 3.11 has one on this kind of
# machine. Elsewhere torch would be a multi-GB CUDA download, so its integration tests skip.
if "$VPY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    "${PIP[@]}" "torch==2.13.0"
    EXTRAS="test,torch,dev"
else
    echo "scripts/test.sh: $("$VPY" -V): torch is not installed, its integration tests skip"
fi
"${PIP[@]}" -c scripts/constraints.txt -e ".[$EXTRAS]"
"$VPY" -m ruff check aioflow
"$VPY" -m ruff format --check aioflow
"$VPY" -m mypy aioflow
# the layers of docs/architecture.md (pyproject.toml [tool.importlinter])
"$VENV/bin/lint-imports"
exec "$VPY" -m pytest -q "$@"
