"""Playing matches: `run_match` (two players, checkpoints or ONNX models) and `run_round_robin` (every pair of
several, rated together), and the reports they return (what `tideborn match --json` prints). The trainer's
`runtime.match_every` plays through `run_match` too; the command line is `tideborn.match.cli`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tideborn.errors import UserError

DEFAULT_GAMES = 200
DEFAULT_PARALLEL = 100
DEFAULT_MAX_MOVES = 320
DEFAULT_PLAYOUTS = 64


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


def run_match(first: Path, second: Path, *, games: int = DEFAULT_GAMES, openings: Path | None = None,
              seed: int = 0, temperature: float = 0.0, max_moves: int = DEFAULT_MAX_MOVES,
              parallel: int = DEFAULT_PARALLEL, device: str = "cpu", weights: str = "auto",
              save_games: Path | None = None, mode: str = "policy",
              run_files: tuple[bool, bool] = (False, False), onnx_value: str = "auto",
              threads: int | None = None, playouts: int = DEFAULT_PLAYOUTS, engines=None,
              keep_repeated_openings: bool = False, warn: Callable[[str], None] | None = None) -> dict:
    """Play the match and return its report (what --json prints). Raises UserError for bad input.
    Each side is a checkpoint or an ONNX model (`tideborn.match.players`). `run_files`: which of the two is a
    file of a run directory (`runtime.match_every`), read without following a link (always a checkpoint).
    `playouts`: per move, in search mode.
    A side `usi:PATH` is an external USI engine (`tideborn.match.external`), run as `engines`
    (`EngineSettings`) say; it is started and checked before the first game and asked to quit after the last.
    Openings that repeat an earlier position are dropped unless `keep_repeated_openings`, and `warn` is told
    (one line) either way, before any game."""
    if save_games is not None:
        _check_save_dir(save_games)
    chosen_openings = _openings(openings, keep_repeated_openings, warn, games, temperature)
    chosen_device = _device(device)
    engines = _check_engines([first, second], engines)
    players: list = []
    try:
        for number, (path, run_file) in enumerate(zip((first, second), run_files), start=1):
            players.append(_load(path, weights, chosen_device, run_file, onnx_value, threads, number, engines))
        return _play_pair(players, chosen_openings, games=games, seed=seed, temperature=temperature,
                          max_moves=max_moves, parallel=parallel, device=chosen_device, save_games=save_games,
                          mode=mode, playouts=playouts, engines=engines)
    finally:
        _close(players)


def run_round_robin(paths: list[Path], *, games: int = DEFAULT_GAMES, openings: Path | None = None,
                    seed: int = 0, temperature: float = 0.0, max_moves: int = DEFAULT_MAX_MOVES,
                    parallel: int = DEFAULT_PARALLEL, device: str = "cpu", weights: str = "auto",
                    save_games: Path | None = None, mode: str = "policy", onnx_value: str = "auto",
                    threads: int | None = None, playouts: int = DEFAULT_PLAYOUTS, engines=None,
                    keep_repeated_openings: bool = False, warn: Callable[[str], None] | None = None) -> dict:
    """Every pair of `paths` plays a match of `games` games (the same openings for each pair); the report
    holds each pair's and the ratings fitted over all games (`tideborn.match.ratings`), the first player
    the anchor at 0. Every player is loaded, and every input checked, before the first game. Repeated openings
    as `run_match`."""
    if len(paths) < 2:
        raise UserError(f"a round robin needs two players or more; got {len(paths)}")
    if save_games is not None:
        _check_save_dir(save_games)
    chosen_openings = _openings(openings, keep_repeated_openings, warn, games, temperature)
    chosen_device = _device(device)
    engines = _check_engines(paths, engines)
    players: list = []
    try:
        for number, path in enumerate(paths, start=1):
            players.append(_load(path, weights, chosen_device, False, onnx_value, threads, number, engines))
        return _round_robin(players, paths, chosen_openings, games=games, seed=seed,
                            temperature=temperature, max_moves=max_moves, parallel=parallel, device=chosen_device,
                            save_games=save_games, mode=mode, playouts=playouts, engines=engines)
    finally:
        _close(players)


def _openings(path: Path | None, keep_repeated: bool, warn: Callable[[str], None] | None, games: int,
              temperature: float):
    """The openings to play (`tideborn.match.openings.choose_openings`); `warn` is told of any repeats in the file,
    and of more game pairs than openings, which plays openings again (the same games, with argmax play)."""
    from tideborn.match.openings import choose_openings

    chosen = choose_openings(path, keep_repeated)
    warnings = [chosen.warning()]
    pairs, available = (games + 1) // 2, len(chosen.positions)
    if pairs > available:  # (repeats kept on purpose are the warning above's)
        again = "the same games again" if temperature == 0 else "from the same positions"
        warnings.append(f"{games:,} games are {pairs:,} pairs but there are {available:,} openings: openings are "
                        f"played again ({again}); name a larger --openings file or fewer --games")
    for warning in warnings:
        if warning and warn is not None:
            warn(warning)
    return chosen


def _round_robin(players: list, paths: list[Path], chosen_openings, *, games: int,
                 seed: int, temperature: float, max_moves: int, parallel: int, device, save_games: Path | None,
                 mode: str, playouts: int, engines) -> dict:
    import numpy as np

    from tideborn.match.ratings import fit_ratings

    chosen_device = device
    count = len(players)
    points, played = np.zeros((count, count)), np.zeros((count, count))
    pairs = []
    save_error = None
    for i in range(count):
        for j in range(i + 1, count):
            folder = save_games / f"pair-{i + 1:02d}-{j + 1:02d}" if save_games is not None else None
            report = _play_pair([players[i], players[j]], chosen_openings, games=games, seed=seed,
                                temperature=temperature, max_moves=max_moves, parallel=parallel,
                                device=chosen_device, save_games=None if save_error else folder, mode=mode,
                                playouts=playouts, engines=engines)
            save_error = save_error or report["save_error"]
            report.update(first_index=i, second_index=j)
            pairs.append(report)
            first_points = report["wins"] + report["draws"] / 2
            points[i, j] += first_points
            points[j, i] += report["games"] - first_points
            played[i, j] = played[j, i] = report["games"]
    table = fit_ratings(points, played, anchor=0)
    ratings = [{"player": rating.player, "path": str(paths[rating.player]), "elo": rating.elo,
                "elo_low": rating.elo_low, "elo_high": rating.elo_high, "games": rating.games,
                "points": rating.points, "score": rating.score} for rating in table.ratings]
    seconds = sum(report["seconds"] for report in pairs)
    total = sum(report["games"] for report in pairs)
    return {
        "round_robin": True, "players": [player.info for player in players], "pairs": pairs,
        "ratings": ratings, "anchor": 0, "virtual_draws": table.virtual_draws,
        "rating_model": "Bradley-Terry on the Elo scale, maximum likelihood over all games, draws as half points; "
                        "95% intervals from the Hessian, relative to the anchor",
        "games": total, "games_per_pair": pairs[0]["games"], "policy": pairs[0]["policy"], "mode": mode,
        "playouts": pairs[0]["playouts"],
        "temperature": temperature, "seed": seed, "max_moves": max_moves, "parallel": parallel,
        **{key: pairs[0][key] for key in ("openings", "distinct_openings", "repeated_openings",
                                          "repeated_openings_kept")},
        "device": str(chosen_device), "threads": pairs[0]["threads"],
        "seconds": round(seconds, 3), "games_per_second": round(total / max(seconds, 1e-9), 3),
        "saved_games": str(save_games) if save_games is not None else None,
        "save_error": save_error,
    }


def _check_engines(paths: list[Path], engines):
    """The engine settings, checked against the sides: an option for a player that is not a `usi:` engine, or
    options with no engine at all, are refused."""
    from tideborn.match.external import EngineSettings, is_engine_side

    engines = engines or EngineSettings()
    sides = {number for number, path in enumerate(paths, start=1) if is_engine_side(path)}
    for who, name, value in engines.options:
        if who is None and not sides:
            raise UserError(f"--engine-option {name}={value}: no player is a usi:PATH engine")
        if who is not None and who not in sides:
            raise UserError(f"--engine-option {who}:{name}={value}: player {who} is not a usi:PATH engine "
                            f"(engines: {', '.join(map(str, sorted(sides))) or 'none'})")
    return engines


def _close(players: list) -> None:
    for player in players:
        close = getattr(player, "close", None)
        if close is not None:
            close()


def _load(path: Path, weights: str, device, run_file: bool, onnx_value: str, threads: int | None,
          number: int = 1, engines=None):
    from tideborn.match.external import EngineSettings, is_engine_side, load_engine
    from tideborn.match.players import load_player

    if not run_file and is_engine_side(path):
        return load_engine(str(path), number, engines or EngineSettings())
    return load_player(path, weights=weights, device=device, run_file=run_file, onnx_value=onnx_value,
                       threads=threads)


def _play_pair(players: list, chosen_openings, *, games: int, seed: int,
               temperature: float, max_moves: int, parallel: int, device, save_games: Path | None,
               mode: str, playouts: int = DEFAULT_PLAYOUTS, engines=None) -> dict:
    """One match between two loaded players, and its report."""
    import random

    import torch

    from tideborn.match.elo import estimate
    from tideborn.match.openings import position_key
    from tideborn.match.play import new_games, play
    from tideborn.match.records import write_csa
    from tideborn.safefile import make_dirs

    positions = chosen_openings.positions
    order = list(range(len(positions)))
    random.Random(seed).shuffle(order)
    pairs = (games + 1) // 2
    shuffled = [positions[i] for i in order]
    match_games = new_games(shuffled, pairs, seed)
    distinct = len({position_key(game.sfen) for game in match_games})
    names = (players[0].name, players[1].name)
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

    seconds = play((players[0], players[1]), match_games, parallel=parallel, max_moves=max_moves,
                   temperature=temperature, device=device, on_finished=finished, mode=mode, playouts=playouts)
    scores = [game.score_of_first() for game in match_games]
    result = estimate(scores, list(zip(scores[0::2], scores[1::2])))
    moves = sum(len(game.moves) for game in match_games)
    return {
        "first": players[0].info, "second": players[1].info, **result.as_dict(),
        "openings": str(chosen_openings.source), "distinct_openings": distinct,
        "repeated_openings": len(chosen_openings.repeats), "repeated_openings_kept": chosen_openings.kept,
        "mode": mode, "temperature": temperature, "playouts": playouts if mode == "search" else None,
        "policy": _how_moves_are_chosen(mode, temperature, playouts),
        "seed": seed, "max_moves": max_moves, "parallel": parallel, "device": str(device),
        "threads": torch.get_num_threads(),
        "seconds": round(seconds, 3), "games_per_second": round(len(match_games) / max(seconds, 1e-9), 3),
        "moves": moves, "ends": dict(Counter(game.reason for game in match_games).most_common()),
        "first_as_black_score": sum(scores[0::2]) / pairs, "first_as_white_score": sum(scores[1::2]) / pairs,
        "engines": engines.as_dict() if any(getattr(p, "external", False) for p in players) else None,
        "incidents": [{"game": game.index + 1, "reason": game.reason, "detail": game.detail}
                      for game in match_games if game.detail],
        "saved_games": str(save_games) if save_games is not None else None,
        "games_saved": len(saved) if save_games is not None else None,
        "save_error": (f"{save_failed[0]}; {len(saved)} of {len(match_games)} games saved, the score above "
                       "counts all of them") if save_failed else None,
    }


def _how_moves_are_chosen(mode: str, temperature: float, playouts: int) -> str:
    if mode == "search":
        chosen = "most visited" if temperature == 0 else f"drawn by visits^(1/{temperature:g})"
        return f"PUCT search, {playouts} playouts a move, {chosen}"
    return (("argmax" if temperature == 0 else f"softmax T={temperature:g}")
            + (" policy" if mode == "policy" else " value (1 ply)"))


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


def choose_device(text: str):
    """The torch device `--device TEXT` names (cpu, cuda, cuda:N, auto); `UserError` for one that cannot be used."""
    return _device(text)
