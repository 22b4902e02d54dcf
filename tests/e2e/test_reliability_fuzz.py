"""Fuzzing (hypothesis, bounded): bad input ends in a clear error or correct handling, never a crash.

- `--set` strings and config files, through `tideborn.config.load.load_settings`: a valid Settings or a
  `UserError`, never another exception; a quoted string value round-trips exactly.
- event lines (random bytes, torn lines, wrong types, huge lines), through `EventReader` and through
  what status, watch and the TUI build on it (`RunTracker`, the status report and its text, watch's text
  lines): valid lines come back exactly, bad ones are counted, nothing raises or hangs.
- hcpe and psv bytes, through the record files, the decoder and `data verify`: a `UserError` or a
  skipped/refused record. cshogi is C++ and a bad position could crash the process, so this fuzz runs in
  a subprocess: a segfault is a failed test, not a dead pytest.
- checkpoint files (random, truncated, bit-flipped), through `load_checkpoint`: `CheckpointError` or a
  checkpoint, nothing else (also in a subprocess, for the same reason).

Examples are derandomized (the same cases every run, so CI is stable); TIDEBORN_FUZZ_SCALE=10 tries ten
times as many.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import stat
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import tomlkit
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.helpers.common import REPO_ROOT, child_env
from tests.helpers.reliability import toml_string
from tideborn.config.load import load_settings
from tideborn.config.schema import SECTIONS
from tideborn.errors import UserError
from tideborn.rundir import report as report_text
from tideborn.rundir.events import EventReader, well_formed
from tideborn.rundir.layout import EVENTS_FILE, LOG_FILE, PID_FILE
from tideborn.rundir.state import RunTracker
from tideborn.tools import train_run

SCALE = float(os.environ.get("TIDEBORN_FUZZ_SCALE", "1"))
TIMEOUT = 120  # a hang fails the test (pytest-timeout); not a performance figure


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


TRIED: dict[str, int] = {}


def tried(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


@pytest.fixture(autouse=True, scope="module")
def report_cases_tried():
    yield
    print(f"\nfuzz cases tried: {json.dumps(TRIED)}")


# -- settings ---------------------------------------------------------------------------------------------

KEYS = [f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
STRING_KEYS = ["paths.data_root", "paths.runs_root", "runtime.out_dir", "run.init_checkpoint"]


FRAGMENTS = st.sampled_from(['"', "'", "[", "]", "{", "}", "=", "#", "\n", "\\", ",", ".", "nan", "inf", "-inf",
                             "true", "false", "1979-05-27T07:32:00Z", "07:32:00", "0x1F", "1_000", "1e400",
                             '"""', "'''", "\x00", " ", "cuda", "cuda:0", "resnet2x32"])
SCALARS = st.one_of(
    st.integers().map(str),
    st.integers(min_value=-10**500, max_value=10**500).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.booleans().map(lambda b: str(b).lower()),
    st.text(max_size=20).map(toml_string),
    st.text(max_size=20),
    st.lists(FRAGMENTS, max_size=8).map("".join),
)
RAW_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
    st.dictionaries(st.sampled_from(["a", "b", "kind"]), inner, max_size=3).map(
        lambda d: "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"),
), max_leaves=8)
DEEP = st.integers(min_value=500, max_value=20_000).map(lambda n: "[" * n + "1" + "]" * n)
OVERRIDES = st.one_of(
    st.tuples(st.sampled_from(KEYS), st.one_of(RAW_VALUES, DEEP)).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.tuples(st.text(max_size=20), RAW_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.text(max_size=40),
)
FLAG_CHOICES = (("type", ["dl", "nnue"]), ("network", ["resnet2x32", "resnet5x64"]), ("mode", ["scratch", "finetune"]))
FLAGS = st.fixed_dictionaries({name: st.one_of(st.none(), st.text(max_size=12), st.sampled_from(choices))
                               for name, choices in FLAG_CHOICES})


def settings_or_user_error(config: Path | None = None, overrides: typing.Sequence[str] = (),
                           flags: dict | None = None):
    try:
        return load_settings(config, overrides, flags, environ={}, cwd=config.parent if config else Path("/"))
    except UserError as exc:
        assert str(exc).strip(), "a UserError without a message"
        return None


@fuzz_settings(400)
@given(overrides=st.lists(OVERRIDES, max_size=4), flags=FLAGS)
def test_any_set_strings_end_in_settings_or_a_user_error(overrides, flags):
    tried("--set strings")
    resolved = settings_or_user_error(None, overrides, flags)
    if resolved is not None:
        json.dumps(resolved.settings.to_dict(), allow_nan=False)  # what the trainer and `config` print


@fuzz_settings(200)
@given(key=st.sampled_from(STRING_KEYS), text=st.text(min_size=1, max_size=60))
def test_a_quoted_string_value_round_trips_exactly(key, text):
    tried("--set round trip")
    resolved = settings_or_user_error(None, [f"{key}={toml_string(text)}"])
    section, name = key.split(".")
    if "\x00" in text:
        assert resolved is None
    else:
        assert resolved is not None and getattr(getattr(resolved.settings, section), name) == text


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=16)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10)
TABLE = st.dictionaries(st.one_of(st.sampled_from([k.split(".")[1] for k in KEYS]), st.text(max_size=10)),
                        JSON_VALUES, max_size=5)
