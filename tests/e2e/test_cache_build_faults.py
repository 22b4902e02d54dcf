"""Faults during the builds of the compact positions cache and of the averaged set's external merge: a real
full disk (tmpfs), kill -9 and Ctrl-C of the building process. Whatever is left at a cache's name is whole
and right; scratch files are removed (by the build, or after a SIGKILL by the next one); the next open reads
the right positions and targets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.common import REPO_ROOT, child_env
from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.config.schema import DataSettings
from tideborn.data.cache import hcpe3
from tideborn.data.cache.hcpe3 import Hcpe3File, build_positions, cache_path
from tideborn.data.sets import average_merge
from tideborn.data.sets.average import average_cache_path, average_key, averaged_source, build_average
from tideborn.data.sets.sources import open_source
from tideborn.safefile import SCRATCH_MARK

MERGE = """
import sys
from pathlib import Path
from tideborn.config.schema import DataSettings
from tideborn.data.sets import average_merge
from tideborn.data.sets.average import averaged_source
from tideborn.data.sets.sources import open_source
average_merge.CHUNK_POSITIONS = 200  # many runs, each a scratch file
real_new = average_merge.Scratch.new


def new(self):  # the third run on disk: the merge is under way; it waits here for the test's signal
    fd = real_new(self)
    if len(self.files) == 3:
        print("merging", flush=True)
        sys.stdin.readline()
    return fd


average_merge.Scratch.new = new
paths = [Path(p) for p in sys.argv[1:]]
averaged_source(open_source(paths), DataSettings(train=tuple(map(str, paths)), use_average=True))
"""

DECODE = """
import sys
from tideborn.data.cache.hcpe3 import Hcpe3File


def progress(done, size):  # part of the file decoded: the decode is under way; it waits here for the signal
    if 0 < done < size and not progress.said:
        progress.said = True
        print("hcpe3: decoding", flush=True)
        sys.stdin.readline()


progress.said = False
Hcpe3File(sys.argv[1]).positions(progress)
"""


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games()


@pytest.fixture(scope="module")
def big_hcpe3(games, tmp_path_factory) -> tuple[bytes, dict]:
    """An hcpe3 file that takes seconds to decode (its bytes), and its positions decoded in memory: the same
    for both signals, so decoded once here rather than in each test."""
    path = tmp_path_factory.mktemp("big") / "big.hcpe3"
    write_hcpe3(path, games, seed=2363)
    content = path.read_bytes() * 150  # about 2 s of decoding in the child (the compiled replay is fast)
    path.write_bytes(content)
    return content, build_positions(path)["arrays"]


@pytest.fixture(scope="module")
def merge_inputs(games, tmp_path_factory) -> list[bytes]:
    """The two hcpe3 files both interrupted merges read (their bytes): written once, for both signals."""
    folder = tmp_path_factory.mktemp("merge-inputs")
    paths = [folder / "a.hcpe3", folder / "b.hcpe3"]
    write_hcpe3(paths[0], games, seed=2361)
    write_hcpe3(paths[1], games, seed=2362, book_plies=0)
    return [paths[0].read_bytes() * 3, paths[1].read_bytes()]


def settings_for(paths: list[Path]) -> DataSettings:
    return DataSettings(train=tuple(map(str, paths)), use_average=True)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if SCRATCH_MARK in p.name or ".tmp-" in p.name)


def interrupt(script: str, args: list[str], ready: str, signal_name: str) -> int:
    """Run `script`, which prints `ready` from inside the build and then waits on its standard input (which this
    test never writes): the signal lands in the middle of the build however busy the machine, never after it."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO_ROOT, env=child_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        line = child.stdout.readline()
        assert ready in line, (line, child.stderr.read() if child.poll() is not None else "")
        os.killpg(child.pid, getattr(signal, signal_name))
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_merge_interrupted_leaves_no_set_a_later_run_trusts(merge_inputs, tmp_path, signal_name):
    paths = [tmp_path / "a.hcpe3", tmp_path / "b.hcpe3"]
    for path, content in zip(paths, merge_inputs, strict=True):
        path.write_bytes(content)
    for path in paths:  # the positions caches first: the child spends its time merging
        Hcpe3File(path).positions()
    source = open_source(paths)
    cache = average_cache_path(source, average_key(source, settings_for(paths)))
    source.close()
    returncode = interrupt(MERGE, list(map(str, paths)), "merging", signal_name)
    assert returncode != 0
    assert not cache.exists(), "a merged set was published by an interrupted build"
    if signal_name == "SIGINT":
        assert leftovers(tmp_path) == [], "Ctrl-C left scratch files"
    else:
        assert any(SCRATCH_MARK in name for name in leftovers(tmp_path)), "kill -9 leaves the scratch it had"
    # the next run removes what a dead build left, and merges the right targets
    want = build_average(open_source(paths), settings_for(paths))[1]
    averaged = averaged_source(open_source(paths), settings_for(paths))
    assert leftovers(tmp_path) == [] and cache.is_file()
    for name, array in want.items():
        assert np.array_equal(np.asarray(averaged.parts[0].arrays[name]), array), name
    averaged.close()


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_compact_cache_build_interrupted_leaves_no_cache_a_later_open_trusts(big_hcpe3, tmp_path, signal_name):
    content, want = big_hcpe3
    path = tmp_path / "big.hcpe3"
    path.write_bytes(content)
    returncode = interrupt(DECODE, [str(path)], "hcpe3: decoding", signal_name)
    assert returncode != 0
    left = cache_path(path)
    if left.exists():
        assert hcpe3.read_arrays(left, hcpe3.CACHE_FORMAT) is not None, "a partial cache at its name"
    got = Hcpe3File(path).positions()
    assert got.cached and all(np.array_equal(np.asarray(got.arrays[name]), want[name]) for name in want)
    assert leftovers(tmp_path) == []


