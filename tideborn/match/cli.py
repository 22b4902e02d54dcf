"""`tideborn match A B`: two players (checkpoints or ONNX models) play each other; wins, draws, losses and Elo.
`tideborn match A B C ... --round-robin`: every pair plays, and one rating table is fitted to all the games
(docs/match.md).

Arguments are parsed before torch loads. Bad input (no such checkpoint or model, not a checkpoint, an ONNX
model without dlshogi's interface, weights that do not fit their settings, a bad openings file or line, a
--save-games path that is a file) is one line on stderr and exit status 2 before any game starts; Ctrl-C is
one line and exit status 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tideborn.cliparser import OneLineParser, positive_int
from tideborn.errors import UserError, report_interrupted, report_user_error
from tideborn.match.run import (
    DEFAULT_GAMES,
    DEFAULT_MAX_MOVES,
    DEFAULT_PARALLEL,
    DEFAULT_PLAYOUTS,
    run_match,
    run_round_robin,
)

MAX_GAMES = 1_000_000
"""Every game is kept in memory until the report (its moves); a million is hours even on a GPU."""


def _games(text: str) -> int:
    value = positive_int(text)
    if value > MAX_GAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_GAMES:,}; got {value:,}")
    return value


MAX_PLAYOUTS = 100_000
"""A tree of Python nodes grows about a kilobyte a playout, one tree per game in flight: 100,000 playouts for
100 games is some 10 GB; and at a few thousand playouts a second on a CPU, more would take hours a move."""


def _playouts(text: str) -> int:
    value = positive_int(text)
    if value > MAX_PLAYOUTS:
        raise argparse.ArgumentTypeError(f"at most {MAX_PLAYOUTS:,}; got {value:,}")
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


def _engine_option(text: str) -> tuple[int | None, str, str]:
    """`NAME=VALUE` for every engine, `N:NAME=VALUE` for player N only (numbered from 1 as named)."""
    who = None
    head, sep, value = text.partition("=")
    if not sep or not head.strip():
        raise argparse.ArgumentTypeError(f"expected [N:]NAME=VALUE; got {text!r}")
    number, colon, name = head.partition(":")
    if colon:
        if not number.isdigit() or int(number) < 1:
            raise argparse.ArgumentTypeError(f"expected a player number from 1 before ':'; got {text!r}")
        who = int(number)
    else:
        name = head
    if not name.strip() or any(ch in name + value for ch in "\n\r"):
        raise argparse.ArgumentTypeError(f"expected [N:]NAME=VALUE; got {text!r}")
    return who, name.strip(), value.strip()


def _milliseconds(text: str) -> int:
    value = positive_int(text)
    if value > 24 * 3600 * 1000:
        raise argparse.ArgumentTypeError(f"at most a day (86400000 ms); got {value}")
    return value


def build_parser(prog: str = "tideborn match") -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description="Play two networks (checkpoints or ONNX models) against each "
                                                  "other and report the score as Elo (first vs second), or "
                                                  "several in a round robin rated together.")
    parser.add_argument("first", type=Path, metavar="A",
                        help="the player whose score is reported: a checkpoint (.pt) or an ONNX model with "
                             "dlshogi's inputs and outputs (.onnx, e.g. from tideborn export)")
    parser.add_argument("second", type=Path, metavar="B",
                        help="its opponent, a checkpoint or an ONNX model; any player may also be usi:PATH, the "
                             "USI engine at PATH (an executable) run as a subprocess")
    parser.add_argument("others", type=Path, nargs="*", metavar="C",
                        help="more players, with --round-robin")
    parser.add_argument("--round-robin", action="store_true",
                        help="every pair of the players plays --games games; prints ratings fitted by maximum "
                             "likelihood over all games, anchored at the first player (0)")
    parser.add_argument("--games", type=_games, default=DEFAULT_GAMES,
                        help=f"games to play (per pair with --round-robin), an even number: each opening twice, "
                             f"colours swapped (an odd number is rounded up; default {DEFAULT_GAMES})")
    parser.add_argument("--onnx-value", choices=("auto", "logit", "probability"), default="auto",
                        help="what an ONNX model's value output holds (default auto: from its tideborn metadata, "
                             "else its graph, else its outputs; refused when none tells)")
    parser.add_argument("--openings", type=Path, metavar="FILE",
                        help="start positions: SFEN lines ('#' comments; 'startpos' and 'moves ...' allowed) or an "
                             ".hcpe file (default: 621 positions from the WCSC28 games shipped with tideborn)")
    parser.add_argument("--keep-repeated-openings", action="store_true",
                        help="play an opening position the file holds twice or more as often as it is there (by "
                             "default each is played once: with argmax play a repeat replays the same games and "
                             "narrows the interval falsely); either way a warning names the repeats")
    parser.add_argument("--seed", type=_seed, default=0,
                        help="order of the openings and, with --temperature, the moves drawn (default 0)")
    parser.add_argument("--temperature", type=_temperature, default=0.0,
                        help="0 plays the legal move with the largest policy logit (default); T > 0 draws "
                             "moves from softmax(logits / T) over the legal moves")
    parser.add_argument("--mode", choices=("policy", "value", "search"), default="policy",
                        help="policy: move by the policy head (default); value: a 1-ply search, every legal move "
                             "tried and the one leaving the opponent the lowest value taken (slower); search: a "
                             "PUCT tree search of --playouts per move guided by policy and value, as dlshogi's")
    parser.add_argument("--playouts", type=_playouts, metavar="N",
                        help=f"with --mode search: playouts per move (default {DEFAULT_PLAYOUTS}; at most "
                             f"{MAX_PLAYOUTS:,})")
    parser.add_argument("--max-moves", type=positive_int, default=DEFAULT_MAX_MOVES,
                        help=f"plies from the opening after which a game is a draw (default {DEFAULT_MAX_MOVES})")
    parser.add_argument("--parallel", type=positive_int, default=DEFAULT_PARALLEL,
                        help=f"games played at once, batched through each network (default {DEFAULT_PARALLEL})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--threads", type=positive_int,
                        help="torch's and onnxruntime's CPU threads (default: their choice)")
    parser.add_argument("--weights", choices=("auto", "ema", "raw"), default="auto",
                        help="ema or raw weights of the checkpoints (default auto: ema where a checkpoint "
                             "has them)")
    parser.add_argument("--save-games", type=Path, metavar="DIR",
                        help="write every game as DIR/game-NNNN.csa (CSA, read by cshogi and shogi GUIs)")
    parser.add_argument("--engine-option", type=_engine_option, action="append", default=[],
                        metavar="[N:]NAME=VALUE",
                        help="set a USI option of every usi: engine, or with N: of player N only (numbered from 1 "
                             "as named); repeatable")
    parser.add_argument("--engine-byoyomi", type=_milliseconds, metavar="MS",
                        help="usi: engines think each move with this byoyomi and no main time (default 1000 "
                             "unless --engine-nodes is given)")
    parser.add_argument("--engine-nodes", type=positive_int, metavar="N",
                        help="usi: engines search at most N nodes a move (go nodes N)")
    parser.add_argument("--engine-timeout", type=_milliseconds, metavar="MS",
                        help="a usi: engine with no bestmove after MS loses the game on time and is restarted "
                             "(default: the byoyomi + 1000, or 30000 with --engine-nodes alone)")
    parser.add_argument("--engine-start-timeout", type=_milliseconds, metavar="MS",
                        help="time for a usi: engine to answer usiok and readyok at start (default 30000)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    return parser


class SaveFailed(UserError):
    """A game could not be saved mid-match (a full disk): the match went on, its score stands; said after it."""


def player_text(side: dict) -> str:
    """A player as the reports name it: the path, and what it is."""
    if side.get("kind") == "usi":
        restarts = f", restarted {side['restarts']}x" if side.get("restarts") else ""
        return f"{side['path']} (USI engine {side.get('engine') or '?'}, {side['go']}{restarts})"
    if side.get("kind") == "onnx":
        made = f", step {side['step']}" if side.get("step") is not None else ""
        how = {"option": "--onnx-value", "metadata": "its metadata", "graph": "its graph",
               "outputs": "its outputs"}.get(side.get("value_source"), side.get("value_source"))
        return f"{side['path']} (ONNX{made}, value as a {side['value']} by {how})"
    return f"{side['path']} (step {side['step']}, {side['weights']})"


def describe(report: dict) -> str:
    first, second = report["first"], report["second"]
    ends = ", ".join(f"{reason} {count}" for reason, count in report["ends"].items())
    lines = [
        f"{player_text(first)} vs {player_text(second)}: {report['games']} games, {report['distinct_openings']} "
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
    for incident in report.get("incidents") or []:
        lines.append(f"  game {incident['game']}: {incident['reason']}: {incident['detail']}")
    if report["saved_games"] and not report.get("save_error"):
        lines.append(f"  games saved as CSA in {report['saved_games']}/")
    return "\n".join(lines)


def describe_round_robin(report: dict) -> str:
    """The rating table (best first, rank and interval), then each pair's result in one line."""
    players = report["players"]
    lines = [f"round robin of {len(players)} players: {len(report['pairs'])} pairs x {report['games_per_pair']} "
             f"games ({report['games']} games), {report['policy']}, draw after {report['max_moves']} plies"]
    for index, side in enumerate(players):
        lines.append(f"  {index + 1}. {player_text(side)}")
    prior = (f"; a perfect score has no finite maximum, so each pair got {report['virtual_draws']} virtual draw"
             if report["virtual_draws"] else "")
    lines.append(f"ratings: Elo by maximum likelihood over all {report['games']} games, anchored at player 1 = 0; "
                 f"95% intervals{prior}")
    lines.append(f"  {'rank':>4}  {'Elo':>6}  {'95% interval':<15} {'games':>6}  {'score':>6}  player")
    ranked = sorted(report["ratings"], key=lambda rating: -rating["elo"])
    for rank, rating in enumerate(ranked, 1):
        interval = ("anchor" if rating["player"] == report["anchor"] else
                    f"[{_format_elo(rating['elo_low'])}, {_format_elo(rating['elo_high'])}]")
        lines.append(f"  {rank:>4}  {_format_elo(rating['elo']):>6}  {interval:<15} {rating['games']:>6}  "
                     f"{100 * rating['score']:5.1f}%  {rating['player'] + 1}. {rating['path']}")
    lines.append("pairs (first player's wins, draws, losses):")
    for pair in report["pairs"]:
        lines.append(f"  {pair['first_index'] + 1} vs {pair['second_index'] + 1}: {pair['wins']}-{pair['draws']}-"
                     f"{pair['losses']}, score {100 * pair['score']:.1f}%, Elo {_elo_text(pair['elo'], pair['score'])}")
    lines.append(f"  {report['games']} games in {report['seconds']:.1f} s: {report['games_per_second']:.1f} games/s "
                 f"on {report['device']} ({report['threads']} threads)")
    if report["saved_games"] and not report.get("save_error"):
        lines.append(f"  games saved as CSA in {report['saved_games']}/pair-NN-MM/")
    return "\n".join(lines)


