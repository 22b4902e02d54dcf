"""`tideborn match A.pt B.pt`: two checkpoints play each other; wins, draws, losses and Elo (docs/match.md).

Arguments are parsed before torch loads. Bad input (no such checkpoint, not a checkpoint, weights that
do not fit their settings, a bad openings file or line, a --save-games path that is a file) is one line on
stderr and exit status 2 before any game starts; Ctrl-C is one line and exit status 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from tideborn.errors import UserError, report_interrupted, report_user_error
from tideborn.trainer.cli import OneLineParser

DEFAULT_GAMES = 200
DEFAULT_PARALLEL = 100
DEFAULT_MAX_MOVES = 320
MAX_GAMES = 1_000_000
"""Every game is kept in memory until the report (its moves); a million is hours even on a GPU."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def _games(text: str) -> int:
    value = _positive(text)
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
    parser.add_argument("--max-moves", type=_positive, default=DEFAULT_MAX_MOVES,
                        help=f"plies from the opening after which a game is a draw (default {DEFAULT_MAX_MOVES})")
    parser.add_argument("--parallel", type=_positive, default=DEFAULT_PARALLEL,
                        help=f"games played at once, batched through each network (default {DEFAULT_PARALLEL})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    parser.add_argument("--threads", type=_positive, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--weights", choices=("auto", "ema", "raw"), default="auto",
                        help="ema or raw weights of both checkpoints (default auto: ema where a checkpoint "
                             "has them)")
    parser.add_argument("--save-games", type=Path, metavar="DIR",
                        help="write every game as DIR/game-NNNN.csa (CSA, read by cshogi and shogi GUIs)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    return parser


def _check_save_dir(path: Path) -> None:
    """Before any game: a directory (or none yet) without games in it, where files can be written (a read-only
    or full filesystem, /proc, no permission are refused now, not after the games are played)."""
    from tideborn.outputs import probe_directory

    if path.exists() and not path.is_dir():
        raise UserError(f"--save-games {path}: exists and is not a directory")
    try:
        if path.is_dir() and any(path.glob("game-*.csa")):
            raise UserError(f"--save-games {path}: already holds game-*.csa files; name a new or empty directory")
    except OSError as exc:
        raise UserError(f"--save-games {path}: cannot list it ({exc.strerror or exc})") from None
    probe_directory(path, "--save-games")


class SaveFailed(UserError):
    """A game could not be saved mid-match (a full disk): the match went on, its score stands; said after it."""


def run_match(first: Path, second: Path, *, games: int = DEFAULT_GAMES, openings: Path | None = None,
              seed: int = 0, temperature: float = 0.0, max_moves: int = DEFAULT_MAX_MOVES,
              parallel: int = DEFAULT_PARALLEL, device: str = "cpu", weights: str = "auto",
              save_games: Path | None = None, mode: str = "policy",
              run_files: tuple[bool, bool] = (False, False)) -> dict:
    """Play the match and return its report (what --json prints). Raises UserError for bad input.
    `run_files`: which of the two is a file of a run directory (`runtime.match_every`), read without
    following a link."""
    import random

    import torch

    from tideborn.export.onnx_export import choose_weights, reference_module
    from tideborn.match.elo import estimate
    from tideborn.match.openings import DEFAULT_OPENINGS, load_openings
    from tideborn.match.play import new_games, play
    from tideborn.match.records import write_csa
    from tideborn.rundir import make_dirs
    from tideborn.trainer.checkpoint import CheckpointError, load_checkpoint

    if save_games is not None:
        _check_save_dir(save_games)
    positions = load_openings(openings)
    chosen_device = _device(device)
    nets, sides = [], []
    for path, run_file in zip((first, second), run_files):
        try:
            payload = load_checkpoint(path, run_file=run_file)
        except CheckpointError as exc:
            raise UserError(str(exc)) from None
        try:
            kind = choose_weights(payload, weights)
            net = reference_module(payload, kind).to(chosen_device)
        except UserError as exc:
            raise UserError(f"{path}: {exc}") from None
        nets.append(net)
        sides.append({"path": str(path), "step": payload["step"], "weights": kind,
                      "model": payload.get("settings", {}).get("model")})
    order = list(range(len(positions)))
    random.Random(seed).shuffle(order)
    pairs = (games + 1) // 2
    shuffled = [positions[i] for i in order]
    match_games = new_games(shuffled, pairs, seed)
    names = (_name(first, sides[0]["step"]), _name(second, sides[1]["step"]))
    if names[0] == names[1]:
        names = (names[0] + " (A)", names[1] + " (B)")
    if save_games is not None:
        try:
            make_dirs(save_games)
        except OSError as exc:
            raise UserError(f"--save-games {save_games}: cannot create it ({exc.strerror or exc})") from None
    saved: list[int] = []
    save_failed: list[str] = []

    def finished(game) -> None:
        if save_games is None or save_failed:
            return  # after a failed save, the rest are not tried: the disk that failed stays full
        path = save_games / f"game-{game.index + 1:04d}.csa"
        try:
            write_csa(game, path, names)
            saved.append(game.index)
        except (OSError, UserError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            save_failed.append(f"--save-games {save_games}: could not write {path.name} ({why})")

    seconds = play((nets[0], nets[1]), match_games, parallel=parallel, max_moves=max_moves,
                   temperature=temperature, device=chosen_device, on_finished=finished, mode=mode)
    scores = [game.score_of_first() for game in match_games]
    result = estimate(scores, list(zip(scores[0::2], scores[1::2])))
    moves = sum(len(game.moves) for game in match_games)
    return {
        "first": sides[0], "second": sides[1], **result.as_dict(),
        "openings": str(openings or DEFAULT_OPENINGS), "distinct_openings": min(pairs, len(positions)),
        "mode": mode, "temperature": temperature,
        "policy": (("argmax" if temperature == 0 else f"softmax T={temperature:g}")
                   + (" policy" if mode == "policy" else " value (1 ply)")),
        "seed": seed, "max_moves": max_moves, "parallel": parallel, "device": str(chosen_device),
        "threads": torch.get_num_threads(),
        "seconds": round(seconds, 3), "games_per_second": round(len(match_games) / max(seconds, 1e-9), 3),
        "moves": moves, "ends": dict(Counter(game.reason for game in match_games).most_common()),
        "first_as_black_score": sum(scores[0::2]) / pairs, "first_as_white_score": sum(scores[1::2]) / pairs,
        "saved_games": str(save_games) if save_games is not None else None,
        "games_saved": len(saved) if save_games is not None else None,
        "save_error": (f"{save_failed[0]}; {len(saved)} of {len(match_games)} games saved, the score above "
                       "counts all of them") if save_failed else None,
    }


def _name(path: Path, step: int) -> str:
    return f"{path.parent.name}/step-{step}" if path.parent.name else f"step-{step}"


def _device(text: str):
    import torch

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UserError(f"--device {text!r}: not a device (cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {text}: CUDA is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {text}: only cpu and cuda are supported")
    return device


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
