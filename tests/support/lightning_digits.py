"""A small PyTorch Lightning classifier of scikit-learn's bundled digits, and a function
trainable that fits it with popflow's Lightning callback (``tests/test_lightning.py``).

Imported by the tests that use it, not at collection: torch and Lightning take seconds to
import, which the unit tier's minute would pay on every run."""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from popflow import tune
from popflow.tune.integration.pytorch_lightning import TuneReportCheckpointCallback

# Lightning's advice about workers, GPUs and logging is noise in a test's output
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="lightning")

EPOCHS = 4
FILENAME = "trainer.ckpt"


def loaders() -> tuple[DataLoader, DataLoader]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    train = TensorDataset(x[:1200], y[:1200])
    val = TensorDataset(x[1200:], y[1200:])
    return DataLoader(train, batch_size=200), DataLoader(val, batch_size=600)


class Digits(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
        )

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, _: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())
        # which epoch this is, as the trainer counts it (a resumed fit goes on counting)
        self.log("epoch_seen", float(self.current_epoch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(config: dict[str, Any], **callback: Any) -> None:
    """Fit ``Digits`` for ``EPOCHS`` epochs, from the checkpoint popflow hands back if any."""
    callback = {"metrics": {"loss": "val_loss", "acc": "val_acc", "epoch": "epoch_seen"},
                "filename": FILENAME, **callback}  # fmt: skip
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        callbacks=[TuneReportCheckpointCallback(**callback)],
    )
    train, val = loaders()
    checkpoint = tune.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else nullcontext() as folder:
        path = str(Path(folder, FILENAME)) if folder else None
        trainer.fit(Digits(config["lr"]), train, val, ckpt_path=path)
