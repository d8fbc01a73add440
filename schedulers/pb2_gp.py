"""PB2's GP bandit, in numpy and scipy: the time-varying kernel, its fit, the data rows'
reward changes, the window choice and the UCB search (:mod:`popflow.schedulers.pb2`
uses them; Ray's ``pb2_utils.py`` and scikit-learn's GP do the same there)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# scipy is imported where it is used: ``import popflow`` (a script's, each Dask
# worker's) would pay scipy's import for PB2 alone

__all__ = [
    "GPFitError",
    "GaussianProcess",
    "fit_gp",
    "maximise_ucb",
    "normalize",
    "reward_changes",
    "select_config",
    "select_length",
    "standardize",
    "tv_squared_exp",
]

#: The TV_SquaredExp hyperparameters θ = log(σ², λ, ε): Ray's start and bounds.
THETA0 = np.log([1.0, 1.0, 0.1])
THETA_BOUNDS = np.log([[1e-5, 1e5], [1e-5, 1e5], [1e-5, 0.5]])
#: Jitter on the kernel's diagonal (scikit-learn's default ``alpha``, as Ray uses).
JITTER = 1e-10
#: Ray's data limits: the last 1,000 observations; window search from 200 in steps of 10.
MAX_ROWS, MIN_WINDOW, WINDOW_STEP = 1000, 200, 10
#: UCB maximisation: random restarts and L-BFGS-B's budget (Ray's optimize_acq).
RESTARTS, ACQ_MAXITER = 10, 200
_EPS = 1e-8  # Ray's guard in normalize / standardize


class GPFitError(ValueError):
    """The GP could not be fitted (non-finite data); PB2 falls back to PBT's explore."""


# -- the kernel and the GP -------------------------------------------------------
def tv_squared_exp(
    x1: np.ndarray, x2: np.ndarray, theta: np.ndarray, gradient: bool = False
) -> Any:
    """``σ² exp(-‖x̃1 - x̃2‖² / λ) (1 - ε)^(|t1 - t2| / 2)``, time in column 0.

    ``theta = log(σ², λ, ε)``; ε is clipped to [1e-5, 0.5] as in Ray. With
    ``gradient`` also returns ``dK/dθ`` (shape ``(n1, n2, 3)``).
    """
    from scipy.spatial.distance import cdist

    variance, lengthscale, epsilon = np.exp(np.asarray(theta, dtype=float))
    epsilon = min(max(epsilon, 1e-5), 0.5)
    half_dt = 0.5 * cdist(x1[:, :1], x2[:, :1], "cityblock")
    sq = cdist(x1[:, 1:], x2[:, 1:], "sqeuclidean")
    k = variance * np.exp(-sq / lengthscale) * (1.0 - epsilon) ** half_dt
    if not gradient:
        return k
    dk = np.dstack([k, k * sq / lengthscale, -k * half_dt * epsilon / (1.0 - epsilon)])
    return k, dk


