""":class:`QuantStudy`: a quantization study on Optuna (made by
:func:`optuna_quant.study.create.create_study`), which runs it, reports its best trial and exports
that trial's int8 model.

Example:
    >>> import optuna_quant as oq
    >>> study = oq.create_study(model="model.onnx", calibration_data=calib,   # doctest: +SKIP
    ...                         eval_fn=evaluate, accuracy_loss=1.0, latency_reduce=1.5)
    >>> study.optimize(n_trials=100)                                         # doctest: +SKIP
    >>> study.best_result.summary()                                          # doctest: +SKIP
    'Best trial 41: acc_loss: 0.0063 lat_diff: 2.4468 (targets met)'
    >>> study.export_best("model.int8.onnx")                                 # doctest: +SKIP

Several workers (processes or machines) share a study through a database URL: each runs the same
``create_study(..., storage="postgresql://...", trials_load_method="warm_start")`` and
``optimize(n_trials)``; together they run ``n_trials`` trials (see :mod:`optuna_quant.study.worker`).
The load methods are :mod:`optuna_quant.study.load_methods`, the stored records
:mod:`optuna_quant.trial.records`.
"""

from __future__ import annotations

from collections.abc import Iterable
import logging
from pathlib import Path
from typing import Any

import onnx
import optuna

from optuna_quant import logs
from optuna_quant.measure.loss import Targets
from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.artifacts import upload_model
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lock import StudyLock
from optuna_quant.study.worker import Worker
from optuna_quant.trial import records
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import BestResult
from optuna_quant.trial.timing import time_report
from optuna_quant.trial.timing import TimeReport
from optuna_quant.visualization.dashboard import DashboardFigures


__all__ = ["QuantStudy"]

_logger = logging.getLogger("optuna_quant")


