"""The scale benchmark's corpora are valid files of the size asked for, and its command line answers.

Figures are never asserted (docs/benchmarks.md). The measuring part starts processes (fresh opens, a real
trainer, dlshogi), so here only what runs in this process: the corpus builder, --help, refusals, and a run
whose only size does not fit on the disk (skipped, said so, nothing started).
"""

from __future__ import annotations

from pathlib import Path

import cshogi
import numpy as np
import pytest

from benchmarks import scale
from benchmarks.hcpe3_file import reference_moves
from benchmarks.scale_corpus import Seed, make_seed, write_hcpe3_corpus, write_hcpe_corpus
from tideborn.data.cache.hcpe3 import Hcpe3File
from tideborn.data.formats.records import RECORD_DTYPES


@pytest.fixture(scope="module")
def seed() -> Seed:
    return make_seed(copies=1)


def test_hcpe3_corpus_repeats_whole_legal_games_to_the_size(seed: Seed, tmp_path: Path) -> None:
    per_seed = int(seed.game_moves.sum())
    wanted = 2 * per_seed + 100  # two whole seeds and the start of a third
    path = tmp_path / "corpus.hcpe3"
    written = write_hcpe3_corpus(seed, path, wanted)
    assert wanted <= written < wanted + int(seed.game_moves.max())
    moves = reference_moves(path)  # a plain replay of every move: the layout walks and each move is legal
    assert len(moves) == written
    assert len({m.game for m in moves}) == 2 * len(seed.game_moves) + int(np.searchsorted(seed.game_moves.cumsum(),
                                                                                              100)) + 1
    assert all(len(m.candidates) > 0 for m in moves)  # self-play without book moves: every move searched
    positions = Hcpe3File(path).positions(progress=lambda done, size: None)
    assert len(positions) == sum(m.repetition is None for m in moves)  # tideborn's reader takes it whole


def test_hcpe_corpus_has_exactly_the_size_in_legal_records(seed: Seed, tmp_path: Path) -> None:
    path = tmp_path / "corpus.hcpe"
    wanted = len(seed.hcpe) + 7
    assert write_hcpe_corpus(seed, path, wanted) == wanted
    records = np.fromfile(path, RECORD_DTYPES["hcpe"])
    assert len(records) == wanted
    assert (records[len(seed.hcpe):] == seed.hcpe[:7]).all()
    board = cshogi.Board()
    for record in records[:len(seed.hcpe)]:
        board.set_hcp(record["hcp"])
        assert board.is_legal(board.move_from_move16(int(record["bestMove16"].view(np.uint16))))
        assert record["gameResult"] in (cshogi.DRAW, cshogi.BLACK_WIN, cshogi.WHITE_WIN)


def test_help_names_every_figure(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        scale.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    for words in ("first open", "later open", "launch to", "merged set", "per CPU second", "--dlshogi-build", "psutil",
                  "--sizes"):
        assert words in out, words


@pytest.mark.parametrize(("argv", "message"), [
    (["--sizes", "ten"], "--sizes"),
    (["--formats", "psv"], "--formats"),
    (["--dlshogi-build", "/nonexistent-dlshogi"], "no cppshogi"),
])
def test_bad_options_are_one_line_refusals(argv: list[str], message: str, capsys) -> None:
    try:
        code = scale.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_size_past_the_free_disk_is_skipped_and_said(tmp_path: Path, capsys) -> None:
    code = scale.main(["--sizes", "1e15", "--formats", "hcpe", "--scratch", str(tmp_path), "--seed-copies", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "GB free" in out and "skipped: needs about" in out
    assert list(tmp_path.iterdir()) == []  # the scratch folder removed, no corpus left
