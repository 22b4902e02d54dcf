"""Derived teacher data (positions caches, averaged sets) against files changed in place, damaged caches and
malformed hcpe3 search data: a merged set is keyed by its inputs' content (issue 22, must 2); a damaged cache
is named as the cache (must 6); hcpe3 bounds, and cache warnings as events (must 10)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.common import REPO_ROOT, events_of, settings_args, trainer_in_process
from tests.helpers.hcpe3 import records_of_positions, sample_games, write_hcpe3
from tideborn.config.schema import DataSettings
from tideborn.data.cache import cachefile
from tideborn.data.cache import hcpe3 as hcpe3_module
from tideborn.data.cache.hcpe3 import HEADER_DTYPE, MOVE_INFO_DTYPE, Hcpe3File, build_positions, cache_path, iter_games
from tideborn.data.sets.average import averaged_source, build_average
from tideborn.data.sets.sources import BatchDecoder, open_source
from tideborn.data.tools.cli import main as data_main
from tideborn.errors import UserError

TEACHER_CONFIG = REPO_ROOT / "configs" / "smoke-teacher.toml"


@pytest.fixture(scope="module")
def games() -> list:
    return sample_games()


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Warnings are said once per cache path and process; each test starts with none said or kept."""
    hcpe3_module._warned_unwritable.clear()
    hcpe3_module._decoded_in_memory.clear()
    take = getattr(cachefile, "take_cache_warnings", None)  # (a getattr: the same tests run on older code)
    if take is not None:
        take()


