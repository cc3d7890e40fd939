"""optuna-dashboard on a study's storage: the live view of a run.

Example:
    >>> study_url("sqlite:///demo.db", "mnist-cnn-int8", "127.0.0.1", 8080)   # doctest: +SKIP
    'http://127.0.0.1:8080/dashboard/studies/1'
    >>> serve("sqlite:///demo.db", port=8080)                                 # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import BaseStorage

from optuna_quant.storage import open_storage

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def study_url(
    storage: str | BaseStorage, study_name: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> str:
    """The dashboard page of ``study_name``.

    Raises:
        KeyError: If the storage holds no study of that name.
        optuna_quant.storage.StorageError: If ``storage`` is a URL that cannot be opened.
    """
    study_id = open_storage(storage).get_study_id_from_name(study_name)
    return f"http://{host}:{port}/dashboard/studies/{study_id}"


def serve(
    storage: str | BaseStorage,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    artifact_dir: str | Path | None = None,
) -> None:
    """Run optuna-dashboard on ``storage`` until interrupted (it blocks).

    Args:
        storage: The storage URL or object.
        host: The address to listen on; ``0.0.0.0`` serves other machines.
        port: The port to listen on.
        artifact_dir: The study's artifact store, where the best models are offered for download.
    """
    # Imported here: the dashboard's web stack is needed by this command only.
    from optuna_dashboard import run_server

    store = None if artifact_dir is None else FileSystemArtifactStore(artifact_dir)
    run_server(storage, host=host, port=port, artifact_store=store)