def test_on_a_real_full_disk_the_merge_and_the_compact_cache_leave_nothing_half_written(games, small_filesystem):
    """A tmpfs with room for the inputs and their compact positions caches, not for the merge's scratch
    files: the merged set is averaged in memory with one warning, nothing left behind; with room again, the
    next run writes it."""
    mount, resize = small_filesystem
    resize(64 << 20)
    paths = [mount / "a.hcpe3", mount / "b.hcpe3"]
    write_hcpe3(paths[0], games, seed=2364)
    write_hcpe3(paths[1], games, seed=2365, book_plies=0)
    for path in paths:
        Hcpe3File(path).positions()
    used = sum(p.stat().st_size for p in mount.iterdir())
    resize(used + (256 << 10))  # the merge's runs and arrays need several MB at 200 positions a run
    warnings: list[str] = []
    saved = average_merge.CHUNK_POSITIONS
    average_merge.CHUNK_POSITIONS = 200
    try:
        averaged = averaged_source(open_source(paths), settings_for(paths), warn=warnings.append)
    finally:
        average_merge.CHUNK_POSITIONS = saved
    cache = Path(averaged.note["average"]["cache"])
    assert len(warnings) == 1 and "averaged in memory" in warnings[0] and "[ENOSPC]" in warnings[0], warnings
    assert not cache.exists() and leftovers(mount) == []
    want = build_average(open_source(paths), settings_for(paths))[1]
    assert all(np.array_equal(np.asarray(averaged.parts[0].arrays[name]), want[name]) for name in want)
    # a positions cache that does not fit either: decoded in memory with a warning, no temp file left
    third = mount / "c.hcpe3"
    third.write_bytes(paths[0].read_bytes())
    resize(sum(p.stat().st_size for p in mount.iterdir()) + (8 << 10))
    messages: list[str] = []
    positions = Hcpe3File(third, warn=messages.append).positions()
    assert not positions.cached and not cache_path(third).exists() and leftovers(mount) == []
    assert len(messages) == 1 and "decoded in memory" in messages[0], messages
    assert np.array_equal(np.asarray(positions.hcp), build_positions(paths[0])["arrays"]["hcp"])
    resize(64 << 20)
    again = averaged_source(open_source(paths), settings_for(paths))
    assert cache.is_file() and leftovers(mount) == []
    again.close()
