"""Every path popflow reads or writes inside an experiment folder, ``<storage>/<name>/``.

The folder is a format: experiments written by earlier versions resume, so these names
never change. Paths are relative to the experiment folder, ``/``-separated (local
disk and object stores alike)::

    <storage>/<name>/
    ├── pbt_global.txt                     GLOBAL_POLICY: every exploit, a line each (Ray's)
    ├── pbt_policy_<trial_id>.txt          policy_file(): a trial's lineage (Ray's)
    ├── <trial_dir>/                       trial_dir(): "<trainable>_<trial_id>", or what
    │   │                                  trial_dirname_creator returns; restarted_trial_dir()
    │   │                                  adds "_r<k>" for an errored trial started again
    │   ├── params.json                    PARAMS: its config (Ray's)
    │   ├── result.json                    RESULTS: its results, a JSON line each (Ray's)
    │   ├── progress.csv                   PROGRESS: the same as CSV (Ray's)
    │   ├── error.txt                      ERROR_FILE: the trace of its last error
    │   ├── events.out.tfevents.*          TENSORBOARD_EVENTS: TBXLoggerCallback's files
    │   ├── checkpoint_000010/             checkpoint_path(trial_dir, checkpoint_name(10, ...))
    │   │   ├── .popflow_manifest.json     MANIFEST: its files' sizes and SHA-256; it exists
    │   │   │                              once this does
    │   │   ├── _dict_checkpoint.pkl       DICT_CHECKPOINT_FILE: save_checkpoint's dict
    │   │   └── ...                        or the trainable's own files
    │   ├── checkpoint_000010_1/           the same iteration reached again by a restarted lineage
    │   ├── checkpoint_000010_e3/          the same iteration published by driver epoch 3: each
    │   │                                  name has one owner epoch (checkpoint_owner())
    │   ├── checkpoint_000010_e3_a2/       the same, by the trial's second segment attempt of
    │   │                                  that epoch (a re-dispatch: checkpoint_attempt())
    │   └── *.tmp-<hex>, *.old-<hex>       scratch (SCRATCH_MARKERS): half-published
    │                                      checkpoints, staging_path() save_folder() trash_path();
    │                                      nothing reads them and a resume removes them
    └── .popflow/                          LOG_DIR: popflow's own state
        ├── experiment.json                EXPERIMENT_FILE: name, scheduler, seed, metric, mode
        ├── commits/00000001.json          commit_path(seq): the commit log (COMMITS)
        ├── commits/00000001.pruned        pruned_path(seq): a pruned commit whose name is
        │                                  kept (its file a tombstone): no reader lists it
        ├── lease/00000001.json            lease_path(epoch): the driver's lease (LEASE_DIR)
        ├── run_args.json                  RUN_ARGS_FILE: the run's arguments, for resume
        ├── run_args.pkl                   PICKLED_ARGS_FILE: the arguments JSON cannot hold
        ├── tune_args.pkl                  OLD_RUN_ARGS_FILE: older versions' arguments (read)
        ├── code.json                      CODE_FILE: where the trainable's code was loaded from
        ├── storage_probe.json             STORAGE_PROBE_FILE: the driver's token, which each
        │                                  Dask worker reads back before it trains (it sees
        │                                  this storage: not a folder of its own machine's)
        └── parameters/<sha256>.pkl        parameters_path(): with_parameters' objects

The numbered files' names are their numbers in decimal, zero-padded to at least 8 digits
(``00000012.json``, ``100000000.json``); ``commit_seqs`` and ``lease_epochs_in`` read the
numbers back from a listing, as numbers at any digit count up to :data:`MAX_NUMBER`, and
skip every name :func:`commit_path` and :func:`lease_path` cannot have made
(:func:`stray_numbered_names` lists those).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

#: popflow's own state, beside the trials' folders
LOG_DIR = ".popflow"
#: The run's name, scheduler, seed, metric and mode
EXPERIMENT_FILE = f"{LOG_DIR}/experiment.json"
#: The commit log: one numbered file per commit (:func:`commit_path`)
COMMITS = f"{LOG_DIR}/commits"
#: The driver's lease: one numbered file per epoch (:func:`lease_path`)
LEASE_DIR = f"{LOG_DIR}/lease"
#: The run's arguments as JSON, for ``popflow resume`` and ``Tuner.restore`` (no storage
#: options: no secrets)
RUN_ARGS_FILE = f"{LOG_DIR}/run_args.json"
#: The arguments JSON cannot hold, pickled (written only when there are some; its SHA-256
#: is in :data:`RUN_ARGS_FILE`)
PICKLED_ARGS_FILE = f"{LOG_DIR}/run_args.pkl"
#: Older versions kept every argument pickled here; still read when there is no JSON
OLD_RUN_ARGS_FILE = f"{LOG_DIR}/tune_args.pkl"
#: Where the trainable's code came from (for ``popflow resume`` in another folder)
CODE_FILE = f"{LOG_DIR}/code.json"
#: A token the driver writes and every Dask worker reads back before its first segment:
#: a worker on another machine that sees none of it has a folder of its own at that path
STORAGE_PROBE_FILE = f"{LOG_DIR}/storage_probe.json"
#: ``with_parameters``' objects, each named by its pickle's SHA-256
PARAMETERS_DIR = f"{LOG_DIR}/parameters"

#: Every exploit, a line each (Ray's name), at the top of the experiment folder
GLOBAL_POLICY = "pbt_global.txt"
#: A trial's results, a JSON line each, in its folder (Ray's name)
RESULTS = "result.json"
#: A trial's results as CSV, in its folder (Ray's name)
PROGRESS = "progress.csv"
#: A trial's derived logs, in its folder
LOGS = (RESULTS, PROGRESS)
#: A trial's config, in its folder (Ray's name)
PARAMS = "params.json"
#: A trial's error (its trace), in its folder
ERROR_FILE = "error.txt"
#: How tensorboardX names its event files (``TBXLoggerCallback`` writes them in a trial's folder)
TENSORBOARD_EVENTS = "events.out.tfevents."

#: Every checkpoint folder's name starts so
CHECKPOINT_PREFIX = "checkpoint_"
#: A checkpoint's manifest, in its folder: the checkpoint exists once this does
MANIFEST = ".popflow_manifest.json"
#: The dict a class trainable's ``save_checkpoint`` returned, pickled in its checkpoint
DICT_CHECKPOINT_FILE = "_dict_checkpoint.pkl"
#: In the names of folders being published or thrown away: never read, removed by a resume
SCRATCH_MARKERS = (".tmp-", ".old-")

#: What :func:`checkpoint_name` makes; a name read back from storage must look so: the
#: iteration, the owner epoch's ``_e<epoch>`` above epoch 1, the segment attempt's
#: ``_a<attempt>`` from attempt 2 on, a restarted lineage's ``_k``.
_CHECKPOINT_NAME = re.compile(
    re.escape(CHECKPOINT_PREFIX)
    + r"[0-9]{6,}(?:_e([1-9][0-9]{0,14}))?(?:_a([2-9]|[1-9][0-9]{1,14}))?(?:_[0-9]+)?"
)
#: What :func:`parameters_path` makes: the first 32 hex digits of the pickle's SHA-256.
_PARAMETERS_PATH = re.compile(re.escape(PARAMETERS_DIR) + r"/([0-9a-f]{32})\.pkl")
#: The numbered files of :data:`COMMITS` and :data:`LEASE_DIR` are zero-padded to at least
#: this many digits (earlier versions' names; numbers from 10**8 on take more).
_NUMBER_DIGITS = 8
#: The largest commit number or lease epoch (15 digits). A run reaches it only after
#: 10**15 commits or takeovers, so a name above it was not written by popflow: readers skip
#: it (an absurd epoch planted in the lease folder changes nothing), and no driver numbers
#: a file beyond it (a file it would skip).
MAX_NUMBER = 10**15 - 1
#: A numbered file's name as a listing gives it: ASCII digits only (``str.isdigit`` and
#: ``int`` also take other scripts' digits), at most as many as :data:`MAX_NUMBER` has.
_NUMBERED_NAME = re.compile(rf"([0-9]{{{_NUMBER_DIGITS},{len(str(MAX_NUMBER))}}})(\.json|\.pruned)")
#: The mark beside a commit that was pruned but whose name stays taken (:func:`pruned_path`)
_PRUNED = ".pruned"


def _numbered(folder: str, number: int, suffix: str = ".json") -> str:
    if not 0 <= number <= MAX_NUMBER:
        raise ValueError(
            f"{folder} numbers its files from 0 to {MAX_NUMBER}, not {number}: "
            "no run makes that many commits or takeovers"
        )
    return f"{folder}/{number:0{_NUMBER_DIGITS}d}{suffix}"


def commit_path(seq: int) -> str:
    """Commit ``seq``'s file (``.popflow/commits/00000012.json``)."""
    return _numbered(COMMITS, seq)


