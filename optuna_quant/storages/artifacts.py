"""What a run writes beside its study: every output path checked before the run starts, and the best
int8 model stored as an Optuna artifact of the study, for optuna-dashboard to offer.

Example:
    >>> upload_model(study, "optuna_quant-artifacts", lock, number=41, build=best_model)  # doctest: +SKIP
    'best-trial-41.int8.onnx'
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
import tempfile

import onnx
import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts import get_all_artifact_meta
from optuna.artifacts import upload_artifact

from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.rdb import optuna_warnings_off


class NotWritableError(ValueError):
    """A folder or file that a run must write to cannot be written; raised before any trial."""


def check_writable(path: str | Path, what: str, *, folder: bool = False) -> None:
    """Check that the file ``path`` (or with ``folder``, the folder) can be written, creating nothing.

    An existing path must be of that kind: a file that opens for appending (which changes
    nothing), a folder where a temporary file can be made and removed. For a missing path, its
    nearest existing parent must be a folder where such a file can be made, as writing would make
    the missing folders there. A test file, not ``os.access``, because the superuser passes every
    ``os.access`` check even where writing fails (``/proc``).

    Args:
        path: The file or folder.
        what: The key or option that gave the path, which the message names (``"artifact_dir"``).
        folder: Whether ``path`` names a folder.

    Raises:
        NotWritableError: If it cannot be written, naming ``what``, the path and why.

    Example:
        >>> check_writable("/proc/version/model.onnx", "export")
        Traceback (most recent call last):
        ...
        optuna_quant.storages.artifacts.NotWritableError: export: cannot write /proc/version/model.onnx: /proc/version is a file, not a folder.
    """
    problem = _unwritable(Path(path).absolute(), folder)
    if problem is not None:
        raise NotWritableError(f"{what}: cannot write {path}: {problem}.")


def _unwritable(path: Path, folder: bool) -> str | None:
    """Why ``path`` cannot be written, or ``None`` when it can."""
    if path.exists():
        if path.is_dir() != folder:
            return f"{path} is {'a folder' if path.is_dir() else 'a file'}, not a {'folder' if folder else 'file'}"
        target = path
    else:
        target = path.parent
        while not target.exists():
            target = target.parent
        if not target.is_dir():
            return f"{target} is a file, not a folder"
    try:
        if target.is_dir():
            with tempfile.NamedTemporaryFile(dir=target, prefix=".optuna-quant-write-check-"):
                pass
        else:
            with target.open("ab"):
                pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def model_filename(number: int) -> str:
    """The artifact's file name for the model of trial ``number``."""
    return f"best-trial-{number}.int8.onnx"


def upload_model(
    study: optuna.Study,
    artifact_dir: str | Path,
    lock: StudyLock,
    number: int,
    build: Callable[[], onnx.ModelProto],
) -> str:
    """Store the int8 model of trial ``number`` with ``study``, once for every worker.

    Trials are finished when a model is exported, and Optuna attaches artifacts to running
    trials only, so the model is attached to the study, named after its trial.

    Args:
        study: The study.
        artifact_dir: The folder of the file-system artifact store (optuna-dashboard's
            ``--artifact-dir``).
        lock: The study lock, so that two workers do not store the same model twice.
        number: The trial the model belongs to.
        build: Builds the model; called only when it is not stored yet.

    Returns:
        The artifact's file name.
    """
    filename = model_filename(number)
    if _stored(study, filename):
        return filename
    model = build()  # outside the lock: calibration may take seconds
    with lock():
        if not _stored(study, filename):
            Path(artifact_dir).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / filename
                onnx.save(model, str(path))
                with optuna_warnings_off():
                    upload_artifact(
                        study_or_trial=study, file_path=str(path), artifact_store=FileSystemArtifactStore(artifact_dir)
                    )
    return filename


def _stored(study: optuna.Study, filename: str) -> bool:
    with optuna_warnings_off():
        return any(meta.filename == filename for meta in get_all_artifact_meta(study))
