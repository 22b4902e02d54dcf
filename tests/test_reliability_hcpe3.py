"""hcpe3 teacher data under attack: caches truncated under a running trainer, hostile cache entries (links,
FIFOs, directories, someone else's files, crafted headers, a cache copied from another file), a malformed
hcpe3 file through `train_run start`, and files truncated under a running `data verify` / `data inspect`."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    assert_user_error,
    describe,
    events_of,
    settings_args,
    terminal_events,
    wait_until,
)
from hcpe3_support import sample_games, write_hcpe3
from test_reliability_support import launched_runs, tool

from tideborn.data import hcpe3 as hcpe3_module
from tideborn.data.hcpe3 import Hcpe3File, cache_path

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"
ENDLESS = ("optim.batch_size=32", "runtime.max_steps=100000", "runtime.log_every=1", "runtime.eval_every=100000",
           "runtime.checkpoint_every=100000", 'runtime.progress="plain"', "data.test=[]", 'data.kind="auto"')


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games()


@pytest.fixture
def launched():
    yield from launched_runs()


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Warnings are said once per cache path and process; each test starts with none said."""
    hcpe3_module._warned_unwritable.clear()


# -- 1. a cache truncated under a running trainer --------------------------------------------------------------

@pytest.mark.parametrize("cache", ["positions", "average"])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_cache_truncated_during_training_fails_the_run_naming_it(games, tmp_path, start_trainer, workers, cache):
    """Truncating a memory-mapped cache killed the trainer with SIGBUS (silently with 0 workers; a
    'DataLoader worker killed by signal: Bus error' with 1). Now: run_failed naming the cache and its
    hcpe3 file, exit 2."""
    data = tmp_path / "data"
    data.mkdir()
    write_hcpe3(data / "train.hcpe3", games[:40], seed=1)
    run_dir = tmp_path / "run"
    trainer = start_trainer("train", *settings_args(
        run_dir, f"paths.data_root={str(data)!r}", 'data.train=["train.hcpe3"]', f"data.workers={workers}",
        f"data.use_average={'true' if cache == 'average' else 'false'}", *ENDLESS, config=TEACHER_CONFIG))
    wait_until(lambda: any(e["kind"] == "step" for e in events_of(run_dir)), trainer, "the first step")
    if cache == "positions":
        target = cache_path(data / "train.hcpe3")
    else:
        (target,) = data.glob(".train.hcpe3.average-*.positions")
    os.truncate(target, 4096 + 64)  # the header and a few bytes: what a disk cleanup or a bad copy leaves

    status = trainer.wait()
    assert status == 2, trainer.output()
    ended = terminal_events(events_of(run_dir))
    assert [e["kind"] for e in ended] == ["run_failed"], trainer.output()
    error = ended[0]["error"]
    assert str(target) in error and "changed while the run read it" in error, error
    named = str(data / "train.hcpe3") if cache == "positions" else "data.train"
    assert named in error, error
    assert "Bus error" not in trainer.output() and "Traceback" not in trainer.output()


def test_a_cache_replaced_by_a_rename_under_a_run_is_read_as_it_was(games, tmp_path):
    """A rebuild by another process renames a new cache over the old one: readers holding the old file
    go on reading it (the same inode); a copy of the set pickled for a spawned worker refuses the new one."""
    import pickle

    from tideborn.errors import UserError

    write_hcpe3(tmp_path / "a.hcpe3", games[:4], seed=2)
    positions = Hcpe3File(tmp_path / "a.hcpe3").positions()
    before = np.asarray(positions.hcp).copy()
    pickled = pickle.dumps(positions)
    cache = cache_path(tmp_path / "a.hcpe3")
    other = tmp_path / "other"
    shutil.copyfile(cache, other)
    os.replace(other, cache)  # same bytes, another inode
    assert np.array_equal(positions.hcp[np.arange(len(positions))], before)
    with pytest.raises(UserError, match=r"\.a\.hcpe3\.positions: the positions cache of .*a\.hcpe3 changed while "
                                        r"the run read it \(another file is in its place"):
        pickle.loads(pickled).hcp[0]


# -- 4. a malformed hcpe3 file through train_run start --------------------------------------------------------

def test_start_with_a_malformed_hcpe3_file_says_file_and_game_in_one_line(games, tmp_path, launched):
    """`start` checks hcpe3 files only for being readable and not empty; the trainer decodes them. A game
    whose move does not replay: start waits for the trainer's refusal and says it in one line naming the
    file and the game, exit 2, and takes train.pid and launch.json back as for its other refusals."""
    from test_hcpe3 import corrupt

    offset = corrupt(tmp_path / "bad.hcpe3", games, "illegal")
    run_dir = tmp_path / "run"
    launched.append(run_dir)
    result = tool("start", *settings_args(run_dir, f"paths.data_root={str(tmp_path)!r}", 'data.train=["bad.hcpe3"]',
                                          "data.workers=0", *ENDLESS, config=TEACHER_CONFIG))
    assert result.returncode == 2, describe(result)
    assert_user_error(result.stderr, rf"bad\.hcpe3: game 2 \(byte {offset}\): move 1 of \d+: selected move 0x7f7f, "
                                     r"illegal")
    assert not (run_dir / "train.pid").exists() and not (run_dir / "launch.json").exists()
    assert not cache_path(tmp_path / "bad.hcpe3").exists()
    assert "bad.hcpe3: game 2" in (run_dir / "train.log").read_text()
