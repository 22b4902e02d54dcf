"""Ratings of several players from all their games: the maximum-likelihood Elo fit of a round robin.

The model is Bradley-Terry on the Elo scale, as BayesElo and Ordo fit it: player i scores against j with
expectation p_ij = 1 / (1 + 10^((r_j - r_i) / 400)), a draw counts as half a win and half a loss, and the
ratings are those that make all the games most likely. For two players this is exactly the match's
`elo_of_score`. The first player is the anchor (rating 0); the others are fitted by Newton's method on the
log-likelihood, which is concave, so it converges from 0 in a few steps. The 95% intervals come from the
curvature at the maximum (the observed information, the inverse of minus the Hessian): each is the rating
+- 1.96 standard errors of its difference from the anchor. They treat games as independent; the two games of
an opening are not quite (see elo.py), so they are a little narrow when openings favour one side.

The maximum is finite only when no group of players took every point against the rest (in graph terms: the
"scored against" graph is strongly connected). When it is not (a 100% score, say), each pair that played
gets one virtual draw, as BayesElo's prior does (it adds two by default), and the report says so.

numpy does this: scipy is not a dependency of tideborn, and a Newton step on a few dozen players is one small
linear solve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tideborn.match.elo import Z95

SCALE = math.log(10.0) / 400.0
"""From Elo to the logistic's natural units."""
VIRTUAL_DRAWS = 1
"""Draws added to each pair that played when the plain maximum is infinite."""
MAX_ITERATIONS = 100
TOLERANCE_ELO = 1e-7


@dataclass(frozen=True)
class Rating:
    player: int
    elo: float
    elo_low: float
    elo_high: float
    games: int
    points: float

    @property
    def score(self) -> float:
        return self.points / self.games if self.games else 0.0


@dataclass(frozen=True)
class RatingTable:
    ratings: tuple[Rating, ...]
    """In player order (the anchor first)."""
    virtual_draws: int
    """Draws added per pair that played (0: the plain maximum-likelihood fit)."""
    iterations: int


def fit_ratings(points: np.ndarray, games: np.ndarray, anchor: int = 0) -> RatingTable:
    """Ratings from `points[i, j]` (what i scored against j: wins + draws / 2) and `games[i, j]` (games
    between them, symmetric). `ValueError` if some player is not linked by games to the anchor."""
    points = np.asarray(points, dtype=np.float64)
    games = np.asarray(games, dtype=np.float64)
    n = len(games)
    if not _connected(games > 0):
        raise ValueError("some players share no games, directly or through others, with the rest")
    observed_points, observed_games = points, games
    virtual = 0
    if not _connected(points > 0):  # some group never scored against the rest: no finite maximum
        virtual = VIRTUAL_DRAWS
        played = games > 0
        points = points + 0.5 * virtual * played
        games = games + virtual * played
    free = [i for i in range(n) if i != anchor]
    r = np.zeros(n)
    iterations = 0
    for iterations in range(1, MAX_ITERATIONS + 1):  # noqa: B007 - reported
        gradient, hessian = _derivatives(r, points, games)
        step = np.linalg.solve(-hessian[np.ix_(free, free)], gradient[free]) if free else np.zeros(0)
        # Halve a step that would lower the likelihood (far from the maximum a full Newton step can overshoot).
        base = _log_likelihood(r, points, games)
        while True:
            trial = r.copy()
            trial[free] += step
            if _log_likelihood(trial, points, games) >= base - 1e-12 or np.abs(step).max(initial=0) < TOLERANCE_ELO:
                break
            step /= 2
        r = trial
        if np.abs(step).max(initial=0.0) < TOLERANCE_ELO:
            break
    _, hessian = _derivatives(r, points, games)
    errors = np.zeros(n)
    if free:
        covariance = np.linalg.inv(-hessian[np.ix_(free, free)])
        errors[free] = np.sqrt(np.clip(np.diag(covariance), 0.0, None))
    ratings = tuple(Rating(i, float(r[i]) + 0.0, float(r[i] - Z95 * errors[i]) + 0.0,  # + 0.0: no -0
                           float(r[i] + Z95 * errors[i]) + 0.0, int(round(observed_games[i].sum())),
                           float(observed_points[i].sum())) for i in range(n))
    return RatingTable(ratings, virtual, iterations)


def _expected(r: np.ndarray) -> np.ndarray:
    """p[i, j]: i's expected score against j."""
    return 1.0 / (1.0 + np.exp(-SCALE * (r[:, None] - r[None, :])))


def _log_likelihood(r: np.ndarray, points: np.ndarray, games: np.ndarray) -> float:
    p = _expected(r)
    mask = games > 0
    return float((points[mask] * np.log(p[mask])).sum())  # points[i,j] + points[j,i] = games[i,j]


def _derivatives(r: np.ndarray, points: np.ndarray, games: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of the log-likelihood in Elo units."""
    p = _expected(r)
    gradient = SCALE * (points - games * p).sum(axis=1)
    weight = SCALE * SCALE * games * p * p.T
    np.fill_diagonal(weight, 0.0)
    hessian = weight - np.diag(weight.sum(axis=1))
    return gradient, hessian


def _connected(edges: np.ndarray) -> bool:
    """Whether every player reaches every other along `edges` (i -> j where edges[i, j]): strongly connected."""
    n = len(edges)

    def reach(matrix: np.ndarray) -> int:
        seen, todo = {0}, [0]
        while todo:
            i = todo.pop()
            for j in np.flatnonzero(matrix[i]):
                if int(j) not in seen:
                    seen.add(int(j))
                    todo.append(int(j))
        return len(seen)

    return n <= 1 or (reach(edges) == n and reach(edges.T) == n)
