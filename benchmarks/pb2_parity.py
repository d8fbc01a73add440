"""PB2's GP against Ray Tune's (``ray.tune.schedulers.pb2`` / ``pb2_utils``, on scikit-learn).

Not part of the test suite: Ray and scikit-learn are not test dependencies. Run it
with a Python that has Ray, scikit-learn and scipy and imports popflow from this
checkout (an editable install of the ``bench`` extra plus ``scikit-learn``)::

    /tmp/bv/bin/python benchmarks/pb2_parity.py          # or .venv/bin/python with the bench extra

On one fixed table of PB2 data rows (8 trials, two hyperparameters, exploit rows
as PB2 logs them) it compares, printing the largest absolute difference of each:

1. the observations: Ray's ``_explore`` (its ``_select_config`` stubbed to catch
   its arguments) against :func:`reward_changes` (inputs, ``y``, the source's point);
2. the kernel and its gradient (``TV_SquaredExp``) against :func:`tv_squared_exp`;
3. the window (``select_length``) and the scaling (``normalize``/``standardize``);
4. the fitted kernel hyperparameters and log marginal likelihood (scikit-learn's
   ``GaussianProcessRegressor`` against :func:`fit_gp`);
5. with the same hyperparameters (scikit-learn's): the posterior mean and variance
   at 500 points, for the GP and for the batch GP holding pending configs;
6. UCB at those points and the chosen config (``_select_config`` against
   :func:`select_config`, with the same 10 random restarts).

The target for 5 is 1e-6; the script exits 1 if it is missed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

try:
    import pandas as pd
    from ray.tune.schedulers import pb2 as ray_pb2
    from ray.tune.schedulers import pb2_utils as ray_utils
    from sklearn.gaussian_process import GaussianProcessRegressor
except ImportError as exc:  # pragma: no cover - a usage message
    sys.exit(f"needs Ray Tune, scikit-learn and pandas ({exc}); see the module docstring")

try:
    from popflow.schedulers import pb2_gp as ours
except ImportError:  # pragma: no cover
    sys.exit(
        f"cannot import popflow: install this checkout ({Path(__file__).resolve().parents[1]}) "
        "into this Python with `pip install -e .`"
    )

BOUNDS = {"lr": [1e-4, 1e-1], "momentum": [0.8, 0.99]}
TARGET = 1e-6


def make_table(seed: int = 0) -> tuple[list[str], np.ndarray]:
    """PB2's rows ``[trial, t, lr, momentum, r]``: 8 trials, 36 perturbation points
    each at distinct float times; every 5th point a trial clones another and logs
    PB2's exploit row (its new h at the source's time and reward)."""
    rng = np.random.default_rng(seed)
    n_trials, steps = 8, 36
    lows, highs = (
        np.array([v[0] for v in BOUNDS.values()]),
        np.array([v[1] for v in BOUNDS.values()]),
    )
    h = rng.uniform(lows, highs, size=(n_trials, 2))
    reward = np.zeros(n_trials)
    ids, rows = [], []
    for step in range(1, steps + 1):
        for i in range(n_trials):
            t = 10.0 * step + 0.37 * i + rng.uniform(0, 0.1)
            lr, mom = h[i]
            reward[i] += 5 * lr / 0.1 - 3 * (mom - 0.9) ** 2 + rng.normal(0, 0.05)
            ids.append(f"t{i}")
            rows.append([t, lr, mom, reward[i]])
        if step % 5 == 0:
            for target in range(0, n_trials, 3):
                source = (target + 1 + step) % n_trials
                h[target] = rng.uniform(lows, highs)
                reward[target] = reward[source]
                src_row = max(
                    (r for tid, r in zip(ids, rows, strict=True) if tid == f"t{source}"),
                    key=lambda r: r[0],
                )
                ids.append(f"t{target}")
                rows.append([src_row[0], *h[target], reward[source]])
    return ids, np.array(rows)


def ray_observations(ids: list[str], rows: np.ndarray, source: str) -> dict[str, np.ndarray]:
    """What Ray's ``_explore`` hands ``_select_config``, caught by a stub."""
    data = pd.DataFrame(
        [[tid, *row[:3], row[3]] for tid, row in zip(ids, rows.tolist(), strict=True)],
        columns=["Trial", "Time", "lr", "momentum", "Reward"],
    )
    caught: dict[str, np.ndarray] = {}

    def stub(Xraw, yraw, current, newpoint, bounds, num_f):
        caught.update(x=np.asarray(Xraw, dtype=float), y=np.asarray(yraw, dtype=float))
        caught["newpoint"] = np.asarray(newpoint, dtype=float)
        return np.array([0.05, 0.9])

    real = ray_pb2._select_config
    ray_pb2._select_config = stub
    try:
        ray_pb2._explore(data, BOUNDS, None, source, "t0", {"lr": 0.01, "momentum": 0.9})
    finally:
        ray_pb2._select_config = real
    return caught


