"""The best int8 model stored as an Optuna artifact of its study, for optuna-dashboard to offer.

Example:
    >>> upload_model(study, "optuna_quant-artifacts", lock, number=41, build=best_model)  # doctest: +SKIP
    'best-trial-41.int8.onnx'
"""

from __future__ import annotations

from collections.abc import Callable
import os
from pathlib import Path
import tempfile

import onnx
import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts import get_all_artifact_meta
from optuna.artifacts import upload_artifact

from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.storages.lock import StudyLock


class NotWritableError(ValueError):
    """A folder or file that a run must write to cannot be written; raised before any trial."""


def check_writable(path: str | Path, what: str, *, is_file: bool = False) -> None:
    """Make sure that files can be written into the folder ``path`` (or the file ``path``).

    Missing folders are created, as writing would create them.

    Args:
        path: A folder; with ``is_file``, a file whose folder is checked, and itself if it exists.
        what: What the path is for, as the message names it (``"artifact_dir"``).
        is_file: Whether ``path`` names a file.

    Raises:
        NotWritableError: If it cannot, naming ``what``, the path and the reason.

    Example:
        >>> check_writable("/proc/no-such-folder", "artifact_dir")
        Traceback (most recent call last):
        ...
        optuna_quant.storages.artifacts.NotWritableError: artifact_dir '/proc/no-such-folder' is not writable: ...
    """
    path = Path(path)
    folder = path.parent if is_file else path
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        if is_file and path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(f"[Errno 13] Permission denied: '{path}'")
    except OSError as err:
        raise NotWritableError(f"{what} {str(path)!r} is not writable: {err.strerror or err}") from err


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
