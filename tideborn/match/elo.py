"""A match score as an Elo difference with a 95% interval, and the likelihood of superiority.

The interval comes from the variance of the score. Games are played in pairs (one opening, both
colours), and the two games of a pair are not independent (an opening that favours one side gives a
win and a loss), so when every game has its partner the variance is taken over the pairs' scores (the
pentanomial model that fishtest and nnue-pytorch use); otherwise over single games (trinomial). The
score's interval, clipped to (0, 1), maps through Elo = -400 log10(1/score - 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

Z95 = 1.959963984540054


def elo_of_score(score: float) -> float:
    """Elo difference that the logistic model gives for an expected `score`; +-inf at 1 and 0."""
    if score <= 0.0:
        return -math.inf
    if score >= 1.0:
        return math.inf
    return -400.0 * math.log10(1.0 / score - 1.0) + 0.0  # + 0.0: an even score is 0, not -0


@dataclass(frozen=True)
class Estimate:
    games: int
    wins: int
    draws: int
    losses: int
    score: float
    elo: float
    elo_low: float
    elo_high: float
    los: float
    """Likelihood of superiority: the probability that the first player is the stronger, from wins and
    losses alone (draws say nothing about it), by the normal approximation."""
    model: str
    """pentanomial (over opening pairs) or trinomial (over games)."""

    def as_dict(self) -> dict:
        """For JSON: infinite Elo (a 100% or 0% score) as null."""
        return {key: (None if isinstance(value, float) and math.isinf(value) else value)
                for key, value in asdict(self).items()}


def estimate(scores: list[float], pairs: list[tuple[float, float]] | None = None) -> Estimate:
    """`scores` are the first player's points per game (1, 0.5, 0); `pairs` the same games by opening."""
    n = len(scores)
    if n == 0:
        raise ValueError("no games")
    wins, draws = scores.count(1.0), scores.count(0.5)
    losses = n - wins - draws
    mean = sum(scores) / n
    if pairs and 2 * len(pairs) == n:
        units = [(a + b) / 2 for a, b in pairs]
        model = "pentanomial"
    else:
        units = list(scores)
        model = "trinomial"
    variance = sum((u - mean) ** 2 for u in units) / len(units)
    half = Z95 * math.sqrt(variance / len(units))
    low, high = max(mean - half, 0.0), min(mean + half, 1.0)
    decisive = wins + losses
    los = 0.5 if decisive == 0 else 0.5 * (1.0 + math.erf((wins - losses) / math.sqrt(2.0 * decisive)))
    return Estimate(games=n, wins=wins, draws=draws, losses=losses, score=mean, elo=elo_of_score(mean),
                    elo_low=elo_of_score(low), elo_high=elo_of_score(high), los=los, model=model)


def format_elo(value: float) -> str:
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:+.0f}"