def log_marginal_likelihood(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[float, np.ndarray]:
    """``log p(y | x, θ)`` and its gradient in θ; ``(-inf, 0)`` where K is not
    positive definite (as scikit-learn's GP, so that L-BFGS-B backs off)."""
    from scipy.linalg import cho_solve, cholesky

    k, dk = tv_squared_exp(x, x, theta, gradient=True)
    k[np.diag_indices_from(k)] += JITTER
    try:
        chol = cholesky(k, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return -np.inf, np.zeros_like(theta)
    weights = cho_solve((chol, True), y, check_finite=False)
    lml = -0.5 * y @ weights - np.log(np.diag(chol)).sum() - 0.5 * len(y) * np.log(2 * np.pi)
    k_inv = cho_solve((chol, True), np.eye(len(y)), check_finite=False)
    inner = np.outer(weights, weights) - k_inv
    return float(lml), 0.5 * np.einsum("ij,ijk->k", inner, dk)


@dataclass(frozen=True)
class GaussianProcess:
    """A fitted zero-mean GP: training inputs, θ, Cholesky factor and weights ``K⁻¹y``."""

    x: np.ndarray
    theta: np.ndarray
    chol: np.ndarray
    weights: np.ndarray
    log_marginal_likelihood: float

    @property
    def n(self) -> int:
        return len(self.x)

    def mean(self, xq: np.ndarray) -> np.ndarray:
        return tv_squared_exp(xq, self.x, self.theta) @ self.weights

    def variance(self, xq: np.ndarray) -> np.ndarray:
        from scipy.linalg import solve_triangular

        k_trans = tv_squared_exp(xq, self.x, self.theta)
        v = solve_triangular(self.chol, k_trans.T, lower=True, check_finite=False)
        return np.maximum(np.exp(self.theta[0]) - np.einsum("ij,ij->j", v, v), 0.0)


def fit_gp(x: np.ndarray, y: np.ndarray, theta: np.ndarray | None = None) -> GaussianProcess:
    """Fit θ by L-BFGS-B on the log marginal likelihood from Ray's start (or use ``theta``).

    Raises :class:`GPFitError` for non-finite data, ``LinAlgError`` when K is singular.
    """
    from scipy.linalg import cho_solve, cholesky
    from scipy.optimize import minimize

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise GPFitError("the GP data holds NaN or infinite values")
    lml = None
    if theta is None:

        def objective(t: np.ndarray) -> tuple[float, np.ndarray]:
            value, grad = log_marginal_likelihood(t, x, y)
            return -value, -grad

        res = minimize(objective, THETA0, method="L-BFGS-B", jac=True, bounds=THETA_BOUNDS)
        theta, lml = res.x, -float(res.fun)
    theta = np.asarray(theta, dtype=float)
    k = tv_squared_exp(x, x, theta)
    k[np.diag_indices_from(k)] += JITTER
    chol = cholesky(k, lower=True, check_finite=False)  # LinAlgError: not positive definite
    weights = cho_solve((chol, True), y, check_finite=False)
    if lml is None:
        lml = log_marginal_likelihood(theta, x, y)[0]
    return GaussianProcess(x, theta, chol, weights, lml)


# -- data preparation ------------------------------------------------------------
def normalize(data: np.ndarray, wrt: np.ndarray) -> np.ndarray:
    """Min-max scale ``data`` by the column ranges of ``wrt`` (Ray's ``normalize``, +1e-8)."""
    low, high = np.min(wrt, axis=0), np.max(wrt, axis=0)
    return (data - low) / (high - low + _EPS)


def standardize(y: np.ndarray) -> np.ndarray:
    """z-score, clipped to [-2, 2] (Ray's ``standardize``)."""
    return np.clip((y - np.mean(y)) / (np.std(y) + _EPS), -2, 2)


@dataclass(frozen=True)
class RewardChanges:
    """Observations from consecutive rows of one trial with unchanged hyperparameters.

    ``x`` holds ``[t, r_before, h...]``, ``y`` the reward change per unit time,
    ``reward`` the reward at ``t``, ``trial_ids`` whose rows they are; in time order.
    """

    trial_ids: list[str]
    x: np.ndarray
    y: np.ndarray
    reward: np.ndarray


def reward_changes(
    trial_ids: Sequence[str],
    rows: np.ndarray,
    gp_columns: Sequence[int],
    max_rows: int = MAX_ROWS,
) -> RewardChanges:
    """The GP's observations from the raw rows ``[t, h..., r]`` (Ray's ``_explore``).

    Rows are taken in time order (stable: ties keep logging order); a row's
    predecessor is the previous row of the same trial with identical ``h``
    (every hyperparameter, categorical included). Pairs with ``Δt > 0`` and a
    finite ``Δr / Δt`` (NaN and infinite rewards drop out) are kept, the last
    ``max_rows``.
    ``gp_columns`` picks the ``h`` columns the GP sees (0-based within ``h``).
    """
    table = np.asarray(rows, dtype=float).reshape(len(trial_ids), -1)
    order = np.argsort(table[:, 0], kind="stable").tolist()
    plain = table.tolist()  # Python floats: inf - inf is NaN without a warning
    previous: dict[tuple[Any, ...], int] = {}
    kept: list[tuple[int, float, float]] = []  # (row, r_before, y)
    for i in order:
        key = (trial_ids[i], *plain[i][1:-1])
        j = previous.get(key)
        previous[key] = i
        if j is None:
            continue
        dt = plain[i][0] - plain[j][0]
        dr = plain[i][-1] - plain[j][-1]
        # a non-finite reward (NaN, a diverged run's inf) tells the GP nothing: it drops
        # out, so one diverged trial does not stop PB2 fitting for the rest of the run
        if dt > 0 and math.isfinite(dr) and math.isfinite(plain[i][-1]):
            kept.append((i, plain[i][-1] - dr, dr / dt))  # r_before as Ray: r - Δr
    kept = kept[-max_rows:]
    h = [1 + c for c in gp_columns]
    x = np.array([[plain[i][0], r_before, *(plain[i][c] for c in h)] for i, r_before, _ in kept])
    x = x.reshape(len(kept), 2 + len(h))
    y = np.array([dy for _, _, dy in kept])
    reward = np.array([plain[i][-1] for i, _, _ in kept])
    return RewardChanges([trial_ids[i] for i, _, _ in kept], x, y, reward)


def _scaled(x_raw: np.ndarray, y_raw: np.ndarray, lows: np.ndarray, highs: np.ndarray):
    """Inputs scaled (t, r_before by the data, h by the bounds) and y standardized."""
    fixed_cols = x_raw[:, :2]
    limits = np.vstack(
        [
            np.concatenate([fixed_cols.max(axis=0), lows]),
            np.concatenate([fixed_cols.min(axis=0), highs]),
        ]
    )
    return normalize(x_raw, limits), standardize(y_raw)


def select_length(x_raw: np.ndarray, y_raw: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> int:
    """How many of the latest observations to fit (Ray's ``select_length``).

    All of them below 200; else the window among 200, 210, ... (at most all
    rows) whose fitted GP has the highest log marginal likelihood.
    """
    n = len(x_raw)
    if n < MIN_WINDOW:
        return n
    scores = []
    for length in range(MIN_WINDOW, n + 1, WINDOW_STEP):
        x, y = _scaled(x_raw[-length:], y_raw[-length:], lows, highs)
        scores.append(fit_gp(x, y).log_marginal_likelihood)
    return MIN_WINDOW + WINDOW_STEP * int(np.argmax(scores))


def ucb_kappa(n: int) -> float:
    """``√β`` with ``β = 0.2 + max(0, ln(0.4 n))`` (Ray's UCB constants c1 = 0.2, c2 = 0.4)."""
    return math.sqrt(0.2 + max(0.0, math.log(0.4 * n)))


def maximise_ucb(
    mean_gp: GaussianProcess,
    var_gp: GaussianProcess,
    fixed: np.ndarray,
    starts: np.ndarray,
) -> np.ndarray:
    """The ``h`` in [0, 1]^d maximising ``μ(fixed, h) + √β v(fixed, h)``.

    One L-BFGS-B run (numeric gradient, at most 200 iterations) from each row
    of ``starts``; the best end point wins (the first on ties), clipped to [0, 1].
    """
    from scipy.optimize import minimize

    kappa = ucb_kappa(mean_gp.n)
    fixed = np.asarray(fixed, dtype=float)

    def ucb(h: np.ndarray) -> float:
        xq = np.concatenate([fixed, h])[None, :]
        value = float(mean_gp.mean(xq)[0] + kappa * var_gp.variance(xq)[0])
        return value if math.isfinite(value) else -np.inf

    d = starts.shape[1]
    options = {"maxiter": ACQ_MAXITER, "maxfun": ACQ_MAXITER}
    best, best_value = starts[0], -np.inf
    for x0 in starts:
        res = minimize(
            lambda h: -ucb(h), x0, method="L-BFGS-B", bounds=[(0, 1)] * d, options=options
        )
        value = ucb(res.x)
        if value > best_value:
            best, best_value = res.x, value
    return np.clip(best, 0, 1)


def select_config(
    x_raw: np.ndarray,
    y_raw: np.ndarray,
    current: np.ndarray,
    newpoint: np.ndarray,
    lows: np.ndarray,
    highs: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """The next hyperparameters, in bound units (Ray's ``_select_config``).

    ``current``: hyperparameters already chosen at this time step (``(k, d)``,
    maybe empty); ``newpoint``: the source's ``[t, r_before]``. Draws the 10
    UCB restarts from ``rng``.
    """
    length = select_length(x_raw, y_raw, lows, highs)
    x_raw, y_raw = x_raw[-length:], y_raw[-length:]
    x, y = _scaled(x_raw, y_raw, lows, highs)
    fixed = normalize(np.asarray(newpoint, dtype=float), x_raw[:, :2])
    gp = fit_gp(x, y)
    var_gp = gp
    if len(current):
        bounds = np.vstack([lows, highs])
        pending = np.hstack([np.tile(fixed, (len(current), 1)), normalize(current, bounds)])
        var_gp = fit_gp(np.vstack([x, pending]), np.concatenate([y, np.zeros(len(current))]))
    starts = rng.uniform(0, 1, size=(RESTARTS, len(lows)))
    unit = maximise_ucb(gp, var_gp, fixed, starts)
    return unit * (highs - lows) + lows
