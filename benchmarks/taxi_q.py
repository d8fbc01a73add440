"""Tabular Q-learning on gymnasium's Taxi-v4, scored exactly: a task whose best settings
change during training (explore early, exploit late), with a known optimum.

Taxi's dynamics are deterministic, so its table (``env.unwrapped.P``) gives the next
state, reward and end of every (state, action) pair. Each training iteration runs
``STEPS`` steps of epsilon-greedy Q-learning on that table; the score is the exact
expected return, within Taxi's 200-step limit from its start distribution, of the policy
the agent acts with (epsilon-greedy on its Q table): what it earns while it trains,
computed by dynamic programming rather than sampled, so it has no noise. The optimum of
that return (:func:`optimum`, about 8.0) is computed the same way, so regret is exact.
A high epsilon explores but costs return now; a low one exploits an unfinished table:
the best epsilon and step size change as the table fills, which is where PBT should
help. The discount (``gamma``) is tuned too.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from popflow import tune
from popflow.schedulers import PB2, PopulationBasedTraining

STEPS = 2_000  # Q-learning steps per training iteration
HORIZON = 200  # Taxi-v4's time limit
#: The settings the schedulers tune, with their ranges
BOUNDS = {"alpha": (0.01, 1.0), "epsilon": (0.001, 0.5), "gamma": (0.8, 0.999)}


@functools.cache
def table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Taxi's next state, reward and episode end for each (state, action), and its start
    distribution."""
    import gymnasium

    env = gymnasium.make("Taxi-v4").unwrapped
    n_states, n_actions = env.observation_space.n, env.action_space.n
    nxt = np.zeros((n_states, n_actions), dtype=np.int64)
    reward = np.zeros((n_states, n_actions))
    done = np.zeros((n_states, n_actions), dtype=bool)
    for s in range(n_states):
        for a in range(n_actions):
            ((_, s2, r, d),) = env.P[s][a]  # one outcome each: the dynamics are deterministic
            nxt[s, a], reward[s, a], done[s, a] = s2, r, d
    return nxt, reward, done, np.asarray(env.initial_state_distrib)


def expected_return(policy: np.ndarray) -> float:
    """The exact expected return within ``HORIZON`` steps from Taxi's starts of a policy
    given as action probabilities per state (shape states x actions)."""
    nxt, reward, done, start = table()
    value = np.zeros(len(start))  # the return of the steps still to go
    for _ in range(HORIZON):
        value = (policy * (reward + np.where(done, 0.0, value[nxt]))).sum(axis=1)
    return float(start @ value)


def optimum() -> float:
    """The best expected return within ``HORIZON`` steps (finite-horizon value iteration)."""
    nxt, reward, done, start = table()
    value = np.zeros(len(start))
    for _ in range(HORIZON):
        value = (reward + np.where(done, 0.0, value[nxt])).max(axis=1)
    return float(start @ value)


def epsilon_greedy(q: np.ndarray, epsilon: float) -> np.ndarray:
    """Action probabilities: greedy on ``q`` (ties split evenly), else uniform."""
    best = q == q.max(axis=1, keepdims=True)
    greedy = best / best.sum(axis=1, keepdims=True)
    return (1 - epsilon) * greedy + epsilon / q.shape[1]


class TaxiQ(tune.Trainable):
    """One Q-learning agent; a checkpoint is its Q table and where it is in its episode."""

    def setup(self, config: dict[str, Any]) -> None:
        nxt, _, _, start = table()
        self.rng = np.random.default_rng(config["seed"])
        self.q = np.zeros(nxt.shape)
        self.state = int(self.rng.choice(len(start), p=start))
        self.t = 0

    def step(self) -> dict[str, Any]:
        nxt, reward, done, start = table()
        alpha, epsilon, gamma = (self.config[k] for k in ("alpha", "epsilon", "gamma"))
        q, rng, s, t = self.q, self.rng, self.state, self.t
        explore = rng.random(STEPS) < epsilon
        randoms = rng.integers(q.shape[1], size=STEPS)
        ties = rng.random((STEPS, q.shape[1])) * 1e-9  # greedy ties broken at random
        for i in range(STEPS):
            row = q[s]
            a = randoms[i] if explore[i] else int((row + ties[i]).argmax())
            s2, d = nxt[s, a], done[s, a]
            row[a] += alpha * (reward[s, a] + (0.0 if d else gamma * q[s2].max()) - row[a])
            t += 1
            if d or t >= HORIZON:
                s, t = int(rng.choice(len(start), p=start)), 0
            else:
                s = s2
        self.state, self.t = s, t
        acting = expected_return(epsilon_greedy(q, epsilon))
        return {
            "mean_return": acting,
            "greedy_return": expected_return(epsilon_greedy(q, 0.0)),
            "steps_total": (self.iteration + 1) * STEPS,
            "wall": time.time(),  # orders results across trials for best-so-far curves
        }

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"q": self.q.tolist(), "state": self.state, "t": self.t,
                "rng": self.rng.bit_generator.state}  # fmt: skip

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.q = np.asarray(checkpoint["q"])
        self.state, self.t = checkpoint["state"], checkpoint["t"]
        self.rng.bit_generator.state = checkpoint["rng"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        return True  # the settings are read from self.config at each step


def param_space() -> dict[str, Any]:
    return {
        "alpha": tune.loguniform(*BOUNDS["alpha"]),
        "epsilon": tune.loguniform(*BOUNDS["epsilon"]),
        "gamma": tune.uniform(*BOUNDS["gamma"]),
        "seed": tune.randint(0, 2**31 - 1),
    }


def clip(config: dict[str, Any]) -> dict[str, Any]:
    """PBT's x0.8/x1.2 perturbations clamped back into ``BOUNDS`` (a discount below 1)."""
    for key, (low, high) in BOUNDS.items():
        config[key] = min(max(config[key], low), high)
    return config


def make_scheduler(name: str, interval: int, synch: bool = True) -> PopulationBasedTraining | PB2:
    if name == "pb2":
        bounds = {k: list(v) for k, v in BOUNDS.items()}
        return PB2(time_attr="training_iteration", perturbation_interval=interval,
                   hyperparam_bounds=bounds, synch=synch)  # fmt: skip
    space = param_space()
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=interval,
        synch=synch,
        custom_explore_fn=clip,
        hyperparam_mutations={k: space[k] for k in BOUNDS},
    )
