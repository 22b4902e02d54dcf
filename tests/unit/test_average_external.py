"""`data.use_average` in bounded memory: the merged set built by an external sort/merge in chunks on disk
(`tideborn.data.sets.average_merge`), forced here into many small chunks so that the run files and the block
merge really run; the same merged targets as by brute force; scratch files removed however the build ends."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import cshogi
import numpy as np
import pytest
from cshogi.dlshogi import make_move_label

from tests.helpers.hcpe3 import sample_games, write_hcpe3
from tideborn.config.schema import DLSHOGI_EVAL_SCALE, DataSettings
from tideborn.data.cache.cachefile import CacheArray
from tideborn.data.cache.hcpe3 import Hcpe3File
from tideborn.data.sets import average_merge
from tideborn.data.sets.average import averaged_source, build_average
from tideborn.data.sets.sources import open_source
from tideborn.data.tools.convert import convert_games
from tideborn.safefile import SCRATCH_MARK

SMALL_CHUNK = 97
"""Input positions per run: the sample files give dozens of runs, and merge blocks of a few positions."""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, list[Path], dict]:
    """Two hcpe3 files of the same games (other visit counts) and the games as hcpe: every position at least
    three times, the openings many more; and the brute-force merged targets."""
    games = sample_games()[:8]
    folder = tmp_path_factory.mktemp("average")
    write_hcpe3(folder / "a.hcpe3", games, seed=40)
    write_hcpe3(folder / "b.hcpe3", games, seed=41, book_plies=0)
    convert_games([Path(g.source) for g in games], folder / "c.hcpe", progress=False)
    paths = [folder / "a.hcpe3", folder / "b.hcpe3", folder / "c.hcpe"]
    return folder, paths, brute_force(paths, temperature=0.5)


def brute_force(paths: list[Path], temperature: float) -> dict[bytes, dict]:
    """Per packed position: the count, and the sums of the distributions, results and win probabilities."""
    board = cshogi.Board()
    merged: dict[bytes, dict] = {}

    def add(hcp: np.ndarray, dist: dict[int, float], result: float, evaluation: float) -> None:
        entry = merged.setdefault(bytes(hcp), {"n": 0, "dist": {}, "result": 0.0, "winprob": 0.0})
        entry["n"] += 1
        for label, prob in dist.items():
            entry["dist"][label] = entry["dist"].get(label, 0.0) + prob
        entry["result"] += result
        entry["winprob"] += 1 / (1 + np.exp(-evaluation / DLSHOGI_EVAL_SCALE))

    for path in paths:
        if path.suffix == ".hcpe":
            for record in np.fromfile(path, cshogi.HuffmanCodedPosAndEval):
                board.set_hcp(record["hcp"])
                move = board.move_from_move16(int(record["bestMove16"]) & 0xFFFF)
                winner = int(record["gameResult"])
                result = 0.5 if winner == cshogi.DRAW else float((winner == cshogi.BLACK_WIN) == (board.turn == 0))
                add(record["hcp"], {make_move_label(move, board.turn): 1.0}, result, float(record["eval"]))
            continue
        for game in Hcpe3File(path).games():
            board.set_hcp(game.hcp)
            for info, candidates in zip(game.moves, game.candidates):
                move = board.move_from_move16(int(info["selectedMove16"]))
                hcp = np.empty(32, np.uint8)
                board.to_hcp(hcp)
                turn = board.turn
                board.push(move)
                if board.is_draw(16) in (1, 4, 5):  # a repetition: left out
                    continue
                if len(candidates):
                    weights = candidates["visitNum"].astype(np.float64) ** (1 / temperature)
                    dist: dict[int, float] = {}
                    for m, w in zip(candidates["move16"].tolist(), (weights / weights.sum()).tolist()):
                        dist[make_move_label(m, turn)] = dist.get(make_move_label(m, turn), 0.0) + w
                else:
                    dist = {make_move_label(move, turn): 1.0}
                winner = game.result & 3
                add(hcp, dist, 0.5 if winner == 0 else float((winner == 1) == (turn == 0)), float(info["eval"]))
    return merged


def settings_for(paths: list[Path]) -> DataSettings:
    return DataSettings(train=tuple(str(p) for p in paths), use_average=True, policy_temperature=0.5)


def assert_brute_force_targets(arrays: dict, want: dict[bytes, dict]) -> None:
    hcp = np.asarray(arrays["hcp"])
    assert len(hcp) == len(want) and len({bytes(row) for row in hcp}) == len(want)
    offsets = np.asarray(arrays["cand_offsets"])
    labels, probs = np.asarray(arrays["cand_label"]), np.asarray(arrays["cand_prob"])
    for row in range(len(hcp)):
        entry = want[bytes(hcp[row])]
        n = entry["n"]
        assert int(arrays["count"][row]) == n
        assert abs(float(arrays["result"][row]) - entry["result"] / n) < 1e-6
        assert abs(float(arrays["winprob"][row]) - entry["winprob"] / n) < 1e-6
        got = dict(zip(labels[offsets[row]:offsets[row + 1]].tolist(), probs[offsets[row]:offsets[row + 1]].tolist()))
        assert got.keys() == entry["dist"].keys()
        assert all(abs(got[label] - entry["dist"][label] / n) < 1e-5 for label in got)
        top = max(sorted(got), key=lambda label: got[label])  # the first of equals by label
        assert int(arrays["label"][row]) == top


def scratch_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if SCRATCH_MARK in p.name or ".tmp-" in p.name)


def test_many_small_chunks_on_disk_give_the_brute_force_targets_and_leave_no_scratch(inputs, tmp_path, monkeypatch):
    folder, paths, want = inputs
    monkeypatch.setattr(average_merge, "CHUNK_POSITIONS", SMALL_CHUNK)
    created, largest = [], [0]
    real_create, real_combine = average_merge.create_scratch_file, average_merge.combine

    def recording_create(beside, serial):
        fd, path = real_create(beside, serial)
        created.append(path)
        return fd, path

    def recording_combine(positions, entries):
        largest[0] = max(largest[0], len(positions))
        return real_combine(positions, entries)

    monkeypatch.setattr(average_merge, "create_scratch_file", recording_create)
    monkeypatch.setattr(average_merge, "combine", recording_combine)
    averaged = averaged_source(open_source(paths), settings_for(paths))
    summary = averaged.note["average"]
    inputs_count = summary["inputs"]
    runs = -(-inputs_count // SMALL_CHUNK)
    # the runs and the nine output arrays went through scratch files beside the cache, all gone now
    assert len(created) == runs + len(average_merge.OUTPUT_DTYPES) and all(p.parent == folder for p in created)
    assert scratch_files(folder) == []
    # never more positions merged in memory at once than one chunk
    assert 0 < largest[0] <= SMALL_CHUNK
    part = averaged.parts[0]
    assert summary["positions"] == len(want) and isinstance(part.arrays["hcp"], CacheArray)
    assert_brute_force_targets(part.arrays, want)
    averaged.close()
    Path(summary["cache"]).unlink()


def test_the_merge_in_memory_gives_the_same_bytes_as_on_disk(inputs, tmp_path, monkeypatch):
    """Where no cache can be written the runs stay in memory: the same chunks, the same sums, the same bytes."""
    folder, paths, want = inputs
    monkeypatch.setattr(average_merge, "CHUNK_POSITIONS", SMALL_CHUNK)
    _, in_memory = build_average(open_source(paths), settings_for(paths))
    _, on_disk = build_average(open_source(paths), settings_for(paths), scratch_beside=tmp_path / "cache")
    assert scratch_files(tmp_path) == []
    assert in_memory.keys() == on_disk.keys()
    assert all(np.array_equal(in_memory[name], on_disk[name]) for name in in_memory)
    assert_brute_force_targets(in_memory, want)


def test_one_chunk_and_many_chunks_merge_to_the_same_targets(inputs, monkeypatch):
    _, paths, _ = inputs
    _, whole = build_average(open_source(paths), settings_for(paths))
    monkeypatch.setattr(average_merge, "CHUNK_POSITIONS", 7)
    _, pieces = build_average(open_source(paths), settings_for(paths))
    for name in whole:
        if whole[name].dtype.kind == "f":
            assert np.allclose(whole[name], pieces[name], rtol=0, atol=1e-6), name
        else:
            assert np.array_equal(whole[name], pieces[name]), name


def test_a_full_disk_during_the_merge_leaves_no_scratch_and_no_cache_and_averages_in_memory(inputs, monkeypatch):
    """ENOSPC on the tenth scratch write (a run, mid-build): every scratch file is removed, no cache is
    published, the merged set is built in memory with one warning naming the cache; the next build, with
    space back, writes the cache."""
    folder, paths, want = inputs
    monkeypatch.setattr(average_merge, "CHUNK_POSITIONS", SMALL_CHUNK)
    real_write, writes = os.write, [0]

    def full_disk(fd, data):
        writes[0] += 1
        if writes[0] >= 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(average_merge.os, "write", full_disk)
    warnings: list[str] = []
    averaged = averaged_source(open_source(paths), settings_for(paths), warn=warnings.append)
    cache = Path(averaged.note["average"]["cache"])
    assert writes[0] >= 10 and not cache.exists() and scratch_files(folder) == []
    assert len(warnings) == 1 and str(cache) in warnings[0] and "[ENOSPC]" in warnings[0]
    assert "averaged in memory" in warnings[0]
    assert_brute_force_targets(averaged.parts[0].arrays, want)
    monkeypatch.setattr(average_merge.os, "write", real_write)
    again = averaged_source(open_source(paths), settings_for(paths))
    assert cache.is_file() and scratch_files(folder) == []
    assert all(np.array_equal(np.asarray(again.parts[0].arrays[name]), averaged.parts[0].arrays[name])
               for name in averaged.parts[0].arrays)
    again.close()
    cache.unlink()


def test_scratch_files_of_a_killed_build_are_removed_by_the_next_and_never_read(inputs, monkeypatch):
    """What a SIGKILL leaves (scratch files named for a process that is gone, holding garbage) is removed
    by the next build; a live process's scratch files are left alone."""
    folder, paths, want = inputs
    monkeypatch.setattr(average_merge, "CHUNK_POSITIONS", SMALL_CHUNK)
    averaged = averaged_source(open_source(paths), settings_for(paths))
    cache = Path(averaged.note["average"]["cache"])
    averaged.close()
    cache.unlink()
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    left = [cache.with_name(f".{cache.name}{SCRATCH_MARK}{dead}-{k}") for k in range(3)]
    live = cache.with_name(f".{cache.name}{SCRATCH_MARK}1-0")  # pid 1 is always running
    for path in [*left, live]:
        path.write_bytes(os.urandom(4096))
    again = averaged_source(open_source(paths), settings_for(paths))
    assert scratch_files(folder) == [live.name]
    assert_brute_force_targets({name: np.asarray(a) for name, a in again.parts[0].arrays.items()}, want)
    again.close()
    live.unlink()
    cache.unlink()
