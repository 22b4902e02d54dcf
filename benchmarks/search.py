"""Benchmark that prints figures (never pass/fail): `python -m benchmarks.search`.

For each network size (untrained weights: the speed does not depend on them), alternating between the sizes
for several repetitions in one process: playouts/s of `Searcher.search_many` over positions from the shipped
openings (one forward pass for the leaves of all of them, as `tideborn match --mode search` does), and games/s
of search-against-search games played to the end or `--max-moves`. Medians with the spread (min-max).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import cshogi
import torch

from tideborn.config.schema import ModelSettings
from tideborn.match.openings import load_openings
from tideborn.match.play import new_games, play
from tideborn.match.search import Searcher
from tideborn.network.model import build_model


def _net(size: str) -> torch.nn.Module:
    blocks, channels = (int(part) for part in size.split("x"))
    torch.manual_seed(0)
    return build_model(ModelSettings(blocks=blocks, channels=channels)).eval()


def playouts_per_second(net: torch.nn.Module, boards: list[cshogi.Board], playouts: int) -> float:
    start = time.perf_counter()
    results = Searcher(net).search_many(boards, playouts=playouts)
    return sum(result.nodes for result in results) / (time.perf_counter() - start)


def games_per_second(net: torch.nn.Module, games: int, playouts: int, max_moves: int) -> tuple[float, float]:
    """Games/s and plies per game of a search-against-search match with `games` in flight."""
    openings = load_openings(None)
    match_games = new_games(openings, (games + 1) // 2, 0)
    seconds = play((net, net), match_games, parallel=len(match_games), max_moves=max_moves, mode="search",
                   playouts=playouts)
    return len(match_games) / seconds, statistics.mean(len(game.moves) for game in match_games)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.search", description=__doc__)
    parser.add_argument("--nets", default="2x32,10x192", help="blocks x channels, comma-separated")
    parser.add_argument("--positions", type=int, default=32, help="positions searched at once")
    parser.add_argument("--playouts", type=int, default=64)
    parser.add_argument("--games", type=int, default=8, help="games in flight for games/s")
    parser.add_argument("--max-moves", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--skip-games", action="store_true", help="playouts/s only")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    openings = load_openings(None)
    random.Random(0).shuffle(openings)
    boards = [cshogi.Board(sfen) for sfen in openings[:args.positions]]
    sizes = args.nets.split(",")
    nets = {size: _net(size) for size in sizes}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rates: dict[str, list[float]] = {size: [] for size in sizes}
    games: dict[str, list[tuple[float, float]]] = {size: [] for size in sizes}
    with torch.inference_mode():
        for size in sizes:  # warm-up: first calls pay for allocations
            Searcher(nets[size]).search_many(boards[:2], playouts=4)
        for repeat in range(args.repeats):
            for size in sizes:
                rates[size].append(playouts_per_second(nets[size], boards, args.playouts))
                line = f"  repeat {repeat + 1} {size}: {rates[size][-1]:,.0f} playouts/s"
                if not args.skip_games:
                    games[size].append(games_per_second(nets[size], args.games, args.playouts, args.max_moves))
                    line += f", {games[size][-1][0]:.3f} games/s"
                print(line, flush=True)  # each figure as it comes: a long run shows where it is
    for size in sizes:
        line = (f"{size}: {statistics.median(rates[size]):,.0f} playouts/s "
                f"({min(rates[size]):,.0f}-{max(rates[size]):,.0f}) over {args.positions} positions x "
                f"{args.playouts} playouts")
        if games[size]:
            per_second = [rate for rate, _ in games[size]]
            line += (f"; {statistics.median(per_second):.3f} games/s ({min(per_second):.3f}-{max(per_second):.3f}), "
                     f"{args.games} in flight, {statistics.mean(p for _, p in games[size]):.0f} plies a game")
        print(line)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