CONFIG_DATA = st.dictionaries(st.one_of(st.sampled_from(list(SECTIONS)), st.text(max_size=10)),
                              st.one_of(TABLE, JSON_VALUES), max_size=4)
REAL_CONFIGS = [path.read_text() for path in sorted((REPO_ROOT / "configs").glob("*.toml"))]


@st.composite
def config_files(draw) -> tuple[str, bytes]:
    how = draw(st.sampled_from(["toml", "json", "mutated", "bytes"]))
    if how == "bytes":
        return draw(st.sampled_from([".toml", ".json"])), draw(st.binary(max_size=300))
    if how == "mutated":
        text = draw(st.sampled_from(REAL_CONFIGS))
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(text)))
            cut = draw(st.integers(0, 40))
            text = text[:at] + draw(st.one_of(st.text(max_size=20), FRAGMENTS, RAW_VALUES)) + text[at + cut:]
        return ".toml", text.encode("utf-8", "surrogatepass")
    data = draw(CONFIG_DATA)
    if how == "json":
        return ".json", json.dumps(data).encode()
    try:
        return ".toml", tomlkit.dumps(data).encode()
    except Exception:  # noqa: BLE001 - tomlkit cannot write every Python value (None, say): not our input
        assume(False)
        raise


@fuzz_settings(300)
@given(config=config_files())
def test_any_config_file_ends_in_settings_or_a_user_error(tmp_path_factory, config):
    tried("config files")
    suffix, content = config
    path = tmp_path_factory.mktemp("config") / f"fuzzed{suffix}"
    path.write_bytes(content)
    resolved = settings_or_user_error(path)
    if resolved is not None:
        json.dumps(resolved.settings.to_dict(), allow_nan=False)


# -- events -----------------------------------------------------------------------------------------------

KINDS = ["run_started", "step", "eval", "checkpoint_saved", "gpu", "warning", "run_finished", "run_stopped",
         "run_failed", "anomaly", "watchdog", "something_new"]
ODD = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["nan", "inf", "-inf", "", "x"]),
                st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                            st.integers(), max_size=2))
FIELD_NAMES = ["step", "time", "pid", "host", "launcher_pid", "max_steps", "batch_size", "loss", "policy_loss",
               "value_loss", "lr", "grad_norm", "positions_per_second", "error", "reason", "checkpoint", "path",
               "bytes", "message", "resumed_from", "settings", "devices", "elapsed_seconds", "policy_accuracy",
               "value_accuracy", "rule", "evidence", "v", "trip_step", "median", "factor", "consecutive",
               "grad_norm_max", "grad_norms", "eval_scales", "policy_accuracy_legal"]


# The strategies the composites below draw from, built once: built inside them, hypothesis would build and
# check them again for every line of every example (most of these tests' time), for the same draws.
EVENT_KINDS = st.one_of(st.sampled_from(KINDS), st.text(max_size=8))
EVENT_FIELDS = st.lists(st.sampled_from(FIELD_NAMES), max_size=8, unique=True)
EVENT_STEPS = st.integers(min_value=0, max_value=10**6)
EVENT_TIMES = st.floats(min_value=0, max_value=4e9)
EVENT_PIDS = st.sampled_from([1, os.getpid(), 2**22 + 7])


@st.composite
def events(draw) -> dict:
    """An event line's object: a real kind (mostly), with fields of the right or of any type."""
    event = {"kind": draw(EVENT_KINDS)}
    for name in draw(EVENT_FIELDS):
        event[name] = draw(ODD)
    if draw(st.booleans()):
        event["step"] = draw(EVENT_STEPS)
    if draw(st.booleans()):
        event["time"] = draw(EVENT_TIMES)
    if event["kind"] in ("run_started", "step") and draw(st.booleans()):
        event.setdefault("pid", draw(EVENT_PIDS))
    return event


