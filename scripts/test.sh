#!/usr/bin/env bash
# Run the test suite in ./.venv, creating/updating it first (a quiet no-op when up to date).
#   ./scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
"$ROOT/scripts/setup.sh" --quiet
cd "$ROOT"
exec .venv/bin/python -m pytest "$@"
