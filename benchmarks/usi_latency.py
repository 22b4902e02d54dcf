"""How long `tideborn usi` takes from reading `go` to writing `bestmove` at `byoyomi 100` (docs/benchmarks.md, "USI
engine"): the engine's own protocol loop and thinking, in this process, for untrained nets of two sizes, by policy
and with a search, with the latency it measures at start and the budget its time rule leaves.

    python -m benchmarks.usi_latency [--moves 40] [--threads 2]

Prints figures, never pass/fail: the machine is shared and its noise is part of what the margin is for.
"""

from __future__ import annotations

import argparse
import io
import statistics
import threading
import time

import cshogi
import torch

from tideborn.config.schema import ModelSettings
from tideborn.match.players import TorchPlayer
from tideborn.match.search import DEFAULT_BATCH, Searcher
from tideborn.network.model import build_model
from tideborn.usi.engine import Engine
from tideborn.usi.thinking import PolicyThinker, SearchThinker, measure_latency_ms

NETS = {"2x32": dict(blocks=2, channels=32), "10x192": dict(blocks=10, channels=192)}


class _Timed(io.StringIO):
    """The engine's stdout: notes when each `bestmove` line is written."""

    def __init__(self):
        super().__init__()
        self.answered = threading.Event()

    def write(self, text: str) -> int:
        if text.startswith("bestmove"):
            self.answered.set()
        return super().write(text)


def _latencies(engine: Engine, out: _Timed, moves: int) -> list[float]:
    board, spent = cshogi.Board(), []
    engine.handle("isready")
    for _ in range(moves):
        if board.is_game_over():
            break
        engine.handle("position sfen " + board.sfen())
        out.answered.clear()
        started = time.monotonic()
        engine.handle("go btime 0 wtime 0 byoyomi 100")
        out.answered.wait()
        spent.append((time.monotonic() - started) * 1000)
        engine.finish_thinking()
        board.push(_last_best(out, board))
    return spent


def _last_best(out: _Timed, board: cshogi.Board) -> int:
    line = [line for line in out.getvalue().splitlines() if line.startswith("bestmove")][-1]
    return board.move_from_usi(line.split()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=40)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    print(f"go btime 0 wtime 0 byoyomi 100, {args.moves} moves from the start position, {args.threads} threads, "
          f"NetworkDelay 100 ms")
    print(f"{'net':>7} {'thinker':>10} {'latency':>8} {'budget':>7} {'median':>7} {'max':>7}  (ms)")
    for name, shape in NETS.items():
        torch.manual_seed(0)
        player = TorchPlayer(build_model(ModelSettings(**shape)).eval())
        policy = PolicyThinker(player, measure_latency_ms(player))
        search = SearchThinker(Searcher(player), 800, measure_latency_ms(player, DEFAULT_BATCH))
        for thinker in (policy, search):
            out = _Timed()
            engine = Engine(name, lambda count, thinker=thinker: thinker, playouts=1, out=out)
            spent = _latencies(engine, out, args.moves)
            budget = max(0.0, 100 - 100 - 2 * thinker.latency_ms)
            print(f"{name:>7} {thinker.name:>10} {thinker.latency_ms:8.1f} {budget:7.0f} "
                  f"{statistics.median(spent):7.1f} {max(spent):7.1f}")


if __name__ == "__main__":
    main()