EVENTS = events()
LINE_COUNTS = st.integers(0, 25)
LINE_FORMS = st.sampled_from(["event", "event", "event", "bytes", "json", "blank"])
NOT_UTF8_TAILS = st.binary(max_size=40)
NOT_EVENTS = st.one_of(JSON_VALUES, st.dictionaries(st.text(max_size=5).filter(lambda k: k != "kind"), JSON_VALUES,
                                                    max_size=3),
                       st.builds(lambda v: {"kind": v}, JSON_VALUES.filter(lambda v: not isinstance(v, str))))
BLANK_LINES = st.sampled_from([b"", b" ", b"\t", b"\r"])


@st.composite
def event_lines(draw) -> tuple[list[bytes], list[dict], int]:
    """(lines without newlines, the events among them in order, how many are malformed)."""
    lines, good, bad = [], [], 0
    for _ in range(draw(LINE_COUNTS)):
        what = draw(LINE_FORMS)
        if what == "event":  # a real kind mostly, but `time` or `step` may be of the wrong type
            event = draw(EVENTS)
            lines.append(json.dumps(event).encode())
            if well_formed(event):
                good.append(event)
            else:
                bad += 1
        elif what == "bytes":  # never JSON: not valid UTF-8
            lines.append(b"\xff" + draw(NOT_UTF8_TAILS).replace(b"\n", b""))
            bad += 1
        elif what == "json":  # JSON, but not an event object
            value = draw(NOT_EVENTS)
            assume(not (isinstance(value, dict) and isinstance(value.get("kind"), str)))
            lines.append(json.dumps(value).encode())
            bad += 1
        else:
            lines.append(draw(BLANK_LINES))
    return lines, good, bad


def test_what_makes_an_event_line_well_formed() -> None:
    assert well_formed({"kind": "step", "time": 1.5, "step": 3}) and well_formed({"kind": "x"})
    for broken in ({"time": 1.0}, {"kind": 3}, {"kind": "step", "time": "nan"}, {"kind": "step", "time": [0]},
                   {"kind": "step", "time": True}, {"kind": "step", "step": "3"}, {"kind": "step", "step": -1},
                   {"kind": "step", "step": 2.0}, {"kind": "step", "step": None}, ["kind"]):
        assert not well_formed(broken), broken


def strip_line(event: dict) -> dict:
    return {k: v for k, v in event.items() if k != "_line"}


def same_json(a: object, b: object) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@fuzz_settings(300)
@given(data=event_lines(), torn=st.binary(max_size=50).map(lambda b: b.replace(b"\n", b"")),
       cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=6))
def test_event_reader_returns_every_good_line_exactly_and_counts_the_bad(tmp_path_factory, data, torn, cuts):
    tried("event streams")
    lines, good, bad = data
    content = b"".join(line + b"\n" for line in lines) + torn
    path = tmp_path_factory.mktemp("events") / EVENTS_FILE
    reader = EventReader(path)
    got: list[dict] = []
    written = 0
    # Appended in pieces, read after each: torn lines at random places, as a live writer makes them.
    for cut in sorted({min(c, len(content)) for c in cuts} | {len(content)}):
        with open(path, "ab") as handle:
            handle.write(content[written:cut])
        written = cut
        got += reader.read_new()
    assert len(got) == len(good) and all(same_json(strip_line(a), b) for a, b in zip(got, good))
    assert reader.malformed == bad


RUN_STATUS_CODES = (0, 1, 2, 3)


