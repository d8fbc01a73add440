"""A real model: an MLP trained with SGD on scikit-learn's bundled digits (no download).

PBT mutates the learning rate, momentum and weight decay while the
population trains; each ``step`` is one epoch of minibatch SGD (batch 32,
one hidden ReLU layer of 64 units, softmax), scored on a held-out
validation split: ``mean_accuracy`` and ``val_loss`` (log loss). Checkpoints
are ``.npz`` files in the checkpoint folder (weights, momentum buffers),
not pickled objects.

    python examples/digits_mlp.py --smoke-test
    python examples/digits_mlp.py --scheduler pbt --num-samples 8 --epochs 40

Needs the ``examples`` extra (``pip install -e ".[examples]"``: scikit-learn,
for the data only).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import random
from typing import Any

import numpy as np

from popflow import CheckpointConfig, Trainable, run
from popflow.infra.storage.options_cli import add_storage_arguments, storage_options_from_args
from popflow.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    PopulationBasedTraining,
    TrialScheduler,
    loguniform,
    uniform,
)

logger = logging.getLogger(__name__)

#: The search space, and the ranges PBT resamples from.
LR = (1e-3, 1.0)
MOMENTUM = (0.0, 0.99)
WEIGHT_DECAY = (1e-6, 1e-2)
HIDDEN = 64
BATCH = 32


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits, standardised: 1,437 to train, 360 to validate
    (the same split in every process)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order].astype(np.float64), y[order]
    n_val = 360
    mean, std = x[n_val:].mean(axis=0), x[n_val:].std(axis=0) + 1e-8
    x = (x - mean) / std
    return x[n_val:], y[n_val:], x[:n_val], y[:n_val]


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class DigitsMLP(Trainable):
    """One member: the MLP's weights and SGD's momentum buffers; ``lr``, ``momentum``
    and ``weight_decay`` come from the config (and change in place on exploit)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.x, self.y, self.x_val, self.y_val = digits()
        # popflow seeds numpy per segment: each trial starts from its own, repeatable weights
        rng = np.random.default_rng(np.random.randint(2**31))
        d, k = self.x.shape[1], 10
        self.params = {
            "w1": rng.normal(0, np.sqrt(2 / d), (d, HIDDEN)),
            "b1": np.zeros(HIDDEN),
            "w2": rng.normal(0, np.sqrt(1 / HIDDEN), (HIDDEN, k)),
            "b2": np.zeros(k),
        }
        self.velocity = {name: np.zeros_like(p) for name, p in self.params.items()}
        self.rng = rng
        self._apply(config)

    def _apply(self, config: dict[str, Any]) -> None:
        self.lr = float(config["lr"])
        # PBT's "* 1.2" can push momentum past 1 (as Ray's, it does not clip): SGD would
        # diverge, so the model caps it
        self.momentum = min(float(config["momentum"]), MOMENTUM[1])
        self.weight_decay = float(config["weight_decay"])

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = self.params
        hidden = np.maximum(0.0, x @ p["w1"] + p["b1"])
        return hidden, softmax(hidden @ p["w2"] + p["b2"])

    def _sgd_step(self, x: np.ndarray, y: np.ndarray) -> float:
        p = self.params
        hidden, probs = self._forward(x)
        n = len(y)
        loss = -np.log(probs[np.arange(n), y] + 1e-12).mean()
        grad_logits = probs
        grad_logits[np.arange(n), y] -= 1.0
        grad_logits /= n
        grad_hidden = (grad_logits @ p["w2"].T) * (hidden > 0)
        grads = {
            "w2": hidden.T @ grad_logits + self.weight_decay * p["w2"],
            "b2": grad_logits.sum(axis=0),
            "w1": x.T @ grad_hidden + self.weight_decay * p["w1"],
            "b1": grad_hidden.sum(axis=0),
        }
        for name, g in grads.items():
            v = self.velocity[name]
            v *= self.momentum
            v -= self.lr * g
            p[name] += v
        return float(loss)

    def step(self) -> dict[str, Any]:
        order = self.rng.permutation(len(self.y))
        losses = [
            self._sgd_step(self.x[idx], self.y[idx])
            for idx in np.array_split(order, max(1, len(order) // BATCH))
        ]
        _, probs = self._forward(self.x_val)
        n = len(self.y_val)
        val_loss = float(-np.log(probs[np.arange(n), self.y_val] + 1e-12).mean())
        if not np.isfinite(val_loss):  # diverged (lr too high): worst possible, not NaN
            val_loss = float(np.log(10.0)) * 10
        return {
            "mean_accuracy": float((probs.argmax(axis=1) == self.y_val).mean()),
            "val_loss": val_loss,
            "train_loss": float(np.mean(losses)),
        }

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        np.savez(
            os.path.join(checkpoint_dir, "model.npz"),
            **self.params,
            **{f"v_{name}": v for name, v in self.velocity.items()},
            rng=np.array(json.dumps(self.rng.bit_generator.state)),  # the shuffling stream
        )

    def load_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        with np.load(os.path.join(checkpoint_dir, "model.npz")) as data:
            self.params = {name: data[name].copy() for name in ("w1", "b1", "w2", "b2")}
            self.velocity = {name: data[f"v_{name}"].copy() for name in self.params}
            self.rng.bit_generator.state = json.loads(str(data["rng"]))

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._apply(new_config)
        self.config = dict(new_config)
        return True


def param_space() -> dict[str, Any]:
    return {
        "lr": loguniform(*LR),
        "momentum": uniform(*MOMENTUM),
        "weight_decay": loguniform(*WEIGHT_DECAY),
    }


def make_scheduler(name: str, epochs: int, interval: int) -> TrialScheduler:
    """``pbt``, ``pb2``, ``asha`` or ``random`` (FIFO: random search)."""
    if name == "pbt":
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=interval,
            hyperparam_mutations={
                "lr": lambda: 10 ** random.uniform(math.log10(LR[0]), math.log10(LR[1])),
                "momentum": lambda: random.uniform(*MOMENTUM),
                "weight_decay": lambda: (
                    10 ** random.uniform(math.log10(WEIGHT_DECAY[0]), math.log10(WEIGHT_DECAY[1]))
                ),
            },
        )
    if name == "pb2":
        from popflow.schedulers import PB2

        return PB2(
            time_attr="training_iteration",
            perturbation_interval=interval,
            hyperparam_bounds={
                "lr": list(LR),
                "momentum": list(MOMENTUM),
                "weight_decay": list(WEIGHT_DECAY),
            },
        )
    if name == "asha":
        return ASHAScheduler(time_attr="training_iteration", max_t=epochs, grace_period=2)
    if name == "random":
        return FIFOScheduler()
    raise ValueError(f"--scheduler is {name!r}, but must be pbt, pb2, asha or random")


def tune_digits(
    scheduler: str = "pbt",
    num_samples: int = 8,
    epochs: int = 40,
    interval: int = 4,
    seed: int | None = 0,
    storage: str = "./results",
    name: str | None = None,
    **run_kwargs: Any,
) -> Any:
    """Tune the MLP with ``scheduler``; the ResultGrid (metric: validation accuracy)."""
    return run(
        DigitsMLP,
        param_space(),
        scheduler=make_scheduler(scheduler, epochs, interval),
        metric="mean_accuracy",
        mode="max",
        num_samples=num_samples,
        stop={"training_iteration": epochs},
        checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="mean_accuracy"
        ),
        storage=storage,
        name=name or f"digits_{scheduler}",
        seed=seed,
        **run_kwargs,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheduler", default="pbt", choices=["pbt", "pb2", "asha", "random"])
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--interval", type=int, default=4, help="PBT's perturbation interval")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage", default="./results")
    parser.add_argument("--name", default=None)
    parser.add_argument("--smoke-test", action="store_true", help="4 members, 6 epochs")
    add_storage_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke_test:
        args.num_samples, args.epochs, args.interval = 4, 6, 2
    results = tune_digits(
        args.scheduler,
        args.num_samples,
        args.epochs,
        args.interval,
        args.seed,
        args.storage,
        args.name,
        storage_options=storage_options_from_args(args),
    )
    best = results.get_best_result()
    print(
        f"best validation accuracy {best.metrics['mean_accuracy']:.4f} "
        f"(log loss {best.metrics['val_loss']:.4f}) with {best.config}; checkpoint {best.checkpoint}"
    )


if __name__ == "__main__":
    main()
