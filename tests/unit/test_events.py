"""The JSONL event stream as a reader sees it: torn tails, junk lines, non-finite numbers, offsets."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tideborn.rundir.events import EventReader, EventWriter, encode_event, read_events
from tideborn.rundir.kinds import Step, as_float


def line(kind: str, **fields: object) -> bytes:
    return encode_event(kind, fields, now=1.0)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_torn_last_line_is_held_back_until_its_newline_arrives(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    second = line("step", step=2, loss=1.5)
    append(path, line("step", step=1, loss=2.0) + second[:10])
    reader = EventReader(path)

    assert [e["step"] for e in reader.read_new()] == [1]
    assert reader.read_new() == []  # still torn: nothing new, and no malformed line counted
    assert reader.malformed == 0

    append(path, second[10:])
    completed = reader.read_new()
    assert [(e["kind"], e["step"], e["loss"]) for e in completed] == [("step", 2, 1.5)]
    assert reader.read_new() == []  # returned exactly once
    assert reader.malformed == 0


def test_malformed_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    append(path, b"this is not json\n" + b"[1, 2]\n" + b'{"no_kind": 1}\n' + b"\xff\xfe\n"
           + b"\n" + line("run_started", step=0) + b'{"kind": 5}\n' + line("step", step=1))
    reader = EventReader(path)

    events = reader.read_new()

    assert [e["kind"] for e in events] == ["run_started", "step"]
    assert reader.malformed == 5  # the blank line is not counted


def test_non_finite_floats_are_strict_json_and_read_back_with_as_float(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as writer:
        writer.emit(Step, step=3, loss=math.nan, policy_loss=math.inf, value_loss=-math.inf,
                    lr=0.5, nested={"g": [math.inf, 1.0]})

    raw = path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant} in {raw!r}")

    record = json.loads(raw, parse_constant=refuse)  # strict JSON: no NaN/Infinity tokens
    assert record["v"] == 1 and record["kind"] == "step" and isinstance(record["time"], float)
    assert (record["loss"], record["policy_loss"], record["value_loss"]) == ("nan", "inf", "-inf")
    assert record["nested"] == {"g": ["inf", 1.0]}

    event = read_events(path)[0]
    assert math.isnan(as_float(event["loss"]))
    assert as_float(event["policy_loss"]) == math.inf
    assert as_float(event["value_loss"]) == -math.inf
    assert as_float(event["lr"]) == 0.5


@pytest.mark.parametrize(("value", "expected"), [
    (3, 3.0), (2.5, 2.5), ("inf", math.inf), (None, None), (True, None), ("fast", None), ([1.0], None),
])
def test_as_float_accepts_numbers_and_the_non_finite_strings_only(value: object, expected: float | None) -> None:
    result = as_float(value)
    assert result == expected and type(result) is type(expected)


def test_reads_incrementally_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = line("run_started", step=0) + line("step", step=1)
    append(path, first)
    reader = EventReader(path)
    assert [e["kind"] for e in reader.read_new()] == ["run_started", "step"]
    assert reader.offset == len(first)

    append(path, line("step", step=2) + line("run_finished", step=2))
    assert [(e["kind"], e["step"]) for e in reader.read_new()] == [("step", 2), ("run_finished", 2)]
    assert reader.read_new() == []

    # A reader that starts at a saved offset sees only what came after it.
    resumed = EventReader(path, offset=len(first))
    assert [e["step"] for e in resumed.read_new()] == [2, 2]


def test_reads_in_bounded_chunks_without_losing_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    append(path, b"".join(line("step", step=i) for i in range(1, 51)))
    reader = EventReader(path)
    seen: list[int] = []
    while batch := reader.read_new(max_bytes=200):
        seen.extend(e["step"] for e in batch)
    assert seen == list(range(1, 51))


def test_a_replaced_or_truncated_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("step", step=1) + line("step", step=2))
    reader = EventReader(path)
    assert len(reader.read_new()) == 2

    path.write_bytes(line("run_started", step=0))  # shorter than the offset: a new file
    assert [e["kind"] for e in reader.read_new()] == ["run_started"]

    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(line("run_started", step=0) + line("step", step=7))
    replacement.replace(path)  # same size or not, another inode is another file
    assert [e.get("step") for e in reader.read_new()] == [0, 7]


def test_a_missing_file_reads_as_no_events(tmp_path: Path) -> None:
    reader = EventReader(tmp_path / "not-yet.jsonl")
    assert reader.read_new() == []
    assert read_events(tmp_path / "not-yet.jsonl") == []


def test_writer_appends_one_line_per_event_and_refuses_after_close(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line("run_started", step=0))
    writer = EventWriter(path)
    returned = writer.emit(Step, step=1, loss=0.25)
    writer.close()

    assert returned["kind"] == "step" and returned["loss"] == 0.25
    assert [e["kind"] for e in read_events(path)] == ["run_started", "step"]
    with pytest.raises(ValueError, match="closed"):
        writer.emit(Step, step=2)