def run_status(run_dir: Path, *extra: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train_run.main(["status", "--out-dir", str(run_dir), *extra])
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, out.getvalue()


PID_FILES = st.one_of(
    st.binary(max_size=60),
    st.fixed_dictionaries({"pid": ODD, "start_time": ODD, "host": ODD, "started_at": ODD},
                          optional={"log_offset": ODD, "events_offset": ODD, "events_inode": ODD, "argv": ODD}
                          ).map(lambda d: json.dumps(d).encode()),
    st.builds(lambda pid, offset: json.dumps({"v": 1, "pid": pid, "start_time": 0.0, "host": os.uname().nodename,
                                              "argv": [], "started_at": 0.0, "log_offset": offset}).encode(),
              st.sampled_from([1, os.getpid(), 2**22 + 7]), st.integers(0, 10**6)),
)
LOG_LINES = ["Traceback (most recent call last):", "  File \"x.py\", line 1", "RuntimeError: CUDA error: misaligned",
             "torch.OutOfMemoryError: CUDA out of memory", "NCCL error", "=== launch",
             "[rank1]: Traceback (most recent call last):", "ok", ""]
LOGS = st.one_of(st.binary(max_size=200),
                 st.lists(st.sampled_from(LOG_LINES), max_size=12).map(lambda lines: "\n".join(lines).encode()))


@fuzz_settings(200)
@given(data=event_lines(), torn=st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
       pid_file=st.one_of(st.none(), PID_FILES), log=st.one_of(st.none(), LOGS),
       start=st.sampled_from(["beginning", "tail", "end"]))
def test_status_watch_and_the_tracker_survive_any_events_file(tmp_path_factory, data, torn, pid_file, log, start):
    tried("run directories")
    lines, good, bad = data
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / EVENTS_FILE).write_bytes(b"".join(line + b"\n" for line in lines) + torn)
    if pid_file is not None:
        (run_dir / PID_FILE).write_bytes(pid_file)
    if log is not None:
        (run_dir / LOG_FILE).write_bytes(log)

    try:
        tracker = RunTracker(run_dir, start=start)
    except UserError as exc:  # a train.pid that `start` did not write: status says so and exits 2
        assert "not a train.pid written by train_run start" in str(exc)
        assert run_status(run_dir)[0] == 2
        return
    update = tracker.refresh()
    if start == "beginning":
        assert len(update.events) == len(good) and tracker.events.malformed == bad
    tracker.finish_log()
    report = tracker.status()
    json.dumps(report.to_json(), allow_nan=False)  # status --json prints it
    report_text.status_text(report)
    for event in update.events:  # what watch prints, in both formats
        report_text.event_text(event)
        json.dumps({k: v for k, v in event.items() if not k.startswith("_")})
    for anomaly in update.anomalies:
        train_run._anomaly_line(anomaly, text=True)
        train_run._anomaly_line(anomaly, text=False)
    for extra in ((), ("--json",)):
        code, out = run_status(run_dir, *extra)
        assert code in RUN_STATUS_CODES and out


