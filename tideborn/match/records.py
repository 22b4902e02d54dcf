"""Finished games as CSA files (cshogi's exporter), which cshogi and shogi GUIs read."""

from __future__ import annotations

import io
from pathlib import Path

import cshogi
from cshogi import CSA

from tideborn.match.play import DRAW, WHITE_WINS, Game
from tideborn.safefile import write_atomically

_ENDINGS = {"mate": "%TORYO", "repetition": "%SENNICHITE", "entering king": "%KACHI", "max moves": "%JISHOGI",
            "resign": "%TORYO", "engine timed out": "%TIME_UP", "illegal move": "%ILLEGAL_MOVE",
            "false win declaration": "%ILLEGAL_MOVE", "engine crashed": "%CHUDAN"}
"""The CSA (V2.2) end-of-game line for each way a game ends. A mated side resigns (%TORYO), as in CSA
records; a move cap is recorded as %JISHOGI (an impasse draw), which every CSA reader knows; a perpetual
check is the checking side's illegal action (%+ILLEGAL_ACTION when black checked), see `ending`. An external
engine that resigns, runs out of its time or plays an illegal move gets CSA's line for it; one that crashed gets
%CHUDAN (the game broken off), and the comments after it say who won and why."""


def ending(game: Game) -> str:
    if game.reason == "perpetual check":
        return "%+ILLEGAL_ACTION" if game.result == WHITE_WINS else "%-ILLEGAL_ACTION"
    return _ENDINGS[game.reason]


def csa_text(game: Game, names: tuple[str, str]) -> str:
    """`game` as CSA text (cshogi's exporter, into memory)."""
    black, white = (names[0], names[1]) if game.black == 0 else (names[1], names[0])
    exporter = CSA.Exporter()
    exporter.f = io.StringIO()
    exporter.info(init_board=cshogi.Board(game.sfen), names=[black, white], version="V2.2",
                  var_info={"EVENT": "tideborn match", "OPENING": game.sfen})
    for move in game.moves:
        exporter.move(move)
    exporter.endgame(ending(game))
    exporter.f.write(f"'result {game.result}{'' if game.result == DRAW else ' wins'} by {game.reason}\n")
    if game.detail:
        exporter.f.write(f"'detail {' '.join(game.detail.split())}\n")
    return exporter.f.getvalue()


def write_csa(game: Game, path: Path, names: tuple[str, str]) -> None:
    """`game` as a CSA file at `path`, whole or not at all (`write_atomically`: a new temp file, never through a
    link or into another name's file, then renamed); a failed write (a full disk) removes the temp file and
    raises."""
    data = csa_text(game, names).encode("utf-8")
    write_atomically(path, lambda handle: handle.write(data))