def pruned_path(seq: int) -> str:
    """The mark that commit ``seq`` was pruned (``.popflow/commits/00000012.pruned``): its
    file stays as a tombstone, so that no stale driver can create a commit of that number
    again (:meth:`~popflow.infra.store.commit_log.ExperimentLog.commit_numbers` skips it)."""
    return _numbered(COMMITS, seq, _PRUNED)


def lease_path(epoch: int) -> str:
    """The lease file of driver epoch ``epoch`` (``.popflow/lease/00000003.json``)."""
    return _numbered(LEASE_DIR, epoch)


def _number_of(name: str, suffix: str = ".json") -> int | None:
    """The number a numbered file's ``name`` stands for, or None if no call of
    :func:`_numbered` makes that name: numbers compare as numbers whatever their digit
    count (``100000000.json`` is above ``99999999.json``), and one number has one name
    (``000000012.json`` is not commit 12, whose name is ``00000012.json``)."""
    match = _NUMBERED_NAME.fullmatch(name)
    if match is None or match.group(2) != suffix:
        return None
    number = int(match.group(1))
    return number if name == f"{number:0{_NUMBER_DIGITS}d}{suffix}" else None


def _numbers_in(names: Iterable[str], suffix: str = ".json") -> list[int]:
    return sorted(n for n in (_number_of(name, suffix) for name in names) if n is not None)


