"""`data.watch` and `data.window_positions`: which files join a watched set and when (complete files only), the
sliding window of the newest positions, the `data_window` event and status, and exact resume of a watched run."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.common import assert_same_tensors, events_of, train
from tests.helpers.data import hcpe_records, random_positions, settings_for, write_records
from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.config.load import load_settings
from tideborn.data.cache.hcpe3 import content_hash
from tideborn.data.sets.sources import count_file, derived_files
from tideborn.data.training.watch import DataWatch
from tideborn.errors import UserError
from tideborn.rundir.kinds import DataWindow, parse_event
from tideborn.trainer.state import teacher_batches


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games(12)


def _aged(path: Path, seconds: float = 600) -> Path:
    """`path` last written `seconds` ago (and so quiet for longer than any rescan interval here)."""
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _watch(folder: Path, window: int = 0, rescan: float = 30.0) -> tuple[DataWatch, list[Path], Clock]:
    counted: list[Path] = []
    clock = Clock()

    def count(path: Path) -> tuple[int, str]:
        counted.append(path)
        return count_file(path)

    return DataWatch([str(folder / "*")], count, window, rescan, clock), counted, clock


def test_a_renamed_file_joins_at_once_and_a_growing_one_only_when_still(tmp_path, games):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    watch, counted, _ = _watch(folder)
    # by rename: written elsewhere (its mtime from then), moved in after: the rename is later than its last write
    staged = tmp_path / "staged.hcpe3"
    write_hcpe3(staged, games[:2], seed=1)
    _aged(staged, 5)
    os.rename(staged, folder / "a.hcpe3")
    # growing: written in place, just now
    write_hcpe3(folder / "b.hcpe3", games[2:3], seed=2)
    first = watch.scan()
    assert [Path(j.path).name for j in first.joined] == ["a.hcpe3"]
    assert first.growing == [str(folder / "b.hcpe3")]
    assert folder / "b.hcpe3" not in counted  # a file still being written is not read
    with open(folder / "b.hcpe3", "ab") as handle:  # more games appended: still growing
        write_hcpe3(tmp_path / "more.hcpe3", games[3:4], seed=3)
        handle.write((tmp_path / "more.hcpe3").read_bytes())
    second = watch.scan()
    assert second.growing == [str(folder / "b.hcpe3")] and not second.joined
    third = watch.scan()  # unchanged since the last scan: complete, and it parses whole
    assert [Path(j.path).name for j in third.joined] == ["b.hcpe3"]
    assert [Path(j.path).name for j in watch.joined] == ["a.hcpe3", "b.hcpe3"]  # arrival order
    assert watch.generation == 2


def test_a_half_written_game_never_joins_and_a_non_hcpe3_file_is_said_once(tmp_path, games):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    whole = tmp_path / "whole.hcpe3"
    write_hcpe3(whole, games[:2], seed=4)
    data = whole.read_bytes()
    (folder / "cut.hcpe3").write_bytes(data[:len(data) - 50])  # the last game cut short
    (folder / "notes.txt").write_text("not training data\n")
    for path in folder.iterdir():
        _aged(path)
    watch, _, _ = _watch(folder)
    first = watch.scan()
    assert not first.joined and not watch.joined
    refused = dict(first.refused)
    assert set(refused) == {str(folder / "cut.hcpe3"), str(folder / "notes.txt")}
    assert "extension" in refused[str(folder / "notes.txt")]
    assert len(first.warnings()) == 2 and all("\n" not in text for text in first.warnings())
    assert not watch.scan().refused  # said once, while the file stays as it is
    (folder / "cut.hcpe3").write_bytes(data)  # the producer finishes the game
    _aged(folder / "cut.hcpe3")
    assert [Path(j.path).name for j in watch.scan().joined] == ["cut.hcpe3"]


def test_a_changed_or_vanished_file_leaves_with_a_warning_and_is_not_read_again(tmp_path, games):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    for name, seed in (("a.hcpe3", 1), ("b.hcpe3", 2)):
        write_hcpe3(folder / name, games[seed:seed + 2], seed=seed)
        _aged(folder / name)
    watch, counted, _ = _watch(folder)
    assert len(watch.scan().joined) == 2
    with open(folder / "a.hcpe3", "ab") as handle:
        handle.write(b"\0" * 10)
    (folder / "b.hcpe3").unlink()
    result = watch.scan()
    left = dict(result.left)
    assert set(left) == {str(folder / "a.hcpe3"), str(folder / "b.hcpe3")}
    assert left[str(folder / "a.hcpe3")].startswith("it changed after joining (size ")
    assert left[str(folder / "b.hcpe3")] == "the file is gone"
    assert all(text.startswith("data.watch: ") for text in result.warnings())
    assert watch.joined == [] and watch.generation == 2
    counted.clear()
    _aged(folder / "a.hcpe3")
    assert not watch.scan().joined and counted == []  # never re-read under that name


def _rewrite_keeping_size_and_mtime(path: Path, positions_seed: int) -> None:
    """Other records of the same size written over `path`, its mtime put back: only the ctime tells."""
    before = path.stat()
    records = hcpe_records(random_positions(before.st_size // 38, seed=positions_seed), seed=positions_seed)
    with open(path, "r+b") as handle:
        handle.write(records.tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


def _hcpe_folder(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "selfplay"
    folder.mkdir()
    for seed, name in enumerate(names):
        write_records(folder / name, hcpe_records(random_positions(40, seed=seed), seed=seed))
        _aged(folder / name)
    return folder


def test_a_rewrite_in_place_that_keeps_size_and_mtime_is_seen_and_a_chmod_is_not_a_change(tmp_path):
    folder = _hcpe_folder(tmp_path, "a.hcpe", "b.hcpe")
    watch, counted, _ = _watch(folder)
    assert len(watch.scan().joined) == 2
    (folder / "b.hcpe").chmod(0o600)  # the ctime moves, the content does not: read again, and it stays
    counted.clear()
    result = watch.scan()
    assert not result.changed and not result.warnings() and counted == [folder / "b.hcpe"]
    assert not watch.scan().changed and counted == [folder / "b.hcpe"]  # its new look is remembered
    _rewrite_keeping_size_and_mtime(folder / "a.hcpe", positions_seed=7)
    result = watch.scan()
    assert result.left == [(str(folder / "a.hcpe"), "it was rewritten in place (the same size and mtime, other "
                                                     "content)")]
    assert [Path(j.path).name for j in watch.joined] == ["b.hcpe"] and len(result.warnings()) == 1


def test_at_resume_a_rewrite_in_place_leaves_and_an_older_checkpoint_is_read_again(tmp_path):
    folder = _hcpe_folder(tmp_path, "a.hcpe", "b.hcpe")
    watch, _, _ = _watch(folder)
    watch.scan()
    state = json.loads(json.dumps(watch.state_dict()))  # as a checkpoint keeps it
    _rewrite_keeping_size_and_mtime(folder / "a.hcpe", positions_seed=8)
    resumed, counted, _ = _watch(folder)
    assert resumed.load_state_dict(state) == [(str(folder / "a.hcpe"), "its content changed since the checkpoint")]
    assert [Path(j.path).name for j in resumed.joined] == ["b.hcpe"] and counted == [folder / "a.hcpe"]
    # a checkpoint of a version that kept no ctime: each file is read once to compare its content, then trusted
    for joined in state["joined"]:
        del joined["seen"]["ctime_ns"]
    older, counted, _ = _watch(folder)
    older.load_state_dict(state)
    assert sorted(p.name for p in counted) == ["a.hcpe", "b.hcpe"]
    counted.clear()
    assert not older.scan().changed and counted == []


def test_a_joined_file_moved_to_another_matching_name_keeps_its_place_and_a_copy_is_not_new_data(tmp_path):
    folder = _hcpe_folder(tmp_path, "a.hcpe", "b.hcpe")
    counted: list[Path] = []
    watch = DataWatch([str(folder / "**" / "*.hcpe")], lambda path: counted.append(path) or count_file(path),
                      window_positions=80, rescan_seconds=30.0)
    watch.scan()
    (folder / "done").mkdir()
    os.rename(folder / "a.hcpe", folder / "done" / "a.hcpe")  # a producer archiving what it wrote
    result = watch.scan()
    assert result.moved == [(str(folder / "a.hcpe"), str(folder / "done" / "a.hcpe"))]
    assert not result.left and not result.joined and not result.warnings() and watch.generation == 2
    assert result.notes() == [f"data.watch: {folder / 'a.hcpe'} moved to {folder / 'done' / 'a.hcpe'}; it keeps "
                              f"its place in the window"]
    assert [j.path for j in watch.joined] == [str(folder / "done" / "a.hcpe"), str(folder / "b.hcpe")]
    shutil.copy(folder / "b.hcpe", folder / "b-copy.hcpe")
    _aged(folder / "b-copy.hcpe")
    write_records(folder / "c.hcpe", hcpe_records(random_positions(40, seed=9), seed=9))
    _aged(folder / "c.hcpe")
    result = watch.scan()
    assert [Path(j.path).name for j in result.joined] == ["c.hcpe"]
    assert result.copies == [(str(folder / "b-copy.hcpe"), str(folder / "b.hcpe"))]
    assert result.warnings() == [f"data.watch: {folder / 'b-copy.hcpe'} holds the same positions as "
                                 f"{folder / 'b.hcpe'}, which joined already: not new data, not joined"]
    # the newest data is the newest file, not the one that moved: the window is b and c
    files, cut = watch.window()
    assert [Path(j.path).name for j in files] == ["b.hcpe", "c.hcpe"] and cut == 0
    assert not watch.scan().warnings()  # said once
    (folder / "done" / "a.hcpe").unlink()
    assert watch.scan().left == [(str(folder / "done" / "a.hcpe"), "the file is gone")]


def test_random_bytes_named_like_training_data_never_join_and_say_which_record(tmp_path):
    folder = _hcpe_folder(tmp_path, "a.hcpe")
    (folder / "noise.hcpe").write_bytes(np.random.default_rng(5).bytes(38_000))  # 1,000 whole "records"
    _aged(folder / "noise.hcpe")
    watch, _, _ = _watch(folder)
    result = watch.scan()
    assert [Path(j.path).name for j in result.joined] == ["a.hcpe"]
    [(path, why)] = result.refused
    assert path == str(folder / "noise.hcpe") and re.fullmatch(r"record \d+: [^\n]+", why), why
    assert result.warnings() == [f"data.watch: {path} not joined: {why}"]
    assert not watch.scan().refused and [Path(j.path).name for j in watch.joined] == ["a.hcpe"]  # said once
    # a record file is read once to verify and to hash it: the content identity is the caches' content hash
    assert count_file(folder / "a.hcpe") == (40, content_hash(folder / "a.hcpe", "hcpe"))


def _hcpe3_folder(tmp_path: Path, games: list) -> Path:
    """`selfplay/` with two complete hcpe3 files, `a.hcpe3` and `b.hcpe3`."""
    folder = tmp_path / "selfplay"
    folder.mkdir()
    for name, seed in (("a.hcpe3", 1), ("b.hcpe3", 2)):
        write_hcpe3(folder / name, games[seed * 2:seed * 2 + 2], seed=seed)
        _aged(folder / name)
    return folder


def test_positions_caches_follow_their_files_and_go_when_no_window_uses_them(tmp_path, games):
    folder = _hcpe3_folder(tmp_path, games)
    watch = DataWatch([str(folder / "**" / "*.hcpe3")], count_file, rescan_seconds=30.0, derived=derived_files)
    watch.scan()
    cache_a, cache_b = folder / ".a.hcpe3.positions", folder / ".b.hcpe3.positions"
    assert cache_a.is_file() and cache_b.is_file()
    built = cache_b.stat().st_ino
    (folder / "a.hcpe3").unlink()
    (folder / "done").mkdir()
    os.rename(folder / "b.hcpe3", folder / "done" / "b.hcpe3")
    shutil.copy(folder / "done" / "b.hcpe3", folder / "copy.hcpe3")  # decoded to be compared, then not needed
    _aged(folder / "copy.hcpe3")
    result = watch.scan()
    assert result.left == [(str(folder / "a.hcpe3"), "the file is gone")] and len(result.moved) == 1
    assert result.copies == [(str(folder / "copy.hcpe3"), str(folder / "done" / "b.hcpe3"))]
    assert not cache_a.exists() and not cache_b.exists() and not (folder / ".copy.hcpe3.positions").exists()
    assert (folder / "done" / ".b.hcpe3.positions").stat().st_ino == built  # moved along, not decoded again
    assert derived_files(folder / "x.hcpe") == [] and derived_files(folder / "x.psv") == []  # none for records
    assert derived_files(folder / "notes.txt") == []  # nor for what is not training data


def test_the_merged_set_of_a_window_that_changed_is_removed(tmp_path, games):
    folder = _hcpe3_folder(tmp_path, games)
    settings = settings_for(tmp_path, "data.watch=true", "data.use_average=true", 'data.kind="auto"',
                            train=[str(folder / "*.hcpe3")])
    with teacher_batches(settings, torch.device("cpu")) as data:
        data.next_batch()
        [first] = folder.glob(".*.average-*.positions")
        write_hcpe3(folder / "c.hcpe3", games[6:8], seed=3)
        _aged(folder / "c.hcpe3")
        assert [Path(j.path).name for j in data.rescan().joined] == ["c.hcpe3"]
        data.next_batch()
        [second] = folder.glob(".*.average-*.positions")
        assert second != first and not first.exists()


def test_a_vanished_directory_keeps_the_window_with_one_warning(tmp_path, games):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    write_hcpe3(folder / "a.hcpe3", games[:2], seed=1)
    _aged(folder / "a.hcpe3")
    watch, _, _ = _watch(folder)
    watch.scan()
    folder.rename(tmp_path / "elsewhere")
    gone = watch.scan()
    assert gone.vanished_dirs == [str(folder)] and not gone.left and len(watch.joined) == 1
    assert gone.warnings() == [f"data.watch: {folder} is gone; the window stays as it is until it is back"]
    assert watch.scan().warnings() == []  # once
    (tmp_path / "elsewhere").rename(folder)
    assert not watch.scan().changed


def test_the_window_holds_the_newest_positions_in_arrival_order(tmp_path, games):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    for name, seed in (("b.hcpe3", 1), ("a.hcpe3", 2)):  # b first: arrival order, not name order
        write_hcpe3(folder / name, games[seed * 3:seed * 3 + 3], seed=seed)
        _aged(folder / name)
    watch, _, _ = _watch(folder, window=0)
    watch.scan()  # one scan: sorted path order among files that join together
    assert [Path(j.path).name for j in watch.joined] == ["a.hcpe3", "b.hcpe3"]
    write_hcpe3(folder / "0.hcpe3", games[9:10], seed=3)  # joins later, so it is newer though it sorts first
    _aged(folder / "0.hcpe3")
    watch.scan()
    names = [Path(j.path).name for j in watch.joined]
    assert names == ["a.hcpe3", "b.hcpe3", "0.hcpe3"]
    sizes = [j.positions for j in watch.joined]
    assert watch.window() == (watch.joined, 0) and watch.window_size == sum(sizes)
    watch.window_positions = sizes[2] + 5  # the newest file whole and 5 positions of the one before
    files, cut = watch.window()
    assert [Path(f.path).name for f in files] == ["b.hcpe3", "0.hcpe3"] and cut == sizes[1] - 5
    assert watch.window_size == sizes[2] + 5
    watch.window_positions = sizes[2]
    assert watch.window() == ([watch.joined[2]], 0)


def test_settings_refuse_what_a_watch_cannot_do(tmp_path):
    def load(*sets: str) -> None:
        load_settings(overrides=sets, environ={}, cwd=tmp_path)

    with pytest.raises(UserError, match=r"data\.rescan_seconds"):
        load("data.rescan_seconds=0")
    with pytest.raises(UserError, match=r"data\.window_positions"):
        load("data.window_positions=-1")
    with pytest.raises(UserError, match=r"data\.watch.*per_file"):
        load('data.train=["x/*.hcpe3"]', "data.watch=true", 'data.eval_scale_fit="per_file"')


def test_the_data_window_event_parses_and_status_says_waiting():
    record = parse_event({"v": 1, "kind": "data_window", "time": 1.0, "step": 3, "positions": 10, "files": 2,
                          "waiting": True, "min_positions": 50, "arrival_positions_per_hour": 120.0,
                          "newest_age_seconds": 4.0, "joined": ["a"], "left": []})
    assert isinstance(record, DataWindow)
    assert (record.positions, record.waiting, record.min_positions, record.files) == (10, True, 50, 2)
    assert record.arrival_positions_per_hour == 120.0


# -- a watched run trained in this process ----------------------------------------------------------------

WATCHED = ('data.kind="auto"', 'run.network=""', "model.blocks=1", "model.channels=8", "data.workers=0",
           "runtime.log_every=1", "optim.batch_size=16", "runtime.checkpoint_every=3",
           "runtime.progress=plain", "data.rescan_seconds=3600")
"""A rescan only at the start and at checkpoints: which steps files join at depends on steps alone."""


def _watched(folder: Path, *sets: str) -> tuple[str, ...]:
    return (f"data.train=[{json.dumps(str(folder / '*.hcpe3'))}]", "data.watch=true", *WATCHED, *sets)


@pytest.fixture(scope="module")
def selfplay(tmp_path_factory, games) -> Path:
    folder = tmp_path_factory.mktemp("loop") / "selfplay"
    folder.mkdir()
    for i in range(3):
        write_hcpe3(folder / f"game-{i}.hcpe3", games[i * 3:i * 3 + 3], seed=i)
        _aged(folder / f"game-{i}.hcpe3")
    return folder


def _final(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / f"step-{step:09d}.pt", weights_only=True)


def test_a_stopped_watched_run_resumes_exactly(tmp_path, selfplay):
    sets = _watched(selfplay, "data.window_positions=200", "runtime.max_steps=6")
    train(tmp_path / "whole", *sets, cwd=tmp_path)
    train(tmp_path / "parts", *sets, cwd=tmp_path, extra=["--stop-at-step", "3"])
    resumed = train(tmp_path / "parts", *sets, cwd=tmp_path)
    assert "data.watch: resumed the window recorded in step-000000003.pt (3 file(s), 200 positions)" in resumed.stdout
    whole, parts = _final(tmp_path / "whole", 6), _final(tmp_path / "parts", 6)
    for key in ("model", "optimizer"):
        assert_same_tensors(whole[key], parts[key], key)

    def cursor(payload: dict) -> dict:  # the order's cursor and the window's files, less when each joined
        state = {**payload["data_cursor"], "watch": dict(payload["data_cursor"]["watch"])}
        state["watch"]["joined"] = [{k: v for k, v in j.items() if k != "joined_at"} for j in state["watch"]["joined"]]
        return state

    assert cursor(whole) == cursor(parts)
    window = whole["data_cursor"]["watch"]
    assert [Path(j["path"]).name for j in window["joined"]] == ["game-0.hcpe3", "game-1.hcpe3", "game-2.hcpe3"]
    assert all(len(j["content"]) >= 32 for j in window["joined"])  # the content identity of each window file
    started = [e for e in events_of(tmp_path / "whole") if e["kind"] == "data_window"]
    assert started[0]["reason"] == "start" and started[0]["positions"] == 200 and started[0]["joined_count"] == 3


def test_a_window_file_moved_before_a_resume_keeps_its_place_and_the_run_resumes_exactly(tmp_path, selfplay):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    for path in sorted(selfplay.glob("*.hcpe3")):
        shutil.copy2(path, folder / path.name)  # with its mtime: complete, it joins at once
    sets = (f"data.train=[{json.dumps(str(folder / '**' / '*.hcpe3'))}]", "data.watch=true", *WATCHED,
            "data.window_positions=200", "runtime.max_steps=6")
    train(tmp_path / "whole", *sets, cwd=tmp_path)
    train(tmp_path / "parts", *sets, cwd=tmp_path, extra=["--stop-at-step", "3"])
    (folder / "done").mkdir()
    os.rename(folder / "game-0.hcpe3", folder / "done" / "game-0.hcpe3")  # the producer archives the oldest
    resumed = train(tmp_path / "parts", *sets, cwd=tmp_path)
    assert (f"data.watch: {folder / 'game-0.hcpe3'} moved to {folder / 'done' / 'game-0.hcpe3'}; it keeps its "
            f"place in the window") in resumed.stdout
    assert not [e for e in events_of(tmp_path / "parts") if e["kind"] == "warning"]
    whole, parts = _final(tmp_path / "whole", 6), _final(tmp_path / "parts", 6)
    for key in ("model", "optimizer"):
        assert_same_tensors(whole[key], parts[key], key)
    joined = [Path(j["path"]).relative_to(folder) for j in parts["data_cursor"]["watch"]["joined"]]
    assert joined == [Path("done", "game-0.hcpe3"), Path("game-1.hcpe3"), Path("game-2.hcpe3")]


def test_runs_given_the_same_files_in_the_same_arrival_order_train_identically(tmp_path, selfplay, games):
    """Two runs in two directories, each stopped at step 3 while a file arrives, then resumed: the file joins at
    the next rescan (the step-6 checkpoint's), the resumed run says so, and both train the same to the end."""
    late = tmp_path / "late.hcpe3"
    write_hcpe3(late, games[9:12], seed=9)
    finals = []
    for name in ("one", "two"):
        folder = tmp_path / name / "selfplay"
        folder.mkdir(parents=True)
        for path in sorted(selfplay.glob("*.hcpe3")):
            (folder / path.name).write_bytes(path.read_bytes())
            _aged(folder / path.name)
        sets = _watched(folder, "runtime.max_steps=9")
        train(tmp_path / name / "run", *sets, cwd=tmp_path, extra=["--stop-at-step", "3"])
        (folder / "late.hcpe3").write_bytes(late.read_bytes())
        _aged(folder / "late.hcpe3")
        resumed = train(tmp_path / name / "run", *sets, cwd=tmp_path)
        assert "1 file(s) that arrived since join at the next rescan" in resumed.stdout
        events = events_of(tmp_path / name / "run")
        joins = [(e["step"], [Path(p).name for p in e["joined"]]) for e in events
                 if e["kind"] == "data_window" and e["joined_count"]]
        assert joins[-1] == (6, ["late.hcpe3"])
        assert [e["reason"] for e in events if e["kind"] == "data_window"] == ["start", "resumed", "rescan"]
        finals.append(_final(tmp_path / name / "run", 9))
    assert_same_tensors(finals[0]["model"], finals[1]["model"], "model")
    assert finals[0]["data_cursor"]["watch"]["generation"] == 2


def test_status_and_the_monitor_say_the_run_waits_for_data(tmp_path):
    import dataclasses

    from tideborn.rundir.events import encode_event
    from tideborn.rundir.report import status_text
    from tideborn.rundir.state import RunTracker
    from tideborn.tui.widgets.header import RunHeader

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    now = time.time()
    waiting = {"step": 0, "reason": "waiting", "positions": 120, "files": 1, "waiting": True, "min_positions": 500,
               "arrival_positions_per_hour": 3600.0, "newest_age_seconds": 90.0}
    (run_dir / "events.jsonl").write_bytes(
        encode_event("run_started", {"step": 0, "max_steps": 100, "batch_size": 16}, now=now - 30)
        + encode_event("data_window", waiting, now=now - 1))
    tracker = RunTracker(run_dir)
    tracker.refresh(now=now, keep_events=False)
    status = tracker.status(now)
    assert status.data_window is not None and status.data_window.waiting
    assert status.to_json()["data_window"]["positions"] == 120
    # as the live trainer's status reads it (this test has no trainer process to ask about)
    live = dataclasses.replace(status, state="running", waiting_for_data=True, anomalies=())
    text = status_text(live)
    assert "state       running (waiting for data)" in text
    assert ("data        waiting for data (500 positions needed); window 120 positions in 1 file(s); arriving "
            "3,600 positions/h; newest file 1m30s old") in text
    header = RunHeader(run_dir, lambda: now)
    header.status, header.checked_at = live, now
    shown = header.text().plain
    assert shown.startswith(" RUNNING (waiting for data) ") and "window 120 positions in 1 file(s)" in shown


def test_averaging_works_inside_the_window(tmp_path, selfplay):
    """With `data.use_average` the window takes the newest whole files (averaged positions keep no file order) and
    merges the duplicates among them: the window holds the merged positions."""
    run_dir = tmp_path / "run"
    train(run_dir, *_watched(selfplay, "data.use_average=true", "data.window_positions=200", "runtime.max_steps=3"),
          cwd=tmp_path)
    events = events_of(run_dir)
    window = next(e for e in events if e["kind"] == "data_window")
    average = next(e for e in events if e["kind"] == "run_started")["data"]["average"]
    joined = torch.load(run_dir / "step-000000003.pt", weights_only=True)["data_cursor"]["watch"]["joined"]
    newest = [j["positions"] for j in joined][::-1]
    whole_files = next(n for n in range(1, len(newest) + 1) if sum(newest[:n]) >= 200)
    assert average["inputs"] == sum(newest[:whole_files])  # the newest whole files that hold 200 positions
    assert window["positions"] == average["positions"] <= average["inputs"]


def test_a_file_that_is_not_training_data_is_one_warning_and_the_run_goes_on(tmp_path, selfplay):
    folder = tmp_path / "selfplay"
    folder.mkdir()
    for path in sorted(selfplay.glob("*.hcpe3")):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "notes.txt").write_text("the producer's notes\n")
    for path in folder.iterdir():
        _aged(path)
    run_dir = tmp_path / "run"
    sets = _watched(folder, "runtime.max_steps=3")
    # a glob with no extension: the kind is said (an unknown one would be refused before the start)
    train(run_dir, f"data.train=[{json.dumps(str(folder / '*'))}]", *sets[1:], 'data.kind="hcpe3"', cwd=tmp_path)
    warnings = [e["message"] for e in events_of(run_dir) if e["kind"] == "warning"]
    assert len(warnings) == 1 and warnings[0].startswith(f"data.watch: {folder / 'notes.txt'} not joined: ")
    assert "\n" not in warnings[0]
    assert [e["kind"] for e in events_of(run_dir)][-1] == "run_finished"


