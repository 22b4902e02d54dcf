"""Playing a match between two checkpoints: `run_match` and the report it returns (what `tideborn match --json`
prints). The trainer's `runtime.match_every` plays through it too; the command line is `tideborn.match.cli`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tideborn.errors import UserError

DEFAULT_GAMES = 200
DEFAULT_PARALLEL = 100
DEFAULT_MAX_MOVES = 320


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
    from tideborn.network.checkpoint import CheckpointError, load_checkpoint
    from tideborn.safefile import make_dirs

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