def sampled_pieces(size: int) -> list[tuple[int, int]]:
    """The byte ranges `records_fingerprint` reads (64 pieces of 64 bytes): a change outside them is one that
    size, mtime and the sampled digest cannot see."""
    last = max(0, size - 64)
    return [(last * i // 63, last * i // 63 + 64) for i in range(64)]


def unsampled(offsets: list[int], size: int) -> list[int]:
    pieces = sampled_pieces(size)
    return [o for o in offsets if not any(start <= o < stop for start, stop in pieces)]


def rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    """`path` rewritten in place at the same size, its mtime put back (`touch -d`): only the ctime moves."""
    facts = path.stat()
    assert len(data) == facts.st_size
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(facts.st_atime_ns, facts.st_mtime_ns))


def record_files(directory: Path, games: list) -> dict[str, Path]:
    """The sample games' positions as hcpe and psv records (game results for the side to move), a few
    thousand records each: large enough that most records lie outside the sampled pieces."""
    write_hcpe3(directory / "source.hcpe3", games, seed=300)
    positions = build_positions(directory / "source.hcpe3")["arrays"]
    hcpe, psv = records_of_positions(positions)
    hcpe.tofile(directory / "a.hcpe")
    psv.tofile(directory / "a.psv")
    return {"hcpe": directory / "a.hcpe", "psv": directory / "a.psv"}


def flip_results(path: Path, kind: str) -> int:
    """Flip the game result of every record (hcpe, psv) or game (hcpe3) whose result byte no sampled piece
    covers, in place at the same size, mtime restored; returns how many were flipped."""
    data = bytearray(path.read_bytes())
    if kind == "hcpe3":
        places = [game.offset + 34 for game in iter_games(path)]
    else:
        itemsize, field = (38, 36) if kind == "hcpe" else (40, 38)
        places = [i * itemsize + field for i in range(len(data) // itemsize)]
    flipped = 0
    for place in unsampled(places, len(data)):
        value = data[place]
        if kind == "psv":
            new = (-np.int8(np.uint8(value).view(np.int8))).astype(np.int8).view(np.uint8)
        else:
            new = {1: 2, 2: 1}.get(value & 3, value & 3) | (value & ~3)
        flipped += int(new) != value
        data[place] = int(new)
    rewrite_keeping_mtime(path, bytes(data))
    return flipped


# -- must 2: a merged set is keyed by its inputs' content -------------------------------------------------------

@pytest.mark.parametrize("kind", ["hcpe3", "hcpe", "psv"])
def test_a_merged_set_is_rebuilt_when_an_input_changes_in_place_with_its_mtime_restored(games, tmp_path, kind):
    """The issue's repro: game results flipped in an input at the same size, the mtime put back. Size, mtime
    and the 64 sampled pieces all agree with the merged set's key; the merged targets must still be the new
    ones, never the stale set."""
    if kind == "hcpe3":
        write_hcpe3(tmp_path / "a.hcpe3", games, seed=301)
        changed = tmp_path / "a.hcpe3"
    else:
        changed = record_files(tmp_path, games)[kind]
    write_hcpe3(tmp_path / "b.hcpe3", games[:4], seed=302)
    paths = [changed, tmp_path / "b.hcpe3"]
    settings = DataSettings(train=tuple(str(p) for p in paths), use_average=True)
    before = averaged_source(open_source(paths), settings)
    stale = np.asarray(before.parts[0].arrays["result"]).copy()
    before.close()
    assert flip_results(changed, kind) > 0
    want = build_average(open_source(paths), settings)[1]["result"]
    assert not np.array_equal(want, stale), "the flips change the merged targets"
    after = averaged_source(open_source(paths), settings)
    got = np.asarray(after.parts[0].arrays["result"])
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {len(want)} merged positions stale"
    cache = Path(after.note["average"]["cache"])
    after.close()
    # the rebuilt set is read, not built again, while nothing changes
    built = cache.stat().st_mtime_ns
    again = averaged_source(open_source(paths), settings)
    assert cache.stat().st_mtime_ns == built and np.array_equal(np.asarray(again.parts[0].arrays["result"]), want)
    again.close()


# -- must 6: a damaged cache is named as the cache --------------------------------------------------------------

def cache_layout(cache: Path) -> dict:
    return json.loads(cache.read_bytes()[:4096].split(b"\n", 1)[0])


def damage_array(cache: Path, name: str, make: object) -> None:
    """Overwrite array `name` of `cache` in place (same size): `make(old_values)` gives the new values."""
    offset, dtype, shape = cache_layout(cache)["arrays"][name]
    count = int(np.prod(shape))
    with open(cache, "r+b") as handle:
        handle.seek(offset)
        old = np.frombuffer(handle.read(count * np.dtype(dtype).itemsize), dtype).reshape(shape)
        new = np.asarray(make(old), dtype).reshape(shape)
        assert not np.array_equal(new, old)
        handle.seek(offset)
        handle.write(new.tobytes())


DAMAGES = {
    "zeroed visits": ("cand_visits", lambda old: np.zeros_like(old)),
    "random plies": ("anchor_ply", lambda old: np.random.default_rng(1).integers(0, 65535, old.shape)),
    "negative game offsets": ("game_offsets", lambda old: -old - 1),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_cache_damaged_on_disk_is_named_by_verify_and_rebuilt_not_read(games, tmp_path, capsys, damage):
    path = tmp_path / "a.hcpe3"
    write_hcpe3(path, games[:6], seed=310)
    want = build_positions(path)["arrays"]
    Hcpe3File(path).positions()
    cache = cache_path(path)
    name, make = DAMAGES[damage]
    damage_array(cache, name, make)
    # `data verify` checks the cache too, and names it (the file itself is good)
    assert data_main(["verify", str(path), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"\.a\.hcpe3\.positions: the positions cache of .*a\.hcpe3 is damaged .*{name}.*delete it",
                     out), out
    # training's open: one warning naming the cache and the array, then the right positions
    warnings: list[str] = []
    got = Hcpe3File(path, warn=warnings.append).positions()
    read_as = {"anchor_ply": "ply"}.get(name, name)  # the compact layout stores the plies with the anchors
    assert np.array_equal(np.asarray(getattr(got, read_as)), want[read_as])
    assert len(warnings) == 1 and re.search(rf"\.a\.hcpe3\.positions: .* is damaged .*'{name}'.*built again",
                                            warnings[0]), warnings
    assert data_main(["verify", str(path), "--quiet"]) == 0, capsys.readouterr().out


def test_a_cache_is_checked_whole_at_every_open_so_damage_under_an_old_mtime_is_found(games, tmp_path, monkeypatch):
    """Every open of a cache reads it whole against its checksums (a trainer opens its data once a launch, so
    nothing remembers a check): damage that puts the size and mtime back is found, and the cache built again."""
    path = tmp_path / "a.hcpe3"
    write_hcpe3(path, games[:6], seed=315)
    want = build_positions(path)["arrays"]
    Hcpe3File(path).positions()  # the cache built
    read: list[str] = []
    whole = cachefile._stored_checksum
    monkeypatch.setattr(cachefile, "_stored_checksum", lambda cache, array: read.append(array) or whole(cache, array))
    Hcpe3File(path).positions()
    arrays = len(cache_layout(cache_path(path))["arrays"])
    assert len(read) == arrays > 5
    Hcpe3File(path).positions()
    assert len(read) == 2 * arrays  # read whole again
    cache = cache_path(path)
    before = cache.stat()
    damage_array(cache, "cand_visits", lambda old: np.zeros_like(old))
    os.utime(cache, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same size and mtime
    assert (cache.stat().st_size, cache.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    warnings: list[str] = []
    got = Hcpe3File(path, warn=warnings.append).positions()
    assert len(warnings) == 1 and re.search(r"is damaged .*'cand_visits'.*built again", warnings[0]), warnings
    assert np.array_equal(np.asarray(got.cand_visits), want["cand_visits"])


def test_an_averaged_set_damaged_on_disk_is_rebuilt_with_a_warning(games, tmp_path):
    paths = [tmp_path / "a.hcpe3", tmp_path / "b.hcpe3"]
    write_hcpe3(paths[0], games[:6], seed=311)
    write_hcpe3(paths[1], games[:6], seed=312)
    settings = DataSettings(train=tuple(str(p) for p in paths), use_average=True)
    first = averaged_source(open_source(paths), settings)
    want = np.asarray(first.parts[0].arrays["cand_prob"]).copy()
    cache = Path(first.note["average"]["cache"])
    first.close()
    damage_array(cache, "cand_prob", lambda old: np.zeros_like(old))
    warnings: list[str] = []
    again = averaged_source(open_source(paths), settings, warn=warnings.append)
    assert np.array_equal(np.asarray(again.parts[0].arrays["cand_prob"]), want)
    assert len(warnings) == 1 and re.search(r"\.a\.hcpe3\.average-\w+\.positions: .* is damaged .*'cand_prob'",
                                            warnings[0]), warnings
    again.close()


def test_a_cache_without_checksums_is_rebuilt_not_read(games, tmp_path):
    """A cache of the version before checksums (or one whose checksums were cut out) is never read: with no
    checksum, damage like the above could not be told."""
    path = tmp_path / "a.hcpe3"
    write_hcpe3(path, games[:3], seed=313)
    Hcpe3File(path).positions()
    cache = cache_path(path)
    data = bytearray(cache.read_bytes())
    header = cache_layout(cache)
    header.pop("checksums", None)
    header["version"] = 2
    data[:4096] = (json.dumps(header).encode() + b"\n").ljust(4096, b" ")
    cache.write_bytes(bytes(data))
    Hcpe3File(path).positions()
    rebuilt = cache_layout(cache)
    assert rebuilt["version"] > 2 and set(rebuilt.get("checksums", {})) == set(rebuilt["arrays"])


def test_positions_failing_checks_after_the_cache_was_opened_name_the_cache(games, tmp_path):
    """Bytes changed in place after the checksums were checked (a run reading the cache): a position that
    cannot be decoded is the cache's fault, named as the cache with what to do, never reported as record N of
    the hcpe3 file (which `verify` calls good) nor skipped in silence as a bad record."""
    path = tmp_path / "a.hcpe3"
    write_hcpe3(path, games[:6], seed=314)
    source = open_source([path])
    # the stored hcp position 7 is replayed from (the compact layout stores every few positions' hcp)
    stored = int(source.parts[0].files[0].compact.stored["anchor"][7])
    damage_array(cache_path(path), "hcp", lambda old: np.where(np.arange(len(old))[:, None] == stored, 0xFF, old))
    decoder = BatchDecoder(600.0, 0.5, "skip", 1.0)
    with pytest.raises(UserError, match=r"\.a\.hcpe3\.positions: the positions cache of .*a\.hcpe3 is damaged at "
                                        r"position 7 \(said to be .*a\.hcpe3: game \d+ move \d+\): .*delete it"):
        decoder.decode(source, np.arange(7, 23))
    source.close()


# -- must 10: hcpe3 bounds, and cache warnings as events ---------------------------------------------------------

def serialise(game) -> bytes:
    header = np.zeros(1, HEADER_DTYPE)
    header["hcp"][0], header["moveNum"], header["result"], header["opponent"] = \
        game.hcp, game.move_num, game.result, game.opponent
    out = [header.tobytes()]
    for info, candidates in zip(game.moves, game.candidates):
        info = np.array(info, MOVE_INFO_DTYPE)
        info["candidateNum"] = len(candidates)
        out += [info.tobytes(), candidates.tobytes()]
    return b"".join(out)


def malformed(path: Path, games: list, how: str) -> int:
    """Four games; game 2 made malformed `how`. Returns the game's byte offset."""
    write_hcpe3(path, games[:4], seed=320)
    stored = list(iter_games(path))
    game = stored[2]
    move = next(i for i, c in enumerate(game.candidates) if len(c) >= 2)
    if how == "candidateNum above 593":  # legal moves, repeated past the most a position can have
        game.candidates[move] = np.resize(game.candidates[move], 600)
    elif how == "duplicate candidates":
        game.candidates[move] = np.concatenate([game.candidates[move], game.candidates[move][:1]])
    elif how == "unknown result bits":
        game.result |= 0x40
    path.write_bytes(b"".join(serialise(g) for g in stored))
    return game.offset


@pytest.mark.parametrize("how, pattern", [
    ("candidateNum above 593", r"move \d+: candidateNum 600 is more than a position can have legal moves "
                               r"\(593\)"),
    ("duplicate candidates", r"move \d+ of \d+: candidate 0x[0-9a-f]{4} appears more than once"),
    ("unknown result bits", r"result byte 0x4[0-3] has unknown bits set \(0x40"),
])
def test_malformed_hcpe3_search_data_is_refused_by_train_verify_and_inspect(games, tmp_path, capsys, how, pattern):
    path = tmp_path / "bad.hcpe3"
    offset = malformed(path, games, how)
    where = rf"bad\.hcpe3: game 2 \(byte {offset}\): "
    with pytest.raises(UserError, match=where + pattern):
        Hcpe3File(path).positions()
    assert not cache_path(path).exists()
    assert data_main(["verify", str(path), "--quiet"]) == 1
    assert re.search(where + pattern, capsys.readouterr().out)
    assert data_main(["inspect", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(where + pattern, err), err


def test_cache_warnings_during_train_are_warning_events(games, tmp_path):
    """A cache that cannot be used (a link planted in its place) and one damaged on disk: each said on stderr
    as the data was opened, before `run_started`, and now also a `warning` event, where status and the
    monitor look."""
    write_hcpe3(tmp_path / "a.hcpe3", games[:6], seed=330)
    write_hcpe3(tmp_path / "b.hcpe3", games[:6], seed=331)
    Hcpe3File(tmp_path / "b.hcpe3").positions()
    damage_array(cache_path(tmp_path / "b.hcpe3"), "cand_visits", lambda old: np.zeros_like(old))
    (tmp_path / "elsewhere").write_bytes(b"not a cache")
    cache_path(tmp_path / "a.hcpe3").symlink_to(tmp_path / "elsewhere")
    run_dir = tmp_path / "run"
    # In this process: the warnings said once per cache and process were forgotten by `fresh_warnings`, and the
    # positions read above are not kept in memory (only a cache that cannot be written is), so the trainer
    # opens both caches from disk as a trainer process would.
    done = trainer_in_process("train", *settings_args(
        run_dir, f"paths.data_root={str(tmp_path)!r}", 'data.train=["a.hcpe3", "b.hcpe3"]', "data.test=[]",
        'data.kind="auto"', "runtime.max_steps=2", "optim.batch_size=16", "data.workers=0",
        config=TEACHER_CONFIG), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [e["message"] for e in events_of(run_dir) if e["kind"] == "warning"]
    assert any(re.search(r"\.a\.hcpe3\.positions is a symbolic link", w) for w in warnings), warnings
    assert any(re.search(r"\.b\.hcpe3\.positions: .* is damaged .*'cand_visits'", w) for w in warnings), warnings
    assert (tmp_path / "elsewhere").read_bytes() == b"not a cache"
