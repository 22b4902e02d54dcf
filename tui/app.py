"""Entry point of `tideborn-tui`. The Textual monitor is not built yet; until it is, this says so
and points at the run tools that already report on a run."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("tideborn-tui: the monitor is not built yet; meanwhile use "
          "`python -m tideborn.tools.train_run status --out-dir RUN_DIR` (or `watch`).", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