def commit_seqs(names: Iterable[str]) -> list[int]:
    """The commit numbers among the names a listing of :data:`COMMITS` gave, in order
    (pruned ones too: their files are tombstones; see :func:`pruned_seqs`)."""
    return _numbers_in(names)


def pruned_seqs(names: Iterable[str]) -> list[int]:
    """The numbers of the pruned commits (:func:`pruned_path`) among the names a listing of
    :data:`COMMITS` gave, in order."""
    return _numbers_in(names, _PRUNED)


def lease_epochs_in(names: Iterable[str]) -> list[int]:
    """The epochs among the names a listing of :data:`LEASE_DIR` gave, oldest first."""
    return _numbers_in(names)


def stray_numbered_names(names: Iterable[str]) -> list[str]:
    """The ``.json`` names in a listing of :data:`COMMITS` or :data:`LEASE_DIR` that
    :func:`commit_seqs` and :func:`lease_epochs_in` skip: no popflow wrote them."""
    return sorted(n for n in names if n.endswith(".json") and _number_of(n) is None)


def trial_dir(trainable_name: str, trial_id: str) -> str:
    """A trial's folder unless ``trial_dirname_creator`` names it (``Parity_ab12c_00001``)."""
    return f"{trainable_name}_{trial_id}"


def restarted_trial_dir(dirname: str, restarts: int) -> str:
    """The folder of an errored trial started again from scratch (the old one stays)."""
    return f"{dirname}_r{restarts}"


