"""Module paths from before the flows/ and infra/ subpackages, still importable.

Stored run arguments (``run_args.json``: a callback's or a config's class by path) and
pickles (``run_args.pkl``, a user's pickled ``ResultGrid``) name popflow's modules; an
experiment written before the move resumes, and such a pickle loads, because each old
name imports its new home. Four old modules are packages now under the same name
(``popflow.infra.storage``, ``popflow.infra.cluster``, ``popflow.flows.console``,
``popflow.flows.plots``) and one (``popflow.flows.experiment``): those cannot be aliased.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old module -> its home now
MOVED = {
    "popflow.flows.args_codec": "popflow.flows.spec.args_codec",
    "popflow.flows.artifacts": "popflow.flows.record.artifacts",
    "popflow.flows.callbacks": "popflow.flows.events.callbacks",
    "popflow.flows.cli": "popflow.flows.api.cli",
    "popflow.flows.cli_reading": "popflow.flows.api.cli_reading",
    "popflow.flows.cli_resume": "popflow.flows.api.cli_resume",
    "popflow.flows.commit_paths": "popflow.flows.experiment.commit_paths",
    "popflow.flows.commit_shape": "popflow.flows.experiment.commit_shape",
    "popflow.flows.config": "popflow.flows.spec.config",
    "popflow.flows.controller": "popflow.flows.driver.controller",
    "popflow.flows.deployable": "popflow.flows.record.deployable",
    "popflow.flows.early_end": "popflow.flows.driver.early_end",
    "popflow.flows.ending_trials": "popflow.flows.driver.ending_trials",
    "popflow.flows.experiment_name": "popflow.flows.spec.experiment_name",
    "popflow.flows.experiment_read": "popflow.flows.experiment.reading",
    "popflow.flows.flow_heartbeat": "popflow.flows.record.heartbeat",
    "popflow.flows.flow_parameters": "popflow.flows.record.flow_parameters",
    "popflow.flows.flow_retries": "popflow.flows.record.flow_retries",
    "popflow.flows.guards": "popflow.flows.driver.guards",
    "popflow.flows.launch": "popflow.flows.api.launch",
    "popflow.flows.live_results": "popflow.flows.console.live_results",
    "popflow.flows.live_table": "popflow.flows.console.live_table",
    "popflow.flows.log_repair": "popflow.flows.experiment.log_repair",
    "popflow.flows.mlflow_logger": "popflow.flows.integrations.mlflow",
    "popflow.flows.packing": "popflow.flows.driver.packing",
    "popflow.flows.plot_artifacts": "popflow.flows.record.plot_artifacts",
    "popflow.flows.plot_data": "popflow.flows.plots.data",
    "popflow.flows.plot_lineage": "popflow.flows.plots.lineage",
    "popflow.flows.plot_read": "popflow.flows.plots.reading",
    "popflow.flows.prefect_flow": "popflow.flows.record.prefect_flow",
    "popflow.flows.results": "popflow.flows.experiment.results",
    "popflow.flows.retention": "popflow.flows.driver.retention",
    "popflow.flows.round_runs": "popflow.flows.record.round_runs",
    "popflow.flows.run_args": "popflow.flows.spec.run_args",
    "popflow.flows.run_feed": "popflow.flows.record.run_feed",
    "popflow.flows.run_log": "popflow.flows.record.run_log",
    "popflow.flows.run_spec": "popflow.flows.spec.run_spec",
    "popflow.flows.runner_calls": "popflow.flows.backends.dask_backend",
    "popflow.flows.runner_pool": "popflow.flows.backends.dask_pool",
    "popflow.flows.stale_runs": "popflow.flows.record.stale_runs",
    "popflow.flows.status_view": "popflow.flows.console.status_view",
    "popflow.flows.tensorboard_logger": "popflow.flows.integrations.tensorboard",
    "popflow.flows.trainable_paths": "popflow.flows.spec.trainable_paths",
    "popflow.flows.training": "popflow.flows.api.training",
    "popflow.flows.trial_index": "popflow.flows.driver.trial_index",
    "popflow.flows.trial_logs": "popflow.flows.experiment.trial_logs",
    "popflow.flows.trial_table": "popflow.flows.experiment.trial_table",
    "popflow.flows.tune_run": "popflow.flows.api.tune_run",
    "popflow.flows.tuner": "popflow.flows.api.tuner",
    "popflow.infra.aws_blocks": "popflow.infra.storage.aws_blocks",
    "popflow.infra.checkpoint_store": "popflow.infra.store.checkpoints",
    "popflow.infra.credentials": "popflow.infra.storage.credentials",
    "popflow.infra.experiment_log": "popflow.infra.store.commit_log",
    "popflow.infra.gpus": "popflow.infra.cluster.gpus",
    "popflow.infra.json_delta": "popflow.infra.store.json_delta",
    "popflow.infra.lease": "popflow.infra.store.lease",
    "popflow.infra.local_files": "popflow.infra.storage.local_files",
    "popflow.infra.object_writes": "popflow.infra.storage.object_writes",
    "popflow.infra.retry": "popflow.infra.storage.retry",
    "popflow.infra.safe_paths": "popflow.infra.storage.safe_paths",
    "popflow.infra.state_text": "popflow.infra.store.state_text",
    "popflow.infra.storage_calls": "popflow.infra.storage.calls",
    "popflow.infra.storage_cli": "popflow.infra.storage.options_cli",
    "popflow.infra.storage_errors": "popflow.infra.storage.errors",
    "popflow.infra.worker_close_logs": "popflow.infra.cluster.worker_close_logs",
    "popflow.infra.worker_main": "popflow.infra.cluster.worker_main",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as the module at its new home (the same module object)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Already executed at its new home."""


def install() -> None:
    """Let the old names import (once per process)."""
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.append(_OldNames())
