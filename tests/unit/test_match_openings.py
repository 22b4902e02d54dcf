"""`tideborn match --openings FILE` with positions the file holds twice: one warning line naming how many and where,
each played once unless `--keep-repeated-openings`, and `distinct_openings` in `--json` counting positions, not
lines. (A file with repeats went through silently, and with argmax play each repeat replayed the same games.)"""

from __future__ import annotations

import json
from pathlib import Path

import cshogi
import numpy as np
import pytest
from cshogi import CSA

from tests.helpers.usi import tiny_checkpoint
from tideborn.match.cli import main as match_main
from tideborn.match.openings import choose_openings, load_openings, position_key

START = "lnsgkgsnl/1r5b1/ppppppppp/9/9/9/PPPPPPPPP/1B5R1/LNSGKGSNL"
BOOK = f"""# three positions, two of them written again
startpos
startpos moves 7g7f
position startpos
sfen {START} b - 9
startpos moves 2g2f
"""
"""Lines 2, 3 and 6 differ; lines 4 and 5 are line 2's position again (a move number does not make another game)."""


def test_repeats_are_found_by_position_and_dropped_unless_kept(tmp_path):
    book = tmp_path / "book.sfen"
    book.write_text(BOOK)
    dropped = choose_openings(book)
    assert [position_key(sfen) for sfen in dropped.positions] == [
        position_key(sfen) for sfen in load_openings(book)[:2] + load_openings(book)[4:]]
    assert dropped.repeats == [("line 4", "line 2"), ("line 5", "line 2")]
    assert dropped.warning() == (f"{book}: 2 of 5 opening positions repeat an earlier one (line 4 = line 2, "
                                 "line 5 = line 2); dropped, 3 distinct openings left (--keep-repeated-openings "
                                 "keeps them)")
    kept = choose_openings(book, keep_repeated=True)
    assert kept.positions == load_openings(book) and kept.repeats == dropped.repeats
    assert "2 of 5 opening positions repeat" in kept.warning() and "kept (--keep-repeated-openings)" in kept.warning()
    assert choose_openings(None).repeats == []  # the shipped set: 621 distinct positions, no warning


def test_the_warning_names_the_first_repeats_and_counts_the_rest(tmp_path):
    book = tmp_path / "book.hcpe"
    records = np.zeros(10, dtype=cshogi.HuffmanCodedPosAndEval)
    board = cshogi.Board()
    board.push_usi("7g7f")
    board.to_hcp(records[1:2]["hcp"][0])  # record 1 a position of its own; the other nine the start position
    for index in (0, *range(2, 10)):
        cshogi.Board().to_hcp(records[index:index + 1]["hcp"][0])
    records.tofile(book)
    warning = choose_openings(book).warning()
    assert warning.startswith(f"{book}: 8 of 10 opening positions repeat an earlier one (record 2 = record 0, "
                              "record 3 = record 0, record 4 = record 0, record 5 = record 0, record 6 = record 0, "
                              "and 3 more); dropped, 2 distinct openings left"), warning


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("openings"))


def _match(capsys, checkpoint: Path, *args: str) -> tuple[dict, list[str]]:
    code = match_main([str(checkpoint), str(checkpoint), "--max-moves", "8", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err.splitlines()


def test_match_drops_repeated_openings_with_one_warning_line(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.sfen").write_text(BOOK)
    report, err = _match(capsys, checkpoint, "--openings", "book.sfen", "--games", "6", "--save-games", "games")
    assert err == ["warning: book.sfen: 2 of 5 opening positions repeat an earlier one (line 4 = line 2, "
                   "line 5 = line 2); dropped, 3 distinct openings left (--keep-repeated-openings keeps them)"]
    assert (report["games"], report["distinct_openings"]) == (6, 3)
    assert (report["repeated_openings"], report["repeated_openings_kept"]) == (2, False)
    played = [position_key(CSA.Parser.parse_file(str(path))[0].sfen) for path in sorted(Path("games").glob("*.csa"))]
    assert len(played) == 6 and len(set(played)) == 3  # three openings, each with both colours


def test_kept_repeats_are_counted_once_in_distinct_openings(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.sfen").write_text(BOOK)
    report, err = _match(capsys, checkpoint, "--openings", "book.sfen", "--games", "10", "--keep-repeated-openings")
    assert len(err) == 1 and "2 of 5 opening positions repeat" in err[0] and "kept" in err[0], err
    assert (report["games"], report["distinct_openings"]) == (10, 3)  # five lines played, three positions
    assert (report["repeated_openings"], report["repeated_openings_kept"]) == (2, True)


def test_more_pairs_than_openings_is_a_warning_too(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.sfen").write_text("startpos\nstartpos moves 7g7f\n")
    report, err = _match(capsys, checkpoint, "--openings", "book.sfen", "--games", "6")
    assert err == ["warning: 6 games are 3 pairs but there are 2 openings: openings are played again (the same "
                   "games again); name a larger --openings file or fewer --games"]
    assert (report["games"], report["distinct_openings"], report["repeated_openings"]) == (6, 2, 0)