def nested(depth: int, how: str) -> bytes:
    """JSON text nested `depth` deep: arrays, objects, or both in turn (possibly cut short)."""
    if how == "arrays":
        return b"[" * depth + b"1" + b"]" * depth
    if how == "objects":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b'[{"a":' * (depth // 2) + b"1" + b"}]" * (depth // 2)


DEEP_JSON = st.builds(nested, st.sampled_from([5, 99, 100, 101, 150, 2_000, 100_000]),
                      st.sampled_from(["arrays", "objects", "mixed"]))
DEEP_EVENT = st.builds(lambda value, cut: (b'{"kind":"eval","step":1,"x":' + value + b"}")[:cut or None],
                       DEEP_JSON, st.sampled_from([0, 0, 50]))
FILE_FORMS = ["absent", "file", "file", "file", "directory", "fifo", "socket", "symlink to a file",
              "symlink to a directory", "dangling symlink", "symlink loop", "symlink to /dev/zero",
              "symlink to /dev/null"]
NOT_READ = {"directory", "fifo", "socket", "symlink to a directory", "symlink loop", "symlink to /dev/zero",
            "symlink to /dev/null"}
"""Forms that are not a regular file (or cannot be resolved to one): readers must report them, not read them."""


RUN_FILE_FORMS = st.sampled_from(FILE_FORMS)
EVENT_FILE_LINES = event_lines()
DEEP_LINES = st.lists(st.one_of(DEEP_JSON, DEEP_EVENT), max_size=3)
PID_FILE_CONTENTS = st.one_of(PID_FILES, DEEP_JSON)
OTHER_CONTENTS = st.one_of(st.binary(max_size=40), DEEP_JSON)


@st.composite
def run_dir_contents(draw) -> dict[str, tuple[str, bytes]]:
    """For each run file: its form (FILE_FORMS) and, where it has content, the bytes."""
    contents: dict[str, tuple[str, bytes]] = {}
    for name in (EVENTS_FILE, LOG_FILE, PID_FILE, "launch.json", "archive"):
        form = draw(RUN_FILE_FORMS)
        if name == EVENTS_FILE:
            lines, _good, _bad = draw(EVENT_FILE_LINES)
            lines += draw(DEEP_LINES)
            content = b"".join(line + b"\n" for line in draw(st.permutations(lines)))
        elif name == LOG_FILE:
            content = draw(LOGS)
        elif name == PID_FILE:
            content = draw(PID_FILE_CONTENTS)
        else:
            content = draw(OTHER_CONTENTS)
        contents[name] = (form, content)
    return contents


def make_run_file(path: Path, form: str, content: bytes, outside: Path, depth: int) -> None:
    target = outside / f"target-{path.name}"
    if form == "file":
        path.write_bytes(content)
    elif form == "directory":  # nested directories, a file at the bottom
        inner = path
        for level in range(depth):
            inner = inner / f"level{level}"
        inner.mkdir(parents=True)
        (inner / path.name).write_bytes(content)
    elif form == "fifo":
        os.mkfifo(path)
    elif form == "socket":
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif form == "symlink to a file":
        target.write_bytes(content)
        path.symlink_to(target)
    elif form == "symlink to a directory":
        target.mkdir()
        path.symlink_to(target)
    elif form == "dangling symlink":
        path.symlink_to(outside / "nothing-here")
    elif form == "symlink loop":
        path.symlink_to(path.name)
    elif form.startswith("symlink to /dev/"):
        path.symlink_to(form.removeprefix("symlink to "))


@pytest.mark.timeout(TIMEOUT * SCALE)  # a reader that opens a FIFO blocks for good: a hang fails here
@fuzz_settings(150)
@given(contents=run_dir_contents(), depth=st.integers(1, 3), start=st.sampled_from(["beginning", "tail", "end"]))
def test_status_watch_the_tracker_and_the_tui_follower_survive_any_run_dir_contents(tmp_path_factory, contents,
                                                                                   depth, start):
    """File types (regular, directory, FIFO, socket, device), symlinks (to files, directories, devices,
    nowhere, themselves), nesting (directories, JSON nested up to 100,000 deep) for each run file: readers
    report what they cannot read as a `run_file` anomaly (or, status on a broken train.pid, exit 2), and
    never raise, hang or read a device."""
    from tideborn.tui.follow import RunFollower

    tried("run-directory contents")
    base = tmp_path_factory.mktemp("rd")
    run_dir, outside = base / "run", base / "outside"
    run_dir.mkdir()
    outside.mkdir()
    for name, (form, content) in contents.items():
        make_run_file(run_dir / name, form, content, outside, depth)

    tracker = RunTracker(run_dir, start=start, strict_pid_file=False)
    update = tracker.refresh()
    tracker.finish_log()
    report = tracker.status()
    json.dumps(report.to_json(), allow_nan=False)
    report_text.status_text(report)
    for event in update.events:  # what watch prints, in both formats
        report_text.event_text(event)
        json.dumps({k: v for k, v in event.items() if not k.startswith("_")})
    for anomaly in update.anomalies:
        train_run._anomaly_line(anomaly, text=True)
        train_run._anomaly_line(anomaly, text=False)
    reported = {a.evidence.get("file") for a in tracker.anomalies() if a.rule == "run_file"}
    for name in (EVENTS_FILE, LOG_FILE):
        assert (contents[name][0] in NOT_READ) == (name in reported), (name, contents[name][0], reported)

    follower = RunFollower(run_dir, use_nvml=False)
    for _ in range(2):
        follower.poll()
    assert {a.evidence.get("file") for a in follower.tracker.anomalies() if a.rule == "run_file"} == reported

    pid_form = contents[PID_FILE][0]
    try:
        RunTracker(run_dir, start=start)
    except UserError as exc:  # strict, as status is: a train.pid that `start` did not write is exit 2
        assert PID_FILE in str(exc) and pid_form != "absent"
        assert run_status(run_dir)[0] in (2, 3)  # 3: a train.pid that does not resolve, and no events.jsonl
        return
    for extra in ((), ("--json",)):
        code, out = run_status(run_dir, *extra)
        assert code in RUN_STATUS_CODES
        assert out or code == 3  # nothing but "no run here" prints nothing on stdout


def test_a_line_longer_than_the_read_limit_is_skipped_not_waited_for(tmp_path: Path) -> None:
    """A line with no newline for more than the reader's whole buffer (64 MiB) would stall a reader for
    good: it is counted malformed and the events after it are read."""
    from tideborn.rundir.events import encode_event

    path = tmp_path / EVENTS_FILE
    with open(path, "wb") as handle:
        handle.write(encode_event("run_started", {"step": 0, "pid": 1}))
        handle.write(b"\0" * (65 * 1024 * 1024) + b"\n")  # a crash on some filesystems leaves zeros like this
        handle.write(encode_event("step", {"step": 1, "loss": 1.0}))
    reader = EventReader(path)
    got = []
    for _ in range(5):
        got += reader.read_new()
    assert [e["kind"] for e in got] == ["run_started", "step"] and reader.malformed == 1
    tracker = RunTracker(tmp_path, start="beginning")
    assert [e["kind"] for e in tracker.refresh().events] == ["run_started", "step"]
    assert tracker.status().events_malformed == 1
    small = EventReader(path)  # the same with a small buffer, a piece at a time
    got = []
    for _ in range(100_000):
        got += small.read_new(max_bytes=4 * 1024 * 1024)
        if small.offset == path.stat().st_size:
            break
    assert [e["kind"] for e in got] == ["run_started", "step"] and small.malformed == 1


# -- teacher records and checkpoints, in a subprocess --------------------------------------------------------

RECORDS_FUZZ = r'''
import json, sys, tempfile
from pathlib import Path
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
sys.path.insert(0, sys.argv[1])
from tests.helpers.data import hcpe_records, psv_records, random_positions
from tideborn.data.tools.checks import verify_files
from tideborn.data.decode.features import BadRecord, Decoder
from tideborn.data.formats.records import RECORD_DTYPES, RecordSet
from tideborn.errors import UserError

examples = int(sys.argv[2])
positions = random_positions(64, seed=3)
valid = {"hcpe": hcpe_records(positions).tobytes(), "psv": psv_records(positions).tobytes()}
work = Path(tempfile.mkdtemp())
counts = {"files": 0, "user_errors": 0, "records": 0, "bad_records": 0, "decoded": 0}

@st.composite
def record_files(draw):
    kind = draw(st.sampled_from(["hcpe", "psv"]))
    size = RECORD_DTYPES[kind].itemsize
    how = draw(st.sampled_from(["flips", "flips", "records", "random", "cut"]))
    if how == "random":
        return kind, draw(st.binary(max_size=size * 8))
    data = bytearray(valid[kind][: size * draw(st.integers(1, 64))])
    if how == "records":  # whole records replaced with random bytes
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(data) // size - 1)) * size
            data[at:at + size] = draw(st.binary(min_size=size, max_size=size))
    else:
        for _ in range(draw(st.integers(1, 12))):
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))] + draw(st.binary(max_size=size))
    return kind, bytes(data)

@settings(max_examples=examples, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(record_file=record_files())
def fuzz(record_file):
    kind, data = record_file
    counts["files"] += 1
    path = work / f"fuzz.{kind}"
    path.write_bytes(data)
    verify_files([path], kind, progress=False)  # data verify: reports, never raises for bad records
    try:
        records = RecordSet([path], kind)
    except UserError:
        counts["user_errors"] += 1
        return
    decoder = Decoder(kind, eval_scale=756.0, value_lambda=0.333)
    batch = records.read(np.arange(len(records)))
    for i in range(len(batch)):  # one at a time: the batch decoder stops at the first bad record
        counts["records"] += 1
        try:
            decoded = decoder.decode(batch[i:i + 1])
            counts["decoded"] += len(decoded)
            counts["bad_records"] += len(decoded.skipped)
        except BadRecord:
            counts["bad_records"] += 1
    records.close()

fuzz()
print(json.dumps(counts))
'''

CHECKPOINT_FUZZ = r'''
import json, sys, tempfile, zipfile
from pathlib import Path
from hypothesis import HealthCheck, given, settings, strategies as st
from tideborn.network.checkpoint import CheckpointError, load_checkpoint

source, examples = Path(sys.argv[1]), int(sys.argv[2])
original = source.read_bytes()
with zipfile.ZipFile(source) as archive:  # where the pickle and the zip directory sit: flips there matter most
    info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    pickle_at, pickle_size = info.header_offset, info.compress_size + 100
work = Path(tempfile.mkdtemp())
counts = {"files": 0, "refused": 0, "loaded": 0}

@st.composite
def damaged(draw):
    how = draw(st.sampled_from(["truncate", "flip_pickle", "flip_tail", "flip_anywhere", "random", "splice"]))
    if how == "random":
        return draw(st.binary(max_size=2000))
    data = bytearray(original)
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "splice":
        at = draw(st.integers(0, len(data)))
        return bytes(data[:at]) + draw(st.binary(max_size=64)) + bytes(data[at + draw(st.integers(0, 64)):])
    lo, hi = {"flip_pickle": (pickle_at, pickle_at + pickle_size), "flip_tail": (len(data) - 4096, len(data)),
              "flip_anywhere": (0, len(data))}[how]
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(max(0, lo), min(len(data), hi) - 1))
        data[at] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)

@settings(max_examples=examples, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=damaged())
def fuzz(data):
    counts["files"] += 1
    path = work / "step-000000004.pt"
    path.write_bytes(data)
    try:
        payload = load_checkpoint(path)
    except CheckpointError as exc:
        assert str(exc).startswith(str(path)), exc
        counts["refused"] += 1
        return
    assert isinstance(payload, dict) and payload["step"] == 4
    counts["loaded"] += 1

fuzz()
print(json.dumps(counts))
'''


def shortened(text: str, width: int = 400) -> str:
    """Output with its long lines cut (hypothesis prints a failing 5 MB checkpoint in full)."""
    return "\n".join(line if len(line) <= width else f"{line[:width]}... ({len(line):,} chars)"
                     for line in text.splitlines()[-200:])


def run_fuzz_script(script: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO_ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, ("the fuzzed process failed (a negative status is a signal: -11 is a "
                                    f"segfault), exit {result.returncode}\n--- stdout\n{shortened(result.stdout)}"
                                    f"\n--- stderr\n{shortened(result.stderr)}")
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(TIMEOUT)
def test_fuzzed_hcpe_and_psv_files_end_in_a_user_error_or_skipped_records_never_a_crash() -> None:
    counts = run_fuzz_script(RECORDS_FUZZ, str(REPO_ROOT), str(int(300 * SCALE)))
    TRIED["record files"] = counts["files"]
    assert counts["user_errors"] > 0 and counts["bad_records"] > 0 and counts["decoded"] > 0, counts
    print(f"\nrecord files: {counts}")


@pytest.mark.timeout(TIMEOUT)
def test_fuzzed_checkpoint_files_end_in_checkpoint_error_never_anything_else(template_run: Path) -> None:
    counts = run_fuzz_script(CHECKPOINT_FUZZ, str(template_run / "step-000000004.pt"), str(int(150 * SCALE)))
    TRIED["checkpoint files"] = counts["files"]
    assert counts["refused"] > 0, counts
    print(f"\ncheckpoint files: {counts}")


def test_settings_the_fuzz_broke_are_user_errors_now() -> None:
    """Cases the fuzz found: each used to escape as OverflowError, RecursionError, TypeError or ValueError
    (a NUL reached the OS), or was half-used silently (a second TOML key after a newline)."""
    for item, pattern in [("run.network=1", r"run\.network expects a string, got 1 \(an integer\)"),
                          ("run.network=[[1]]", r"run\.network expects a string"),
                          ("optim.lr=1" + "0" * 400, r"expects a finite number"),
                          ("optim.betas=[1" + "0" * 400 + ", 0.9]", r"expects a list of 2 numbers"),
                          ("data.train=" + "[" * 5000, r"nested too deeply"),
                          ("runtime.seed=18446744073709551616", r"runtime\.seed must be <= 9223372036854775807"),
                          ("runtime.max_steps=1" + "0" * 12, r"runtime\.max_steps must be <= 999,999,999"),
                          ('runtime.out_dir="a\\u0000b"', r"must not contain a NUL character"),
                          ("optim.lr=1\nother = 2", r"is not a TOML value")]:
        with pytest.raises(UserError, match=pattern):
            load_settings(None, [item], environ={}, cwd=Path("/"))
    assert math.isfinite(load_settings(None, ["optim.lr=10"], environ={}, cwd=Path("/")).settings.optim.lr)


def test_event_fields_the_fuzz_broke_are_handled_now(tmp_path: Path) -> None:
    """A terminal event without `time` (KeyError in status) and a `time` past any calendar (OverflowError
    in watch's text lines) are shown, not raised."""
    from tideborn.rundir.events import encode_event

    with open(tmp_path / EVENTS_FILE, "wb") as handle:
        handle.write(encode_event("run_started", {"step": 0, "pid": 1}, now=67768036191676796))
        handle.write(b'{"kind":"run_finished","step":3}\n')
    tracker = RunTracker(tmp_path)
    update = tracker.refresh()
    texts = [report_text.event_text(e) for e in update.events]
    assert texts[0].startswith("? run_started") and " run_finished step=3" in texts[1]
    report = tracker.status()
    assert report.state == "finished" and report.terminal is not None and report.terminal.kind == "run_finished"
    assert run_status(tmp_path)[0] == 0


# -- the data tools' outputs ---------------------------------------------------------------------------------

OUTPUT_FORMS = ("absent", "regular", "directory", "fifo", "device", "link to a file", "link to a directory",
                "dangling link", "under a file", "name too long", "missing parent")


def make_output(path: Path, form: str, outside: Path) -> Path:
    """Put `form` at `path` (what a careless colleague or a hostile one leaves where an output goes); the
    path to give the tool."""
    if form == "regular":
        path.write_bytes(b"an older output\n")
    elif form == "directory":
        path.mkdir()
        (path / "keep").write_bytes(b"inside\n")
    elif form == "fifo":
        os.mkfifo(path)
    elif form == "device":
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    elif form == "link to a file":
        (outside / "target").write_bytes(b"someone else's file\n")
        path.symlink_to(outside / "target")
    elif form == "link to a directory":
        path.symlink_to(outside)
    elif form == "dangling link":
        path.symlink_to(outside / "nothing-here")
    elif form == "under a file":
        path.write_bytes(b"a file\n")
        return path / "out.hcpe"
    elif form == "name too long":
        return path.with_name("x" * 300 + ".hcpe")
    elif form == "missing parent":
        return path.parent / "new" / "deeper" / path.name
    return path


def tree_state(root: Path) -> dict[str, tuple[str, bytes | None]]:
    """Every entry under `root` (not following links): its type and, for regular files, its bytes."""
    state: dict[str, tuple[str, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
            state[str(path.relative_to(root))] = (stat.filemode(info.st_mode)[0], content)
    return state


def run_data_tool(argv: list[str]) -> tuple[int, str]:
    """`tideborn data ...` in this process (a subprocess per case would take minutes); its exit status and
    stderr. A hang (a FIFO opened for writing) fails the test through its timeout."""
    from tideborn.data.tools.cli import main as data_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = data_main(argv)
    return code, err.getvalue()


@pytest.fixture(scope="module")
def split_source(tmp_path_factory) -> Path:
    """Real converted games (random legal ones, in CSA): the input both tools read."""
    from tests.helpers.data import random_csa_games

    work = tmp_path_factory.mktemp("outputs-source")
    random_csa_games(work / "games", 12, seed=5)
    code, err = run_data_tool(["convert", str(work / "games"), "--output", str(work / "all.hcpe"), "--quiet"])
    assert code == 0, err
    return work


@pytest.mark.timeout(TIMEOUT * SCALE)
@fuzz_settings(120)
@given(tool=st.sampled_from(["convert", "split"]), form=st.sampled_from(OUTPUT_FORMS),
       other=st.sampled_from(OUTPUT_FORMS + ("the same file", "the same file in other case", "a hard link")),
       umask=st.sampled_from([0o000, 0o022]))
def test_data_tool_outputs_are_whole_regular_files_or_one_line_and_nothing_touched(tmp_path_factory, split_source,
                                                                                   tool, form, other, umask):
    """`data convert --output` and `data split --train --test` over every kind of thing at the output
    paths: either the outputs are new regular files, 0o644 whatever the umask, with their game indexes and
    no temp file beside them, or the tool says one line, exit 2, and every file and link that was there is
    as it was (nothing replaced, nothing written through a link, no temp file left)."""
    tried(f"data outputs {tool}")
    work = tmp_path_factory.mktemp("outputs")
    out_dir, outside = work / "out", work / "outside"
    out_dir.mkdir()
    outside.mkdir()
    if "device" in (form, other) and os.geteuid() != 0:
        assume(False)  # only root may make a device node
    first = make_output(out_dir / "train.hcpe", form, outside)
    if tool == "convert":
        argv = ["convert", str(split_source / "games"), "--output", str(first), "--quiet"]
        outputs = [first]
    else:
        if other == "the same file":
            second = first
        elif other == "the same file in other case":
            second = first.with_name(first.name.upper())
        elif other == "a hard link":
            try:
                assume(stat.S_ISREG(first.lstat().st_mode))  # a hard link needs a file to link to
            except OSError:
                assume(False)
            second = out_dir / "test.hcpe"
            os.link(first, second)
        else:
            second = make_output(out_dir / "test.hcpe", other, outside)
        argv = ["split", str(split_source / "all.hcpe"), "--train", str(first), "--test", str(second), "--quiet"]
        outputs = [first, second]
    before = tree_state(work)
    old_umask = os.umask(umask)
    try:
        code, err = run_data_tool(argv)
    finally:
        os.umask(old_umask)
    lines = err.strip().splitlines()
    leftovers = [p for p in out_dir.rglob("*") if ".tmp" in p.name]
    assert not leftovers, (argv, leftovers)
    if code == 0:
        for path in outputs:
            info = path.lstat()
            assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644, (argv, oct(info.st_mode))
            assert path.with_name(path.name.removesuffix(".hcpe") + ".games.csv").is_file(), argv
        assert tree_state(outside) == {k.removeprefix("outside/"): v for k, v in before.items()
                                       if k.startswith("outside/")}, "written through a link"
    else:
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, code, err)
        assert tree_state(work) == before, (argv, err)
