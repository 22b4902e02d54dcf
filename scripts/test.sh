#!/usr/bin/env bash
# Run the test suite in ./.venv, creating/updating it first (a quiet no-op when up to date), spread over
# this machine's CPU cores by pytest-xdist, one process more than the cores (TIDEBORN_TEST_WORKERS=N for N
# processes, 0 for none; `-n 0` among the arguments does the same).
#   ./scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
"$ROOT/scripts/setup.sh" --quiet
cd "$ROOT"
# The suite starts a couple of hundred Python processes (trainers, run tools, pytest's own collections) that
# import the same modules: let them share compiled bytecode, and pytest its rewritten test modules, even where
# the environment turns those caches off (they go to __pycache__, which git ignores).
unset PYTHONDONTWRITEBYTECODE
# One worker more than the cores: many end-to-end tests wait on a process they started (a trainer reaching a
# step, a signal's effect), and the extra worker keeps the cores busy meanwhile (the suite is CPU-bound).
# loadfile: a file's tests run in one process, so a module-scoped trained run is made once. The files are handed
# out longest first (tests/helpers/order.py orders them; --no-loadscope-reorder keeps xdist from re-sorting).
exec .venv/bin/python -m pytest -n "${TIDEBORN_TEST_WORKERS:-$(( $(nproc) + 1 ))}" --dist loadfile --no-loadscope-reorder "$@"