def sk_gp(x: np.ndarray, y: np.ndarray) -> GaussianProcessRegressor:
    kernel = ray_utils.TV_SquaredExp(variance=1.0, lengthscale=1.0, epsilon=0.1)
    return GaussianProcessRegressor(kernel=kernel, optimizer="fmin_l_bfgs_b", alpha=1e-10).fit(
        x, y.reshape(-1, 1)
    )


def sk_posterior(m: GaussianProcessRegressor, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = m.predict(xq, return_std=True)
    return np.ravel(mean), np.ravel(std) ** 2


def main() -> int:
    diffs: dict[str, float] = {}
    ids, rows = make_table()
    source = "t5"

    # 1. observations
    caught = ray_observations(ids, rows, source)
    obs = ours.reward_changes(ids, rows, gp_columns=[0, 1])
    mine = [i for i, tid in enumerate(obs.trial_ids) if tid == source]
    diffs["observations: inputs [t, r_before, h]"] = float(np.max(np.abs(obs.x - caught["x"])))
    diffs["observations: y = dr/dt"] = float(np.max(np.abs(obs.y - caught["y"])))
    diffs["observations: source point [t, r_before]"] = float(
        np.max(np.abs(obs.x[mine[-1], :2] - caught["newpoint"]))
    )
    x_raw, y_raw, newpoint = caught["x"], caught["y"], caught["newpoint"]
    print(f"table: {len(rows)} rows -> {len(x_raw)} observations (Ray) / {len(obs.x)} (popflow)")

    # 2. kernel and gradient, on the scaled inputs
    lows = np.array([b[0] for b in BOUNDS.values()])
    highs = np.array([b[1] for b in BOUNDS.values()])
    theta = np.log([0.7, 0.3, 0.05])
    kernel = ray_utils.TV_SquaredExp(variance=0.7, lengthscale=0.3, epsilon=0.05)
    x_s, _ = ours._scaled(x_raw, y_raw, lows, highs)
    k_ray, dk_ray = kernel(x_s, eval_gradient=True)
    k_ours, dk_ours = ours.tv_squared_exp(x_s, x_s, theta, gradient=True)
    diffs["kernel K"] = float(np.max(np.abs(k_ours - k_ray)))
    diffs["kernel dK/dtheta"] = float(np.max(np.abs(dk_ours - dk_ray)))

    # 3. window and scaling
    ray_len = ray_utils.select_length(x_raw, y_raw, BOUNDS, 2)
    our_len = ours.select_length(x_raw, y_raw, lows, highs)
    print(f"select_length: Ray {ray_len}, popflow {our_len} (of {len(x_raw)})")
    x_w, y_w = x_raw[-ray_len:], y_raw[-ray_len:]
    base = np.array(list(BOUNDS.values())).T
    old = x_w[:, :2]
    limits = np.concatenate(
        (np.concatenate((old.max(axis=0), old.min(axis=0))).reshape(2, 2), base), axis=1
    )
    x_ray = ray_utils.normalize(x_w, limits)
    y_ray = ray_utils.standardize(y_w)
    x_ours, y_ours = ours._scaled(x_w, y_w, lows, highs)
    diffs["scaled inputs"] = float(np.max(np.abs(x_ours - x_ray)))
    diffs["standardized y"] = float(np.max(np.abs(y_ours - y_ray)))
    fixed = ours.normalize(newpoint, x_w[:, :2])

    # 4. fitted hyperparameters
    m = sk_gp(x_ray, y_ray)
    gp = ours.fit_gp(x_ours, y_ours)
    print(f"theta = log(variance, lengthscale, epsilon): Ray {m.kernel_.theta}, popflow {gp.theta}")
    diffs["fitted theta"] = float(np.max(np.abs(gp.theta - m.kernel_.theta)))
    diffs["log marginal likelihood"] = abs(
        gp.log_marginal_likelihood - m.log_marginal_likelihood_value_
    )

    # 5. posterior with the same hyperparameters
    same = ours.fit_gp(x_ours, y_ours, theta=m.kernel_.theta)
    rng = np.random.default_rng(1)
    xq = np.hstack([np.tile(fixed, (500, 1)), rng.uniform(0, 1, (500, 2))])
    xq[:100, :2] = rng.uniform(0, 1, (100, 2))  # some away from the source's point
    mean_ray, var_ray = sk_posterior(m, xq)
    diffs["posterior mean (same theta)"] = float(np.max(np.abs(same.mean(xq) - mean_ray)))
    diffs["posterior variance (same theta)"] = float(np.max(np.abs(same.variance(xq) - var_ray)))
    current = np.array([[0.02, 0.85], [0.07, 0.95], [0.05, 0.9]])
    pending = np.hstack([np.tile(fixed, (3, 1)), ray_utils.normalize(current, base)])
    x1, y1 = np.vstack([x_ray, pending]), np.concatenate([y_ray, np.zeros(3)])
    m1 = sk_gp(x1, y1)
    same1 = ours.fit_gp(x1, y1, theta=m1.kernel_.theta)
    mean1_ray, var1_ray = sk_posterior(m1, xq)
    diffs["batch GP: posterior mean (same theta)"] = float(
        np.max(np.abs(same1.mean(xq) - mean1_ray))
    )
    diffs["batch GP: posterior variance (same theta)"] = float(
        np.max(np.abs(same1.variance(xq) - var1_ray))
    )
    diffs["batch GP: fitted theta"] = float(
        np.max(np.abs(ours.fit_gp(x1, y1).theta - m1.kernel_.theta))
    )

    # 6. UCB and the chosen config, same restarts
    kappa = ours.ucb_kappa(same.n)
    ucb_ours = same.mean(xq) + kappa * same1.variance(xq)
    ucb_ray = np.array([ray_utils.UCB(m, m1, h, fixed) for h in xq[100:200, 2:]])
    diffs["UCB (same theta)"] = float(np.max(np.abs(ucb_ours[100:200] - ucb_ray)))
    for seed in range(3):
        np.random.seed(seed)
        start = time.perf_counter()
        ray_new = ray_pb2._select_config(x_raw, y_raw, current, newpoint, BOUNDS, 2)
        ray_s = time.perf_counter() - start
        start = time.perf_counter()
        # RandomState draws the same 10 restarts that Ray's global np.random.uniform does
        our_new = ours.select_config(
            x_raw, y_raw, current, newpoint, lows, highs, np.random.RandomState(seed)
        )
        our_s = time.perf_counter() - start
        scaled = np.abs((our_new - ray_new) / (highs - lows))
        print(
            f"chosen config, restarts of seed {seed}: Ray {ray_new} ({ray_s:.1f} s), "
            f"popflow {our_new} ({our_s:.1f} s)"
        )
        key = "chosen config / bound width (Ray float32)"
        diffs[key] = max(diffs.get(key, 0.0), float(np.max(scaled)))

    width = max(len(k) for k in diffs)
    print()
    for key, value in diffs.items():
        print(f"{key:<{width}}  max |diff| = {value:.3e}")
    posterior = [v for k, v in diffs.items() if "same theta" in k]
    ok = max(posterior) <= TARGET
    print(f"\nposterior within {TARGET:g}: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
