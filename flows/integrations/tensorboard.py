"""Ray's ``TBXLoggerCallback``: a TensorBoard event file per trial, in the trial's folder.

    from popflow.tune.logger import TBXLoggerCallback
    tune.run(MyTrainable, ..., storage="./results", callbacks=[TBXLoggerCallback()])
    # tensorboard --logdir ./results/<experiment>

Needs the ``tensorboard`` extra (``pip install 'popflow[tensorboard]'``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from popflow.flows.events.callbacks import LoggerCallback
from popflow.flows.experiment.results import flatten
from popflow.infra.optional_imports import require
from popflow.infra.storage.errors import is_storage_failure
from popflow.infra.store.layout import TENSORBOARD_EVENTS
from popflow.schedulers import Trial

logger = logging.getLogger(__name__)

#: Ray's tag prefix, kept so that dashboards made for Ray's runs show popflow's
TAG_PREFIX = "ray/tune/"
#: result keys Ray does not log to TensorBoard
NOT_LOGGED = ("config", "pid", "timestamp", "time_total_s", "training_iteration")


def step_of(result: dict[str, Any]) -> int:
    """Ray's step for a result: ``timesteps_total`` if set, else ``training_iteration``."""
    return result.get("timesteps_total") or result["training_iteration"]


def is_number(value: Any) -> bool:
    """A scalar Ray logs (bools too, as Ray: 0 and 1)."""
    return isinstance(value, int | float | np.integer | np.floating)


def hparams_of(config: dict[str, Any]) -> dict[str, Any]:
    """The config's flat scalar values (TensorBoard's HParams take no lists or objects)."""
    flat = flatten(config)
    out = {k: v for k, v in flat.items() if isinstance(v, str | bool | int | float)}
    out.update({k: v.item() for k, v in flat.items() if isinstance(v, np.bool_ | np.number)})
    left = sorted(set(flat) - set(out))
    if left:
        logger.debug("not hparams (not scalars): %s", left)
    return out


class TBXLoggerCallback(LoggerCallback):
    """Ray's ``ray.tune.logger.TBXLoggerCallback``: results to TensorBoard, with tensorboardX.

    Each trial gets a ``SummaryWriter`` in its folder (``trial.path``): every
    number of a result is a scalar tagged ``ray/tune/<key>`` (Ray's tags,
    nested dicts flattened with ``/``, not ``config``, ``pid``, ``timestamp``,
    ``time_total_s`` nor ``training_iteration``; NaN skipped), non-empty lists
    and arrays are histograms (3-d arrays an image, 4-d images, 5-d a video),
    at step ``timesteps_total`` or else ``training_iteration``. When the trial
    ends its config's scalar values go to TensorBoard's HParams with the last
    values as metrics. A trial resumed by a later driver adds an event file.

    When storage is remote (``s3://...``) the event files are written to a
    local staging folder and copied into the trial's folder with fsspec at
    the end of every round, when the trial ends and when the experiment ends;
    ``storage_options`` are fsspec's for that (popflow does not hand its own
    to callbacks: pass the ones given to ``run``). A failed copy is tried
    again at the next round.
    """

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self._writer_cls = require("tensorboardX", "tensorboard", "TBXLoggerCallback").SummaryWriter
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"`storage_options` must be a dict, got {storage_options!r}")
        self._storage_options = dict(storage_options or {})
        self._writers: dict[str, Any] = {}  # trial_id -> SummaryWriter
        self._last: dict[str, dict[str, Any]] = {}  # trial_id -> its last scalars
        self._remote: dict[str, tuple[Any, str, str]] = {}  # trial_id -> (fs, folder, staging)
        self._uploaded: dict[str, int] = {}  # staged event file -> size copied
        self._staging: str | None = None

    def _logdir(self, trial: Trial) -> str:
        if not trial.path:
            raise ValueError(f"trial {trial} has no folder (trial.path is empty)")
        fs, root = fsspec.core.url_to_fs(trial.path, **self._storage_options)
        if isinstance(fs, LocalFileSystem):
            return root
        if self._staging is None:
            self._staging = tempfile.mkdtemp(prefix="popflow-tbx-")
        staged = os.path.join(self._staging, trial.trial_id)
        self._remote[trial.trial_id] = (fs, root, staged)
        return staged

    def log_trial_start(self, trial: Trial) -> None:
        if trial.trial_id in self._writers:
            self._writers[trial.trial_id].close()
        self._writers[trial.trial_id] = self._writer_cls(self._logdir(trial), flush_secs=30)
        self._last[trial.trial_id] = {}

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial.trial_id not in self._writers:
            self.log_trial_start(trial)
        writer = self._writers[trial.trial_id]
        step = step_of(result)
        values = {k: v for k, v in result.items() if k not in NOT_LOGGED}
        scalars: dict[str, Any] = {}
        for key, value in flatten(values).items():
            tag = TAG_PREFIX + key
            if is_number(value) and not np.isnan(value):
                scalars[tag] = value
                writer.add_scalar(tag, value, global_step=step)
            elif (isinstance(value, list) and value) or (
                isinstance(value, np.ndarray) and value.size > 0
            ):
                self._add_array(writer, tag, value, step)
        self._last[trial.trial_id] = scalars
        writer.flush()

    @staticmethod
    def _add_array(writer: Any, tag: str, value: Any, step: int) -> None:
        """Ray's: a 3-d array is an image, 4-d images, 5-d a video, anything else a histogram."""
        ndim = value.ndim if isinstance(value, np.ndarray) else 1
        try:
            if ndim == 3:
                writer.add_image(tag, value, global_step=step)
            elif ndim == 4:
                writer.add_images(tag, value, global_step=step)
            elif ndim == 5:
                writer.add_video(tag, value, global_step=step, fps=20)
            else:
                writer.add_histogram(tag, value, global_step=step)
        except (ValueError, TypeError, ImportError) as e:  # Ray's: warn and go on
            logger.warning("cannot log %s to TensorBoard: %s", tag, e)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        writer = self._writers.pop(trial.trial_id, None)
        if writer is None:
            return
        last = self._last.pop(trial.trial_id)
        params = hparams_of(trial.config)
        if params and last:
            from tensorboardX.summary import hparams

            for summary in hparams(hparam_dict=params, metric_dict=last):
                writer.file_writer.add_summary(summary)
        writer.close()
        self._upload(trial.trial_id)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        for trial_id in self._remote:
            if trial_id in self._writers:
                self._writers[trial_id].flush()
            self._upload(trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers, self._last = {}, {}
        copied = all([self._upload(trial_id) for trial_id in self._remote])
        if self._staging is not None and copied:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging, self._remote, self._uploaded = None, {}, {}

    def _upload(self, trial_id: str) -> bool:
        """Copy the trial's staged event files that grew (True: all are copied)."""
        if trial_id not in self._remote:
            return True
        fs, folder, staged = self._remote[trial_id]
        names = os.listdir(staged) if os.path.isdir(staged) else []
        for name in sorted(n for n in names if n.startswith(TENSORBOARD_EVENTS)):
            local = os.path.join(staged, name)
            size = os.path.getsize(local)
            if self._uploaded.get(local) == size:
                continue
            try:
                fs.put_file(local, f"{folder}/{name}")
            except Exception as e:
                if not is_storage_failure(e):
                    raise
                logger.warning("could not copy %s to %s (tried again later): %s", name, folder, e)
                return False
            self._uploaded[local] = size
        return True
