"""Adversary (issue 44, item 4): ``Tuner.can_restore(path, storage_filesystem=fs)``.

Ray 2.60's signature is ``Tuner.can_restore(path, storage_filesystem=None)``, the
partner of ``Tuner.restore(path, trainable, ..., storage_filesystem=fs)`` that popflow
takes; Ray's fault-tolerance guide checks ``can_restore`` before ``restore``. popflow's
``can_restore`` has ``storage_options`` only, so the Ray spelling raises ``TypeError:
unexpected keyword argument 'storage_filesystem'``.
"""

from __future__ import annotations

import fsspec
import pytest

from popflow import tune

pytestmark = pytest.mark.unit


def test_can_restore_takes_rays_storage_filesystem(tmp_path):
    local = fsspec.filesystem("file")
    assert tune.Tuner.can_restore(str(tmp_path / "nothing"), storage_filesystem=local) is False
