"""optuna-dashboard on a study's storage: the live view of a run, with the study's own figures.

:class:`DashboardFigures` is an ``optimize`` callback that stores the figures of
:mod:`optuna_quant.visualization.figures` in the study after a trial, at most every 10 s, and once
more when a run ends, where optuna-dashboard shows them on the study's page (optuna-dashboard keeps
Plotly figures in study system attrs, as ``optuna_dashboard.save_plotly_graph_object`` writes
them): the answer is on the page while the study runs.

Example:
    >>> study.optimize(n_trials=40, callbacks=[DashboardFigures()])             # doctest: +SKIP
    >>> study_url("sqlite:///demo.db", "mnist-cnn-int8", "127.0.0.1", 8080)   # doctest: +SKIP
    'http://127.0.0.1:8080/dashboard/studies/1'
    >>> serve("sqlite:///demo.db", port=8080)                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
import time
import uuid

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import study_identity
from optuna_quant.storages.factory import open_storage
from optuna_quant.visualization.figures import study_figures


_logger = logging.getLogger("optuna_quant")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
REFRESH_SECONDS = 10.0
STORED_AT_KEY = "optuna_quant:figures_stored_at"
"""Study system attr: when a worker last stored the figures (seconds since the epoch), and the
seconds that store took."""
FLUSH_KEY = "optuna_quant:figures_flush"
"""Study system attr: the last worker to end a run, which stores the figures."""
COST_SHARE = 0.05
"""Beside other workers, the figures take at most this share of one worker's time."""
PLOT_DATA_PREFIX = "dashboard:plot_data:"
PLOT_DATA_CHUNK = 2045
"""optuna-dashboard's keys of a stored figure, ``<prefix><id>:<i>``, and the most characters each holds."""


def study_url(
    storage: str | BaseStorage, study_name: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> str:
    """The dashboard page of ``study_name``.

    Raises:
        KeyError: If the storage holds no study of that name.
        optuna_quant.storages.urls.StorageError: If ``storage`` is a URL that cannot be opened.
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


def save_figures(study: optuna.Study, stored: dict[str, str] | None = None) -> list[str]:
    """Store the figures of :func:`optuna_quant.visualization.figures.study_figures` in ``study`` for
    optuna-dashboard, each under its stable id (a later call replaces them); return the ids.

    Args:
        study: The study.
        stored: The figures' JSON as last stored, by id: an unchanged figure (the sensitivity,
            mostly) is not written again. Updated in place.

    Raises:
        ValueError: If a figure holds a value JSON cannot write (NaN, infinity).
    """
    stored = {} if stored is None else stored
    storage, study_id = study_identity(study)
    figures = study_figures(study)
    for figure_id, figure in figures.items():
        text = json.dumps(figure, separators=(",", ":"), allow_nan=False)
        if stored.get(figure_id) != text:
            _save_graph_object(storage, study_id, figure_id, text)
            stored[figure_id] = text
    return list(figures)


def _save_graph_object(storage: BaseStorage, study_id: int, figure_id: str, text: str) -> None:
    """Store a Plotly figure's JSON as ``optuna_dashboard.save_plotly_graph_object`` does: in
    chunks of study system attrs, a shorter figure's leftover chunks emptied.

    Written here because importing optuna-dashboard loads its web server in every worker
    (docs/dashboard.md, "What it costs"); ``tests/visualization/test_dashboard.py`` reads the
    figures back through optuna-dashboard's own reader and renders them in Chromium.
    """
    prefix = f"{PLOT_DATA_PREFIX}{figure_id}:"
    chunks = [text[i : i + PLOT_DATA_CHUNK] for i in range(0, len(text), PLOT_DATA_CHUNK)]
    for i, chunk in enumerate(chunks):
        storage.set_study_system_attr(study_id, f"{prefix}{i}", chunk)
    before = sum(key.startswith(prefix) for key in storage.get_study_system_attrs(study_id))
    for i in range(len(chunks), before):
        storage.set_study_system_attr(study_id, f"{prefix}{i}", "")


class DashboardFigures:
    """An ``optimize`` callback: after a trial, the study's figures are stored again for
    optuna-dashboard (those that changed), at most every ``every`` seconds; :meth:`flush` stores
    them when the study's last run ends.

    A worker stores them once ``every`` seconds passed since its first trial ended or it last
    stored them or found it another worker's turn, and reads nothing of the study before. Beside
    other running trials, it stores them only once ``every`` seconds passed since any worker of the
    study last did, too, and at least the last store's time over :data:`COST_SHARE` (both kept in
    the study, :data:`STORED_AT_KEY`): with tens of workers, rebuilding the figures of a long study
    after every trial of each would cost more than the trials' own coordination.

    Args:
        every: Seconds between two stores of the study's figures, over all its workers; 0 stores
            them after every trial of a worker alone.

    Attributes:
        seconds: Time spent storing figures, per store, for a run's cost report.

    Example:
        >>> figures = DashboardFigures()
        >>> study.optimize(n_trials=40, callbacks=[figures])   # doctest: +SKIP
        >>> figures.flush(study)                                # doctest: +SKIP
    """

    def __init__(self, every: float = REFRESH_SECONDS) -> None:
        self.every = every
        self.seconds: list[float] = []
        self._stored: dict[str, str] = {}
        self._last: float | None = None  # this worker's last store, or its first trial's end

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        now = time.time()
        if self._last is None:
            self._last = now
        if now - self._last < self.every:  # no read of the study: neither rule would store now
            return
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self._store(study, f"after trial {trial.number}")
            return
        storage, study_id = study_identity(study)
        last, took = storage.get_study_system_attrs(study_id).get(STORED_AT_KEY, (0.0, 0.0))
        # Two workers that read the same time both store: a figure twice, never a lost one.
        if now - last < max(self.every, took / COST_SHARE):
            self._last = now  # another worker's turn: look again in `every` s, not after each trial
            return
        storage.set_study_system_attr(study_id, STORED_AT_KEY, (now, took))
        self._store(study, f"after trial {trial.number}")
        storage.set_study_system_attr(study_id, STORED_AT_KEY, (now, self.seconds[-1]))

    def flush(self, study: optuna.Study) -> None:
        """Store the figures now (those that changed), unless another worker's trial runs or
        another worker's run ended since: the last run to end stores the study's last word.

        Workers whose runs end together (a budget used up) each name themselves in the study
        (:data:`FLUSH_KEY`) and store only if their name is still the last written: one or a few
        store, not every one, and the last writer always does.
        """
        storage, study_id = study_identity(study)
        token = uuid.uuid4().hex
        try:
            if study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                return
            storage.set_study_system_attr(study_id, FLUSH_KEY, token)
            last = storage.get_study_system_attrs(study_id).get(FLUSH_KEY) == token
        except Exception as err:  # as a store's failure: the run's results stand without the figures
            _logger.warning("Could not store the dashboard's figures at the end of the run: %r", err)
            return
        if last:
            self._store(study, "at the end of the run")

    def _store(self, study: optuna.Study, when: str) -> None:
        start = time.perf_counter()
        try:
            save_figures(study, self._stored)
        except Exception as err:  # a chart is never worth a worker: the study goes on without it
            _logger.warning("Could not store the dashboard's figures %s: %r", when, err)
        self.seconds.append(time.perf_counter() - start)
        self._last = time.time()
