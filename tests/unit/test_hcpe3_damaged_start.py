"""A start position whose 32 bytes make more pieces than shogi has is refused, the same way at every reading.

cshogi's decoder reads past such bytes (a HuffmanCodedPos's 256 bits are all a set of 40 pieces needs), so what
it builds, or whether it finds an incorrect code, changed from one reading to the next: the fast and the
move-by-move replays of one damaged file could disagree."""

from __future__ import annotations

import struct
from pathlib import Path

import cshogi
import numpy as np
import pytest

from tideborn.data.cache import hcpe3
from tideborn.data.decode import hcpe3_replay
from tideborn.data.decode.features import material_problem
from tideborn.errors import UserError

DAMAGED = bytes.fromhex("58a449210cd757217e8e4d212caf427814f5ab109e4d212cd75f213e8e49210c")
"""A start position from a fuzzed file (a few bytes of a real one changed): its pieces need more than 256 bits."""


def test_a_board_with_more_pieces_of_a_type_than_shogi_has_is_told_apart() -> None:
    # what the replay refuses a start position by (`features.material_problem`, shared with `data verify`)
    board = cshogi.Board()
    assert material_problem(board) is None
    board.set_sfen("lnsgkgsnl/1r5b1/ppppppppp/9/9/9/PPPPPPPPP/1B5R1/LNSGKGSNL b 2P 1")  # 20 pawns
    assert material_problem(board) is not None
    board.set_sfen("4k4/9/9/9/9/9/9/9/4K4 b 2R2B4G4S4N4L18P 1")  # every piece in one hand: a full set
    assert material_problem(board) is None
    board.set_sfen("4k4/9/9/9/9/9/9/+r8/4K4 b 2R 1")  # a dragon counts as a rook: three
    assert material_problem(board) is not None
    board.set_sfen("lnsgkgsnl/9/9/9/9/9/9/9/LNSGKGSNL b - 1")  # fewer pieces (a handicap-like set): fine
    assert material_problem(board) is None


@pytest.mark.parametrize("full", [True, False], ids=["full layout", "compact layout"])
def test_a_start_position_of_too_many_pieces_is_refused_every_time_in_the_same_words(tmp_path: Path, full) -> None:
    path = tmp_path / "damaged.hcpe3"
    path.write_bytes(DAMAGED + struct.pack("<HBB", 0, 1, 0))  # one game, no moves
    messages = set()
    for reading in range(12):
        keep = [np.full(int(size), reading, np.uint8) for size in (32, 33, 64, 96)]  # other memory each time
        with pytest.raises(UserError) as refused:
            hcpe3._build(path, full=full)
        messages.add(str(refused.value))
        del keep
    assert messages == {f"{path}: game 0 (byte 0): {hcpe3_replay.UNDECODABLE_START}; the file is not hcpe3 or is "
                        f"misaligned"}