def policy_file(trial_id: str) -> str:
    """A trial's lineage (Ray's ``pbt_policy_<trial_id>.txt``), at the top of the folder."""
    return f"pbt_policy_{trial_id}.txt"


def checkpoint_path(trial_dir: str, name: str) -> str:
    """Where a trial's checkpoint lives, relative to the experiment's storage."""
    return f"{trial_dir}/{name}"


def checkpoint_name(
    iteration: int, taken: frozenset[str] | set[str], epoch: int = 0, attempt: int = 1
) -> str:
    """``checkpoint_000010``; a suffix when a restarted lineage reaches a used iteration.

    ``epoch``: the driver's lease epoch. Above epoch 1 the name carries it
    (``checkpoint_000010_e3``), so that no two drivers ever publish under one name: a stale
    driver's publish lands under a name no newer driver writes, commits or reads
    (:func:`checkpoint_owner`). Epoch 1 (the experiment's first lease, created once) and
    0 (no lease) keep Ray's plain name, which only they write from this release on.

    ``attempt``: the trial's segment attempt within that epoch (the driver starts a new one
    for a segment that could reach an iteration an earlier dispatch of the trial may still
    publish: a lost worker's, say). From attempt 2 on the name carries it
    (``checkpoint_000010_e3_a2``, ``checkpoint_000010_a2`` in epoch 1), so that a stale
    attempt's late publish lands under a name the current one never writes; every publish
    is create-only (:func:`~popflow.infra.store.checkpoints.publish_checkpoint`)."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_NUMBER:
        raise ValueError(f"a segment attempt is a number from 1 to {MAX_NUMBER}, not {attempt!r}")
    base = f"{CHECKPOINT_PREFIX}{iteration:06d}"
    if epoch > 1:
        base = f"{base}_e{epoch}"
    if attempt > 1:
        base = f"{base}_a{attempt}"
    name = base
    k = 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    return name


def is_checkpoint_name(name: object) -> bool:
    """``name`` is one :func:`checkpoint_name` could have made (``checkpoint_000010_e3_2``)."""
    return isinstance(name, str) and _CHECKPOINT_NAME.fullmatch(name) is not None


def checkpoint_owner(name: str) -> int | None:
    """The lease epoch whose driver alone publishes checkpoint ``name`` (from the name,
    nothing read): the ``_e<epoch>`` it carries, else 1 (a plain name: the first driver's,
    or any driver's before this release, which only a driver of epoch 1 or none writes
    now). None if ``name`` is no checkpoint name."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 1


def checkpoint_attempt(name: str) -> int | None:
    """The segment attempt that published checkpoint ``name`` (from the name): the
    ``_a<attempt>`` it carries, else 1. None if ``name`` is no checkpoint name."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    return int(match.group(2)) if match.group(2) else 1


def is_scratch(name: str) -> bool:
    """``name`` (in a trial's folder) is a folder being published or thrown away."""
    return any(marker in name for marker in SCRATCH_MARKERS)


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


def staging_path(path: str) -> str:
    """A new scratch name beside ``path``, to build it in and publish it by a rename."""
    return f"{path}{SCRATCH_MARKERS[0]}{_suffix()}"


def trash_path(path: str) -> str:
    """A new scratch name beside ``path``, to move it out of the way before removing it."""
    return f"{path}{SCRATCH_MARKERS[1]}{_suffix()}"


def save_folder(trial_dir: str) -> str:
    """A new scratch folder in a trial's folder for a checkpoint to be saved into."""
    return staging_path(f"{trial_dir}/save")


def parameters_path(sha256_hex: str) -> str:
    """Where a ``with_parameters`` object whose pickle has this SHA-256 is stored."""
    return f"{PARAMETERS_DIR}/{sha256_hex[:32]}.pkl"


def is_parameters_path(path: object) -> bool:
    """``path`` is one :func:`parameters_path` could have made."""
    return isinstance(path, str) and _PARAMETERS_PATH.fullmatch(path) is not None