def test_a_long_wait_for_data_keeps_writing_heartbeats_and_ends_on_a_stop(tmp_path):
    """Twenty minutes without data (on a clock the wait's own sleeps move on): a `data_window` event at least every
    minute, so the run never looks stalled (15 minutes without output), and a stop ends the wait."""
    from tideborn.rundir.events import EventWriter
    from tideborn.trainer.data_watch import HEARTBEAT_SECONDS, WatchDuty
    from tideborn.trainer.progress import StepProgress
    from tideborn.trainer.signals import StopRequest
    from tideborn.trainer.state import teacher_batches

    folder = tmp_path / "selfplay"
    folder.mkdir()
    settings = load_settings(overrides=[f"data.train=[{json.dumps(str(folder / '*.hcpe3'))}]", "data.watch=true",
                                        "data.workers=0", "data.rescan_seconds=60"], environ={}, cwd=tmp_path).settings
    now = [0.0]
    stop = StopRequest()

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 20 * 60:
            stop.reason = "SIGTERM"

    events = EventWriter(tmp_path / "events.jsonl")
    with teacher_batches(settings, torch.device("cpu")) as data:
        duty = WatchDuty(data.window, events, StepProgress("off"), stop, None, lambda: 0, clock=lambda: now[0],
                         sleep=sleep)
        assert data.waiting and duty.ready() is False
    events.close()
    written = [e for e in events_of(tmp_path) if e["kind"] == "data_window"]
    assert written[0]["reason"] == "start" and all(e["waiting"] for e in written)
    # the events' own times are real ones: count the heartbeats instead, one a minute of the wait's clock
    assert sum(e["reason"] == "waiting" for e in written) == 20 * 60 / HEARTBEAT_SECONDS
