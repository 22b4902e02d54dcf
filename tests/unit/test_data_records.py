"""Reading teacher files: both formats read back what cshogi wrote, paths and globs resolve against the
data root, and every kind of bad input is a one-line `UserError` naming the file (and record)."""

from __future__ import annotations

import os
from pathlib import Path

import cshogi
import numpy as np
import pytest
import torch

from tests.helpers.data import HCPE, PSV, hcpe_records, psv_records, random_positions, settings_for, write_records
from tideborn.data.decode.features import Decoder
from tideborn.data.formats.records import RecordSet, expand_paths, resolve_kind
from tideborn.data.sets.sources import held_out_source, training_source
from tideborn.errors import UserError
from tideborn.trainer.state import teacher_batches

CPU = torch.device("cpu")


@pytest.mark.parametrize("kind", ["hcpe", "psv"])
def test_records_read_back_the_positions_moves_and_results_written(tmp_path, kind):
    positions = random_positions(300, seed=1)
    written = hcpe_records(positions) if kind == "hcpe" else psv_records(positions)
    half = len(written) // 2
    write_records(tmp_path / f"a.{kind}", written[:half])
    write_records(tmp_path / f"b.{kind}", written[half:])
    records = RecordSet([tmp_path / f"a.{kind}", tmp_path / f"b.{kind}"], kind)
    assert len(records) == len(positions)
    indices = np.array([0, half - 1, half, len(positions) - 1, 7])
    read = records.read(indices)
    assert read.tobytes() == written[indices].tobytes()
    assert records.describe(half + 3) == f"{tmp_path / f'b.{kind}'}: record 3"

    decoder = Decoder(kind, eval_scale=756.0, value_lambda=0.0)
    board = cshogi.Board()
    for index in indices.tolist():
        sfen, move = positions[index]
        decoder.set_position(read["hcp" if kind == "hcpe" else "sfen"][indices.tolist().index(index)])
        board.set_sfen(sfen)
        assert decoder.board.sfen().split(" ")[:3] == board.sfen().split(" ")[:3]
        stored = int(read["bestMove16" if kind == "hcpe" else "move"][indices.tolist().index(index)]) & 0xFFFF
        assert decoder.move_from_stored(stored) == move


def test_files_are_read_by_record_without_a_memory_map(tmp_path):
    write_records(tmp_path / "a.hcpe", hcpe_records(random_positions(20)))
    written = hcpe_records(random_positions(20))
    records = RecordSet([tmp_path / "a.hcpe"], "hcpe")
    # near records come in one read, far ones one each; either way in the order asked, repeats included
    indices = np.array([19, 0, 1, 19, 7, 3])
    assert (records.read(indices) == written[indices]).all()
    assert str(tmp_path / "a.hcpe") not in Path("/proc/self/maps").read_text()  # not memory-mapped
    records.close()


def test_relative_paths_and_globs_resolve_against_the_data_root(tmp_path):
    for name in ("b.hcpe", "a.hcpe", "sub/c.hcpe"):
        write_records(tmp_path / "root" / name, hcpe_records(random_positions(5)))
    found = expand_paths(["*.hcpe", "sub/c.hcpe"], tmp_path / "root")
    assert found == [tmp_path / "root" / "a.hcpe", tmp_path / "root" / "b.hcpe", tmp_path / "root" / "sub" / "c.hcpe"]
    settings = settings_for(tmp_path / "root", train=["*.hcpe"])
    assert len(training_source(settings.data, settings.paths.data_root)) == 10


def test_the_kind_comes_from_the_extension_unless_given(tmp_path):
    assert resolve_kind([Path("x.hcpe")]) == "hcpe"
    assert resolve_kind([Path("x.bin"), Path("y.psv")]) == "psv"
    assert resolve_kind([Path("x.dat")], "psv") == "psv"
    with pytest.raises(UserError, match=r"x\.dat: cannot tell the record format"):
        resolve_kind([Path("x.dat")])


def _first_batch(tmp_path: Path, *sets: str, train: list[str]):
    data = teacher_batches(settings_for(tmp_path, *sets, train=train), CPU)
    try:
        return data.next_batch()
    finally:
        data.close()