def _format_elo(value: float) -> str:
    from tideborn.match.elo import format_elo

    return format_elo(value)


def _elo_text(value: float | None, score: float) -> str:
    from tideborn.match.elo import format_elo

    if value is None:  # infinite: a bound at 0% or 100%
        return "-inf" if score < 0.5 else "+inf"
    return format_elo(value)


def _engine_settings(args: argparse.Namespace):
    from tideborn.match.external import DEFAULT_START_TIMEOUT_MS, EngineSettings

    return EngineSettings(byoyomi_ms=args.engine_byoyomi, nodes=args.engine_nodes, timeout_ms=args.engine_timeout,
                          start_timeout_ms=args.engine_start_timeout or DEFAULT_START_TIMEOUT_MS,
                          options=tuple(args.engine_option))


def main(argv: list[str] | None = None, prog: str = "tideborn match") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.others and not args.round_robin:
        parser.error(f"{2 + len(args.others)} players named: name two, or add --round-robin to play every pair")
    if args.playouts is not None and args.mode != "search":
        parser.error(f"--playouts {args.playouts}: playouts are for --mode search (the mode is {args.mode})")
    try:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        common = dict(games=args.games, openings=args.openings, seed=args.seed, temperature=args.temperature,
                      max_moves=args.max_moves, parallel=args.parallel, device=args.device, weights=args.weights,
                      save_games=args.save_games, mode=args.mode, onnx_value=args.onnx_value, threads=args.threads,
                      playouts=args.playouts or DEFAULT_PLAYOUTS, engines=_engine_settings(args),
                      keep_repeated_openings=args.keep_repeated_openings,
                      warn=lambda text: print(f"warning: {text}", file=sys.stderr, flush=True))
        if args.round_robin:
            report = run_round_robin([args.first, args.second, *args.others], **common)
        else:
            report = run_match(args.first, args.second, **common)
    except UserError as exc:
        return report_user_error(exc, prog)
    except KeyboardInterrupt:
        return report_interrupted(prog)
    try:
        if args.json:
            json.dump(report, sys.stdout)
            sys.stdout.write("\n")
        else:
            print(describe_round_robin(report) if args.round_robin else describe(report))
        sys.stdout.flush()
    except BrokenPipeError:
        return 0
    if report["save_error"]:
        return report_user_error(SaveFailed(report["save_error"]), prog)
    return 0
