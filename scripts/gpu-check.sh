#!/usr/bin/env bash
# GPU check: the smoke config on CUDA, then the fast-path throughput sweep; figures in OUTDIR.
#   scripts/gpu-check.sh OUTDIR [--quick] [--peak-tflops N] [other benchmarks.gpu options]
# Needs a CUDA machine with torch, numpy and psutil (no network is used, and nothing else of the project's
# dependencies: cshogi, textual and the rest are not imported, so a stock PyTorch image runs it as it is).
# Python: $PYTHON if set, else ./.venv/bin/python if present, else python3. Whatever happens, it ends
# within 8 minutes: the sweep keeps to its own budget, and a hard limit interrupts it just before 8
# minutes, after which results.json/results.md still hold every configuration measured so far.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
fi
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: scripts/gpu-check.sh OUTDIR [--quick] [--peak-tflops N] [bench_gpu options]" >&2
    exit 2
fi
OUT="$1"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="python3"
fi
# The repository itself on the path, so an uninstalled checkout runs too.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
missing="$("$PY" - <<'PY'
import importlib.util
print(" ".join(m for m in ("torch", "numpy", "psutil") if importlib.util.find_spec(m) is None))
PY
)"
if [[ -n "$missing" ]]; then
    echo "gpu-check: error: $PY lacks $missing; install them first" >&2
    exit 2
fi
mkdir -p "$OUT"
# SIGINT first (the tool writes its partial results), SIGKILL 10 s later if it is still there.
exec timeout --signal=INT --kill-after=10 465 "$PY" -m benchmarks.gpu --out "$OUT" "$@"