def test_a_size_that_is_not_a_multiple_of_the_record_size_names_the_file(tmp_path):
    path = tmp_path / "cut.hcpe"
    path.write_bytes(hcpe_records(random_positions(3)).tobytes()[:-5])
    with pytest.raises(UserError, match=r"cut\.hcpe: size 109 bytes is not a multiple of the hcpe record size "
                                        r"\(38 bytes\): 2 whole records and 33 bytes over"):
        _first_batch(tmp_path, train=["cut.hcpe"])


def test_an_empty_file_is_an_error(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.bin: is empty \(0 bytes\); a psv file holds 40-byte records"):
        _first_batch(tmp_path, train=["empty.bin"])


def test_a_glob_that_matches_nothing_is_an_error_that_says_how_to_make_the_files(tmp_path):
    with pytest.raises(UserError, match=r"data\.train: 'shards/\*\.hcpe' matches no files") as raised:
        _first_batch(tmp_path, train=["shards/*.hcpe"])
    # as for a plain path that is missing: the teacher files were never made, and this is how
    assert "; make them with `tideborn data convert RECORDS --output ALL.hcpe` then `tideborn data split`" in str(
        raised.value)
    with pytest.raises(UserError) as raised:
        expand_paths(["shards/*.hcpe"], tmp_path, "FILE")  # a data tool's argument: the bare fact
    assert str(raised.value) == f"FILE: 'shards/*.hcpe' matches no files (looked for {tmp_path / 'shards/*.hcpe'})"


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(UserError, match=r"missing\.hcpe: no such file"):
        _first_batch(tmp_path, train=["missing.hcpe"])


def test_a_directory_is_an_error(tmp_path):
    (tmp_path / "dir.hcpe").mkdir()
    with pytest.raises(UserError, match=r"dir\.hcpe: is a directory, not a hcpe file"):
        _first_batch(tmp_path, train=["dir.hcpe"])


@pytest.mark.skipif(os.geteuid() == 0, reason="running as root: file permissions do not stop reads")
def test_an_unreadable_file_is_an_error(tmp_path):
    path = write_records(tmp_path / "locked.hcpe", hcpe_records(random_positions(3)))
    path.chmod(0)
    with pytest.raises(UserError, match=r"locked\.hcpe: cannot read: Permission denied"):
        _first_batch(tmp_path, train=["locked.hcpe"])


def test_an_unreadable_file_is_an_error_even_for_root(tmp_path, monkeypatch):
    # Root reads any file, so the refusal a user would meet is injected at the one place files are opened.
    write_records(tmp_path / "locked.hcpe", hcpe_records(random_positions(3)))

    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith("locked.hcpe"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(UserError, match=r"locked\.hcpe: cannot read: Permission denied"):
        training_source(settings_for(tmp_path, train=["locked.hcpe"]).data, tmp_path)


@pytest.mark.parametrize("kind", ["hcpe", "psv"])
def test_undecodable_records_are_an_error_naming_file_and_record(tmp_path, kind):
    dtype = HCPE if kind == "hcpe" else PSV
    records = hcpe_records(random_positions(16)) if kind == "hcpe" else psv_records(random_positions(16))
    garbage = np.frombuffer(np.random.default_rng(5).bytes(dtype.itemsize * 16), dtype=dtype)
    records[9] = garbage[0]
    packed = records["hcp" if kind == "hcpe" else "sfen"]
    packed[9, 0] |= 0xFE  # black's king on square 127: off the board
    write_records(tmp_path / f"bad.{kind}", records)
    with pytest.raises(UserError, match=rf"bad\.{kind}: record 9: undecodable position"):
        _first_batch(tmp_path, train=[f"bad.{kind}"])


def test_a_result_out_of_range_is_an_error(tmp_path):
    records = hcpe_records(random_positions(16))
    records["gameResult"][4] = 7
    write_records(tmp_path / "bad.hcpe", records)
    with pytest.raises(UserError, match=r"bad\.hcpe: record 4: game result out of range"):
        _first_batch(tmp_path, train=["bad.hcpe"])


def test_held_out_files_must_not_also_be_training_files(tmp_path):
    write_records(tmp_path / "a.hcpe", hcpe_records(random_positions(5)))
    settings = settings_for(tmp_path, train=["a.hcpe"], test=["./a.hcpe"])
    with pytest.raises(UserError, match=r"data\.test: .*a\.hcpe is also in data\.train"):
        held_out_source(settings.data, settings.paths.data_root)