class QuantStudy:
    """A quantization study: the plain :class:`optuna.Study` plus the objective that feeds it.

    Attributes of the Optuna study (``trials``, ``best_trial``, ``user_attrs``...) are reachable
    directly on this object, and the study itself as :attr:`study`, so every Optuna tool works on it.

    Args:
        study: The Optuna study.
        objective: The quantization objective.
        storage: The storage the study was opened on.
        artifact_dir: Folder of the artifact store that receives the best model.
        run_trials: ``False`` for ``trials_load_method="eval"``, where ``optimize`` runs nothing.

    Attributes:
        figures: The callback that stores the study's figures for optuna-dashboard after every
            trial of :meth:`optimize`; its ``seconds`` tell what that cost.
    """

    def __init__(
        self,
        study: optuna.Study,
        objective: QuantizationObjective,
        storage: optuna.storages.BaseStorage,
        artifact_dir: str | Path,
        run_trials: bool = True,
    ) -> None:
        self.study = study
        self.objective = objective
        self.storage = storage
        self.artifact_dir = Path(artifact_dir)
        self.run_trials = run_trials
        # The last best model built: the artifact upload, export_best and best_model want the
        # same one, and each build deep-copies and rewrites the whole model.
        self._built: tuple[int, onnx.ModelProto] | None = None
        self.figures = DashboardFigures()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.study, name)

    @property
    def targets(self) -> Targets:
        """The accuracy and latency targets."""
        return self.objective.targets

    @property
    def stop_on_target(self) -> bool:
        """Whether every worker stops once a trial meets both targets (the objective's setting)."""
        return self.objective.settings.stop_on_target

    @property
    def heartbeat(self) -> Heartbeat | None:
        """This worker's heartbeat; ``None`` for a storage that no other process can open."""
        return self.objective.heartbeat

    @property
    def lock(self) -> StudyLock:
        """The lock that every worker of this study shares."""
        return self.objective.lock

    def optimize(
        self,
        n_trials: int | None = None,
        timeout: float | None = None,
        show_progress_bar: bool = False,
        callbacks: Iterable[Any] = (),
    ) -> BestResult | None:
        """Run trials until the study holds ``n_trials`` of them (POT's ``max_trials``).

        ``n_trials`` is the study's total, shared by every worker and counting the reference:
        under ``warm_start`` the earlier trials count, and workers on one storage stop together
        at ``n_trials``. A trial that fails is recorded as failed with its reason and the run goes
        on; a trial whose worker died is failed by the heartbeat and run again by another
        worker (see :mod:`optuna_quant.study.worker`). At the end the best model is stored as an
        artifact of the study.

        Args:
            n_trials: Total trials wanted in the study; ``None`` runs until ``timeout``.
            timeout: Seconds (POT's ``max_minutes * 60``) after which no trial starts.
            show_progress_bar: Show trial k of N, the best result so far and the time left.
            callbacks: More ``optimize`` callbacks, called after each trial.

        Returns:
            The best result, or ``None`` when no trial completed.

        Raises:
            ValueError: If neither ``n_trials`` nor ``timeout`` is a positive number.
            optuna_quant.storages.artifacts.NotWritableError: If the artifact folder cannot be written,
                before any trial.
            optuna_quant.trial.reference.ReferenceMeasurementError: If ``eval_fn`` fails on the reference.

        Example:
            >>> best = study.optimize(n_trials=100, timeout=3600)   # doctest: +SKIP
        """
        if n_trials is None and timeout is None:
            raise ValueError("Give n_trials (max_trials) or timeout (max_minutes), or both.")
        if n_trials is not None and (isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1):
            raise ValueError(f"n_trials (max_trials) must be a positive integer, got {n_trials!r}.")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout (max_minutes) must be positive, got {timeout!r}.")
        with logs.quiet_onnxruntime():
            if self.run_trials:
                check_writable(self.artifact_dir, "artifact_dir", folder=True)
                Worker(
                    self.study,
                    self.storage,
                    self.objective,
                    self.lock,
                    self.heartbeat,
                    n_trials,
                    timeout=timeout,
                    callbacks=[self.figures, *callbacks],
                    show_progress_bar=show_progress_bar,
                ).run()
                self.figures.flush(self.study)
            best = self.best_result
            if best is not None:
                _logger.info(best.summary())
                _logger.info(self.time_report().summary())
                if self.run_trials:
                    upload_model(self.study, self.artifact_dir, self.lock, best.number, lambda: self._model_of(best))
        return best

    @property
    def best_result(self) -> BestResult | None:
        """The best trial (:func:`optuna_quant.trial.results.best_trial`), or ``None`` before any.

        Among the trials within the accuracy target, the highest ``lat_diff`` (ties: the lower
        ``acc_loss``), as POT; when none is within it, the lowest ``acc_loss`` among the trials at
        least as fast as fp32 (among all when none is).
        """
        trial = best_trial(self.study.get_trials(deepcopy=False), self.targets)
        return None if trial is None else BestResult.from_trial(trial, self.targets)

    def time_report(self) -> TimeReport:
        """How long the study took to its best model and in all, and where the time went
        (:mod:`optuna_quant.trial.timing`).

        Example:
            >>> study.time_report().to_best_seconds   # doctest: +SKIP
            41.2
        """
        trials = self.study.get_trials(deepcopy=False)
        return time_report(trials, best_trial(trials, self.targets), records.sensitivity_seconds(self.study))

    @property
    def node_modules(self) -> dict[str, str]:
        """For a study of a ``torch.nn.Module``: the module name of each tunable ONNX node."""
        return records.node_modules(self.study)

    def fallback_modules(self, best: BestResult | None = None) -> list[str]:
        """The layers that the best trial keeps in fp32, by module name where one is known.

        Args:
            best: The best result when the caller has it, as :meth:`optimize` returns it;
                otherwise it is read from the study.
        """
        best = self.best_result if best is None else best
        if best is None:
            return []
        names = self.node_modules
        return [
            names.get(node, node)
            for node in sorted(self.objective.space.to_config(best.params).fallback)
        ]

    def best_model(self) -> onnx.ModelProto:
        """The int8 model of the best trial, rebuilt from cached calibration.

        It is built once per best trial and shared with :meth:`export_best`: copy it before
        changing it.

        Raises:
            RuntimeError: If no trial has completed.
        """
        return self._model_of(self._require_best())

    def _require_best(self) -> BestResult:
        best = self.best_result
        if best is None:
            raise RuntimeError(f"Study {self.study.study_name!r} has no completed trial to export.")
        return best

    def _model_of(self, best: BestResult) -> onnx.ModelProto:
        if self._built is None or self._built[0] != best.number:
            model = self.objective.build(best.params)
            trial = self.study.get_trials(deepcopy=False)[best.number]
            props = {prop.key: prop.value for prop in model.metadata_props}
            props.update({f"optuna_quant.{key}": str(value) for key, value in records.provenance(trial).items()})
            onnx.helper.set_model_props(model, props)
            self._built = (best.number, model)
        return self._built[1]

    def export_best(self, path: str | Path, best: BestResult | None = None) -> BestResult:
        """Write the best int8 model to ``path``; a run that missed a target still exports its best.

        The model is also stored as an artifact of the study (see :mod:`optuna_quant.storages.artifacts`).

        Args:
            path: Where to write the model.
            best: The best result when the caller has it, as :meth:`optimize` returns it;
                otherwise it is read from the study.

        Raises:
            optuna_quant.storages.artifacts.NotWritableError: If ``path`` or the artifact folder cannot be
                written, before the model is built.
            RuntimeError: If no trial has completed.
        """
        path = Path(path)
        check_writable(path, "export path")
        check_writable(self.artifact_dir, "artifact_dir", folder=True)
        if best is None:
            best = self._require_best()
        with logs.quiet_onnxruntime():
            model = self._model_of(best)
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(path))
            upload_model(self.study, self.artifact_dir, self.lock, best.number, lambda: model)
        if best.missed:
            _logger.warning("Exported the best model, which misses the %s target.", " and ".join(best.missed))
        return best
