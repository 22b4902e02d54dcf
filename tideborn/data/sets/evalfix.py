"""Fitting the eval-to-win-rate scale to each teacher file (`data.eval_scale_fit = "per_file"`): dlshogi's evalfix.

dlshogi (`Hcpe3DataLoader.load_files(use_evalfix=True)`, `utils/fix_hcpe_eval.py`) fits `a` in
`sigmoid(eval / a)` to the game result of each position by least squares (scipy's `curve_fit`, from
a = 300), positions of every result kept (a draw is 0.5) and mate scores (|eval| >= 30000) left out; the file
is then read with `sigmoid(eval / a)` as its eval target. This is the same fit, in numpy (Levenberg-Marquardt
on `k = 1 / a`), over an evenly spaced sample of at most `FIT_SAMPLE` records per file.

Where dlshogi keeps the default for a file whose evals are all 0, this keeps `data.eval_scale` for any file
it cannot fit (no usable positions, no decisive game, all evals 0, a fit that does not settle on a positive
scale) and says why, so that the trainer can warn with the file's name.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass

import numpy as np

from tideborn.data.decode.features import evals_for_side_to_move, results_for_side_to_move
from tideborn.data.sets.sources import as_source
from tideborn.errors import UserError

if typing.TYPE_CHECKING:
    from tideborn.data.formats.records import RecordSet
    from tideborn.data.sets.sources import TeacherSource

FIT_SAMPLE = 100_000
"""Records per file the fit reads (evenly spaced through the file): plenty for one parameter."""
MATE_EVAL = 30_000
"""|eval| from this on is a mate score, left out of the fit (as dlshogi does)."""
MIN_DECISIVE = 100
"""Fewer decisive (won or lost) positions than this in the sample: too few to fit."""
INITIAL_SCALE = 300.0
"""dlshogi's starting point for `curve_fit`."""
SCALE_RANGE = (1.0, 1e6)
"""A fitted scale outside this is no fit (evals that do not predict the result, or nearly all mates)."""


@dataclass(frozen=True)
class ScaleFit:
    path: str
    scale: float
    """The scale the file's records are read with: fitted, or `data.eval_scale` when `problem` says why not."""
    positions: int
    """Positions the fit used."""
    problem: str | None = None


def fit_scale(evals: np.ndarray, results: np.ndarray) -> tuple[float | None, str | None]:
    """(a, None) minimising `sum (sigmoid(eval / a) - result)^2` over positions with |eval| < MATE_EVAL and a
    known result, or (None, why not)."""
    evals = np.asarray(evals, dtype=np.float64)
    results = np.asarray(results, dtype=np.float64)
    usable = (np.abs(evals) < MATE_EVAL) & np.isfinite(results)
    evals, results = evals[usable], results[usable]
    decisive = int(np.count_nonzero(results != 0.5))
    if decisive < MIN_DECISIVE:
        return None, f"{decisive} decisive position(s) with a non-mate eval (at least {MIN_DECISIVE} needed)"
    if not np.any(evals):
        return None, "every eval is 0"
    k, damping = 1.0 / INITIAL_SCALE, 1e-3

    def squared_error(k: float) -> float:
        return float(np.sum((_sigmoid(k * evals) - results) ** 2))

    error = squared_error(k)
    for _ in range(200):
        f = _sigmoid(k * evals)
        jacobian = evals * f * (1.0 - f)
        gradient = float(np.dot(jacobian, f - results))
        curvature = float(np.dot(jacobian, jacobian))
        if curvature <= 0:
            break
        step = -gradient / (curvature * (1.0 + damping))
        trial = k + step
        trial_error = squared_error(trial)
        if trial_error <= error:
            k, error, damping = trial, trial_error, damping / 10
            if abs(step) <= 1e-10 * max(abs(k), 1e-12):
                break
        else:
            damping *= 10
            if damping > 1e12:
                break
    if not math.isfinite(k) or k <= 0 or not SCALE_RANGE[0] <= 1.0 / k <= SCALE_RANGE[1]:
        return None, "the fit found no positive scale (evals that do not predict the results?)"
    return 1.0 / k, None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|


def sample_indices(count: int, limit: int = FIT_SAMPLE) -> np.ndarray:
    if count <= limit:
        return np.arange(count, dtype=np.int64)
    return np.unique(np.linspace(0, count - 1, limit).round().astype(np.int64))


def fit_files(source: TeacherSource | RecordSet, fallback: float) -> list[ScaleFit]:
    """One fit per file of `source` (hcpe, psv or hcpe3; each file's own sample), in file order."""
    fits = []
    for part in as_source(source).parts:
        if not hasattr(part, "file_samples"):  # refused by the settings check (data.use_average)
            raise UserError("data.eval_scale_fit: per-file scales cannot be fitted on averaged positions")
        for path, sample, kind in part.file_samples(sample_indices):
            results = results_for_side_to_move(sample, kind)
            evals = evals_for_side_to_move(sample, kind)
            scale, problem = fit_scale(evals, results)
            used = int(np.count_nonzero((np.abs(evals) < MATE_EVAL) & np.isfinite(results)))
            fits.append(ScaleFit(str(path), fallback if scale is None else scale, used, problem))
    return fits


def scales_by_file(fits: list[ScaleFit]) -> dict[str, float] | None:
    """What `BatchDecoder(file_scales=...)` takes: each file's scale by path; None without fits."""
    return {fit.path: fit.scale for fit in fits} if fits else None


def fit_warning(fit: ScaleFit, what: str) -> str:
    return (f"{what} {fit.path}: eval scale not fitted ({fit.problem}); its records use data.eval_scale = "
            f"{fit.scale:g}")


def scales_field(fits: list[ScaleFit]) -> dict[str, float]:
    """What `run_started.eval_scales` holds: each file's scale."""
    return {fit.path: fit.scale for fit in fits}
