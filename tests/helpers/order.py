"""The order in which the test files are handed to pytest-xdist's workers: the longest first.

`scripts/test.sh` runs the files on a few workers (`--dist loadfile`, a file to a worker). Handed out in
collection order, or by number of tests (xdist's own reordering), the files with one or two long end-to-end
tests (the README's commands, the kill tests, elastic torchrun) came last, and the suite ended on a stretch
where all workers waited on processes that sleep between kills and steps while the cores idled. Longest first
(the classic LPT rule for packing jobs onto machines) leaves the short unit files to fill the end.

The seconds per file are recorded from a run (`./scripts/test.sh --write-file-seconds`) into
`tests/file_seconds.json`; xdist's per-file scheduling has no notion of cost, and pytest-split's recorded
durations split a suite across CI machines rather than order one machine's queue. A file missing from the
record (a new one) goes first: it costs at most a worse place for the file than a right guess would give.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tideborn.safefile import write_atomically

SECONDS_FILE = Path(__file__).resolve().parents[1] / "file_seconds.json"


class DamagedRecord(Exception):
    """The record is not one `record` writes (one line saying so, naming the file)."""


def recorded_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """{test file relative to the repository: seconds its tests took in the recorded run}; empty if none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {str(name): float(seconds) for name, seconds in data["seconds"].items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedRecord(f"{path}: not a record of seconds per test file ({type(exc).__name__}: {exc}); "
                            f"remove it, or write it again with ./scripts/test.sh --write-file-seconds") from None


def longest_first(files: Iterable[str], seconds: dict[str, float]) -> list[str]:
    """`files` (each once) ordered by recorded seconds, longest first; unrecorded files before all the
    others in their given order; equal seconds keep their given order."""
    unique = list(dict.fromkeys(files))
    unknown = [f for f in unique if f not in seconds]
    known = sorted((f for f in unique if f in seconds), key=lambda f: -seconds[f])
    return unknown + known


def record(seconds_by_file: dict[str, float], path: Path = SECONDS_FILE) -> None:
    """The files just run, their seconds replacing those recorded (the others' kept: a run of some files
    updates those), written whole or not at all."""
    merged = {**recorded_seconds(path), **seconds_by_file}
    text = json.dumps({"about": "seconds each test file took in a whole run of ./scripts/test.sh; "
                                "written by --write-file-seconds, read to hand out the longest files first "
                                "(tests/helpers/order.py)",
                       "seconds": {name: round(value, 1) for name, value in sorted(merged.items())}},
                      indent=1)
    write_atomically(path, lambda out: out.write((text + "\n").encode("utf-8")))
