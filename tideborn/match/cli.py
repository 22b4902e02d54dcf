"""`tideborn match A.pt B.pt`: two checkpoints play each other; wins, draws, losses and Elo (docs/match.md).

Arguments are parsed before torch loads. Bad input (no such checkpoint, not a checkpoint, weights that
do not fit their settings, a bad openings file or line, a --save-games path that is a file) is one line on
stderr and exit status 2 before any game starts; Ctrl-C is one line and exit status 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_interrupted, report_user_error
from tideborn.match.run import DEFAULT_GAMES, DEFAULT_MAX_MOVES, DEFAULT_PARALLEL, run_match

MAX_GAMES = 1_000_000
"""Every game is kept in memory until the report (its moves); a million is hours even on a GPU."""


def _games(text: str) -> int:
    value = positive_int(text)
    if value > MAX_GAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_GAMES:,}; got {value:,}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2**63 - 1; got {value}")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100; got {value}")
    return value


def build_parser(prog: str = "tideborn match") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Play two checkpoints' networks against each other with "
                                                  "their policies and report the score as Elo (first vs second).")
    parser.add_argument("first", type=Path, metavar="A.pt", help="the checkpoint whose score is reported")
    parser.add_argument("second", type=Path, metavar="B.pt", help="its opponent")
    parser.add_argument("--games", type=_games, default=DEFAULT_GAMES,
                        help=f"games to play, an even number: each opening twice, colours swapped "
                             f"(an odd number is rounded up; default {DEFAULT_GAMES})")
    parser.add_argument("--openings", type=Path, metavar="FILE",
                        help="start positions: SFEN lines ('#' comments; 'startpos' and 'moves ...' allowed) or an "
                             ".hcpe file (default: 621 positions from the WCSC28 games shipped with tideborn)")
    parser.add_argument("--seed", type=_seed, default=0,
                        help="order of the openings and, with --temperature, the moves drawn (default 0)")
    parser.add_argument("--temperature", type=_temperature, default=0.0,
                        help="0 plays the legal move with the largest policy logit (default); T > 0 draws "
                             "moves from softmax(logits / T) over the legal moves")
    parser.add_argument("--mode", choices=("policy", "value"), default="policy",
                        help="policy: move by the policy head (default); value: a 1-ply search, every legal move "
                             "tried and the one leaving the opponent the lowest value taken (slower)")
    parser.add_argument("--max-moves", type=positive_int, default=DEFAULT_MAX_MOVES,
                        help=f"plies from the opening after which a game is a draw (default {DEFAULT_MAX_MOVES})")
    parser.add_argument("--parallel", type=positive_int, default=DEFAULT_PARALLEL,
                        help=f"games played at once, batched through each network (default {DEFAULT_PARALLEL})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--weights", choices=("auto", "ema", "raw"), default="auto",
                        help="ema or raw weights of both checkpoints (default auto: ema where a checkpoint "
                             "has them)")
    parser.add_argument("--save-games", type=Path, metavar="DIR",
                        help="write every game as DIR/game-NNNN.csa (CSA, read by cshogi and shogi GUIs)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    return parser


class SaveFailed(UserError):
    """A game could not be saved mid-match (a full disk): the match went on, its score stands; said after it."""


def describe(report: dict) -> str:
    first, second = report["first"], report["second"]
    ends = ", ".join(f"{reason} {count}" for reason, count in report["ends"].items())
    lines = [
        f"{first['path']} (step {first['step']}, {first['weights']}) vs {second['path']} "
        f"(step {second['step']}, {second['weights']}): {report['games']} games, {report['distinct_openings']} "
        f"openings x 2 colours, {report['policy']}, draw after {report['max_moves']} plies",
        f"  first: {report['wins']} wins, {report['draws']} draws, {report['losses']} losses; "
        f"score {100 * report['score']:.1f}% (as black {100 * report['first_as_black_score']:.1f}%, "
        f"as white {100 * report['first_as_white_score']:.1f}%)",
        f"  Elo {_elo_text(report['elo'], report['score'])} "
        f"[{_elo_text(report['elo_low'], report['score'])}, {_elo_text(report['elo_high'], report['score'])}] "
        f"(95%, {report['model']}); likelihood of superiority {100 * report['los']:.1f}%",
        f"  ends: {ends}",
        f"  {report['games']} games, {report['moves']} moves in {report['seconds']:.1f} s: "
        f"{report['games_per_second']:.1f} games/s on {report['device']} ({report['threads']} threads)",
    ]
    if report["saved_games"] and not report.get("save_error"):
        lines.append(f"  games saved as CSA in {report['saved_games']}/")
    return "\n".join(lines)


def _elo_text(value: float | None, score: float) -> str:
    from tideborn.match.elo import format_elo

    if value is None:  # infinite: a bound at 0% or 100%
        return "-inf" if score < 0.5 else "+inf"
    return format_elo(value)


def main(argv: list[str] | None = None, prog: str = "tideborn match") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        report = run_match(args.first, args.second, games=args.games, openings=args.openings, seed=args.seed,
                           temperature=args.temperature, max_moves=args.max_moves, parallel=args.parallel,
                           device=args.device, weights=args.weights, save_games=args.save_games,
                           mode=args.mode)
    except UserError as exc:
        return report_user_error(exc, prog)
    except KeyboardInterrupt:
        return report_interrupted(prog)
    try:
        if args.json:
            json.dump(report, sys.stdout)
            sys.stdout.write("\n")
        else:
            print(describe(report))
        sys.stdout.flush()
    except BrokenPipeError:
        return 0
    if report["save_error"]:
        return report_user_error(SaveFailed(report["save_error"]), prog)
    return 0
