"""A small PyTorch CNN on scikit-learn's digits, tuned by PBT with the function API.

The same task as ``digits_mlp.py`` (8x8 digits, held-out validation split),
written as Ray Tune users write PyTorch: a training function that resumes
from ``tune.get_checkpoint()`` and reports every epoch with a checkpoint
folder (``model.pt``: the model's and the optimiser's state dicts) made by
``tune.Checkpoint.from_directory``. PBT mutates the SGD learning rate and
momentum. ``--gpus-per-trial`` asks each trial for a GPU share
(``resources_per_trial={"cpu": 1, "gpu": g}``); the device is CUDA when the
trial's worker sees one (``CUDA_VISIBLE_DEVICES``), else the CPU.

    python examples/pytorch_cnn.py --smoke-test
    python examples/pytorch_cnn.py --num-samples 4 --epochs 20 --gpus-per-trial 0.5

Needs the ``torch`` and ``examples`` extras (``pip install -e ".[torch,examples]"``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from typing import Any

from popflow import tune
from popflow.infra.storage.options_cli import add_storage_arguments, storage_options_from_args
from popflow.schedulers import PopulationBasedTraining


def load_digits_tensors(device: Any) -> tuple[Any, Any, Any, Any]:
    """The digits as (N, 1, 8, 8) float tensors, the split ``digits_mlp`` uses."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order] / 16.0, y[order]
    n_val = 360

    def tensors(xs: Any, ys: Any) -> tuple[Any, Any]:
        images = torch.tensor(xs, dtype=torch.float32).reshape(-1, 1, 8, 8).to(device)
        return images, torch.tensor(ys, dtype=torch.long).to(device)

    return (*tensors(x[n_val:], y[n_val:]), *tensors(x[:n_val], y[:n_val]))


def make_model() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


def train_cnn(config: dict[str, Any]) -> None:
    import torch
    import torch.nn.functional as F

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(int(config.get("seed", 0)))
    x, y, x_val, y_val = load_digits_tensors(device)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config["lr"], momentum=config["momentum"], weight_decay=1e-4
    )
    epoch = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # resumed, or cloned from a better member by PBT
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch = state["epoch"]
        for group in optimizer.param_groups:  # the config wins: PBT may have changed it
            group["lr"], group["momentum"] = config["lr"], config["momentum"]
    while epoch < config["epochs"]:
        model.train()
        for idx in torch.randperm(len(y), device=device).split(32):
            optimizer.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
        epoch += 1
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = F.cross_entropy(logits, y_val).item()
            accuracy = (logits.argmax(dim=1) == y_val).float().mean().item()
        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                os.path.join(d, "model.pt"),
            )
            tune.report(
                {"mean_accuracy": accuracy, "val_loss": val_loss, "device": str(device)},
                checkpoint=tune.Checkpoint.from_directory(d),
            )


def missing_extras() -> list[str]:
    """popflow's extras this example needs and this Python lacks: ``torch`` (PyTorch)
    and ``examples`` (scikit-learn, for the digits)."""
    missing = []
    try:
        import torch  # noqa: F401
    except ImportError:
        missing.append("torch")
    try:
        import sklearn  # noqa: F401
    except ImportError:
        missing.append("examples")
    return missing


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--interval", type=int, default=4, help="PBT's perturbation interval")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0)
    parser.add_argument("--storage", default="./results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke-test", action="store_true", help="2 members, 4 epochs")
    add_storage_arguments(parser)
    args = parser.parse_args(argv)
    missing = missing_extras()
    if missing:  # said before anything starts, not as a traceback from every worker
        sys.exit(
            f"pytorch_cnn.py needs popflow's {' and '.join(missing)} extra: "
            f"pip install 'popflow[{','.join(missing)}]' (in a checkout: "
            f"pip install -e '.[{','.join(missing)}]')"
        )
    if args.smoke_test:
        args.num_samples, args.epochs, args.interval = 2, 4, 2
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=args.interval,
        hyperparam_mutations={
            "lr": lambda: 10 ** random.uniform(-3, -0.5),
            "momentum": lambda: random.uniform(0.0, 0.95),
        },
    )
    resources = {"cpu": 1, "gpu": args.gpus_per_trial} if args.gpus_per_trial else None
    tuner = tune.Tuner(
        tune.with_resources(train_cnn, resources) if resources else train_cnn,
        param_space={
            "lr": tune.loguniform(1e-3, 0.3),
            "momentum": tune.uniform(0.0, 0.95),
            "epochs": args.epochs,
        },
        tune_config=tune.TuneConfig(
            metric="mean_accuracy",
            mode="max",
            scheduler=pbt,
            num_samples=args.num_samples,
            seed=args.seed,
        ),
        run_config=tune.RunConfig(
            name="pytorch_cnn",
            storage_path=args.storage,
            storage_options=storage_options_from_args(args),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    )
    best = tuner.fit().get_best_result()
    print(
        f"best validation accuracy {best.metrics['mean_accuracy']:.4f} on "
        f"{best.metrics['device']} with {best.config}; checkpoint {best.checkpoint}"
    )


if __name__ == "__main__":
    main()
