"""What a study measures once after its reference and recipes, and how it guides the search.

One worker (:mod:`optuna_quant.study.guiding`) measures, on the calibration data, what each
choice of the space does to the model's outputs and what reverting each layer costs in time
(:func:`optuna_quant.trial.guidance.measure_space`), as much as the study's time affords
(:mod:`optuna_quant.trial.budget`), and stores it with the study. From it:

- every worker gives its sampler a prior over the choices (``sampler.set_prior``, which both of
  optuna-quant's samplers have; other samplers are left alone), through
  :func:`optuna_quant.trial.scoring.choice_scores`, with the choices that fail alone scored 0
  (:mod:`optuna_quant.trial.failures`: the measurement finds those it cannot build);
- start-up trials are queued once: the base combination of the other scopes (the one the prior
  rates highest, :func:`optuna_quant.trial.scoring.base_combination`) with every
  layer int8; the same with each interacting pair of adjacent layers in fp32
  (:mod:`optuna_quant.measure.interactions`); the same with only the layers whose int8 pays on
  its own in int8; then every layer int8 but the most harmful ones, reverted to fp32 one more at
  a time, in order of measured harm per time saved
  (:func:`optuna_quant.trial.scoring.revert_order`), each model once (under the dynamic
  approach, reverting a convolution builds the same model) (:meth:`Guidance.startup_params`); for a
  sampler that tries the prior's likeliest configurations itself (:func:`startup_trials`), only
  the first, where the prior predicts that it misses the accuracy target (:func:`queued_params`);
- once a trial measured that first configuration within the accuracy target against such a
  prediction, the prior shares out the measured loss (:meth:`Guidance.measured_at_base`).

:func:`prior_for_space` gives the prior of any search space, the study's own or one restricted to
some of its parameters or choices.

The samplers know nothing of quantization: they get per-choice scores, as a table replay does.

Example:
    >>> guidance = measure_guidance(measurer, space, 0.02, Targets(accuracy_loss=1.0))   # doctest: +SKIP
    >>> guidance.prior(Targets(accuracy_loss=1.0), space)["layer:conv1"]  # doctest: +SKIP
    {'fp32': 0.91, 'int8': 0.09}
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
import functools
import logging
import math
import time
from typing import Any

import onnx
import optuna
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution

from optuna_quant.measure.interactions import measure_pairs
from optuna_quant.measure.interactions import PairRecovery
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.measurer import Measurer
from optuna_quant.measure.sensitivity import LayerSensitivity
from optuna_quant.measure.sensitivity import measure_kernel_speed
from optuna_quant.measure.sensitivity import measure_scope_errors
from optuna_quant.measure.sensitivity import measure_sensitivity
from optuna_quant.measure.sensitivity import model_outputs
from optuna_quant.measure.sensitivity import REVERT_TIMING
from optuna_quant.measure.sensitivity import ScopeError
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import Feed
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.storages.lock import StudyLock
from optuna_quant.trial import failures
from optuna_quant.trial import records
from optuna_quant.trial.budget import all_int8
from optuna_quant.trial.budget import FULL
from optuna_quant.trial.budget import MEASURED_SAMPLES
from optuna_quant.trial.budget import scope_combinations
from optuna_quant.trial.budget import SensitivityPlan
from optuna_quant.trial.scoring import base_combination
from optuna_quant.trial.scoring import base_loss
from optuna_quant.trial.scoring import choice_scores
from optuna_quant.trial.scoring import interacting_pairs
from optuna_quant.trial.scoring import ranks_kernels
from optuna_quant.trial.scoring import revert_order
from optuna_quant.trial.scoring import scope_errors_within
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.space import SearchSpace


_logger = logging.getLogger("optuna_quant")

MAX_STARTUP_TRIALS = 5
"""Start-up trials queued at most; fewer on a small budget (one per four trials of it)."""


def measure_space(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    space: SearchSpace,
    *,
    n_samples: int = MEASURED_SAMPLES,
    profile_runs: int = 20,
    settings: BenchmarkSettings | None = None,
    revert_timing: BenchmarkSettings | None = REVERT_TIMING,
    timing_feed: Feed | None = None,
    targets: Targets | None = None,
    reference_acc_loss: float | None = None,
    plan: SensitivityPlan = FULL,
) -> tuple[list[ScopeError], dict[str, LayerSensitivity], list[PairRecovery]]:
    """What a study measures once: :func:`measure_combinations` of ``space``'s other parameters
    and of the ``layer`` scope's parameters (``space.units()``: each node, or each group of nodes),
    as much of it as ``plan`` says (:mod:`optuna_quant.trial.budget`).

    The scope errors cost one quantized model per combination (120 for every scope on a model
    with three ``op_types`` choices; one per choice where ``plan`` measures them one at a time),
    plus one per other choice of the parameters of
    :data:`~optuna_quant.trial.budget.ONE_AT_A_TIME`, and the timing of each set of kernels
    (:func:`~optuna_quant.measure.sensitivity.measure_kernel_speed`, a trial's timing as
    ``settings`` say; none when ``revert_timing`` is ``None`` or the reference misses the
    accuracy target, where the prior does not use it); the layers what
    :func:`measure_sensitivity` says; the pairs one model each. The base combination is
    :func:`~optuna_quant.trial.scoring.base_combination` for ``targets`` and the reference's
    ``reference_acc_loss``: without them the lowest-error one.

    Returns:
        The scope errors (the reference's first), the layers' sensitivity and the pairs' joint
        reverts: the measurements :func:`choice_scores` takes.

    Example:
        >>> errors, sens, pairs = measure_space(model, quantizer, feeds, space)  # doctest: +SKIP
        >>> prior = choice_scores(sens, acc_loss=0.03, accuracy_target=0.01, scope_errors=errors, pairs=pairs)  # doctest: +SKIP
    """
    distributions = space.distributions()
    held = plan.held(distributions)
    # Untimed where the prior would not use them: the timing cost 114 s on all-MiniLM-L6-v2.
    ranked = targets is None or reference_acc_loss is None or ranks_kernels(reference_acc_loss, targets.acc_th)
    return measure_combinations(
        fp32_model,
        quantizer,
        feeds,
        scope_combinations(distributions, held),
        functools.partial(all_int8, space),
        space.units() if "layer" in space.scopes and plan.layers else {},  # no layer searched: nothing to guide
        one_at_a_time={name: distributions[name].choices for name in held},
        n_samples=n_samples,
        profile_runs=profile_runs,
        settings=settings,
        revert_timing=revert_timing,
        timing_feed=timing_feed,
        time_kernels=revert_timing is not None and ranked and plan.time_kernels,
        reference_acc_loss=reference_acc_loss,
        accuracy_target=None if targets is None else targets.acc_th,
    )


def measure_combinations(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    combinations: Sequence[Mapping[str, Any]],
    to_config: Callable[[Mapping[str, Any]], QuantConfig],
    units: Mapping[str, tuple[str, ...]],
    *,
    one_at_a_time: Mapping[str, Sequence[Any]] | None = None,
    n_samples: int = 32,
    profile_runs: int = 20,
    settings: BenchmarkSettings | None = None,
    revert_timing: BenchmarkSettings | None = REVERT_TIMING,
    timing_feed: Feed | None = None,
    time_kernels: bool = True,
    reference_acc_loss: float | None = None,
    accuracy_target: float | None = None,
) -> tuple[list[ScopeError], dict[str, LayerSensitivity], list[PairRecovery]]:
    """:func:`measure_scope_errors` of ``combinations`` (each built all-int8 by ``to_config``, the
    reference's first), their kernels' speed where ``time_kernels``
    (:func:`~optuna_quant.measure.sensitivity.measure_kernel_speed`), then
    :func:`measure_sensitivity` of ``units`` and
    :func:`~optuna_quant.measure.interactions.measure_pairs` at the base combination
    (:func:`~optuna_quant.trial.scoring.base_combination`). ``timing_feed`` is what both time;
    the fp32 outputs are computed once for the three. A study's space gives the combinations
    (:func:`measure_space`); a benchmark's table gives its own.

    Returns:
        The scope errors, the sensitivity of ``units`` and the pairs' joint reverts (none of
        the last two without ``units``).
    """
    settings = settings or BenchmarkSettings()
    fp32_outputs = model_outputs(fp32_model, feeds[:n_samples], settings)
    errors = measure_scope_errors(
        fp32_model,
        quantizer,
        feeds,
        combinations,
        to_config,
        one_at_a_time=one_at_a_time,
        n_samples=n_samples,
        settings=settings,
        fp32_outputs=fp32_outputs,
    )
    if time_kernels:
        # A whole model's few per cent between kernels (mtcnn_rnet's per-tensor weights) is below a
        # revert's short timing's resolution: each set of kernels gets a trial's timing.
        feed = feeds[0] if timing_feed is None else timing_feed
        errors = measure_kernel_speed(fp32_model, quantizer, errors, to_config, settings, feed)
    if not units:
        return errors, {}, []
    base = base_combination(errors, acc_loss=reference_acc_loss, accuracy_target=accuracy_target)
    base_config = to_config(base["params"])
    sens = measure_sensitivity(
        fp32_model,
        quantizer,
        feeds,
        units,
        base_config=base_config,
        n_samples=n_samples,
        profile_runs=profile_runs,
        settings=settings,
        revert_timing=revert_timing,
        timing_feed=timing_feed,
        fp32_outputs=fp32_outputs,
    )
    pairs = measure_pairs(
        fp32_model,
        quantizer,
        feeds,
        units,
        sens,
        base_config=base_config,
        n_samples=n_samples,
        settings=settings,
        fp32_outputs=fp32_outputs,
        base_error=base["error"],
    )
    return errors, sens, pairs


@dataclass(frozen=True)
class Guidance:
    """The once-per-study measurement that guides the search.

    Attributes:
        layers: Each searchable layer's sensitivity, measured at the base combination.
        scope_errors: The all-int8 output error of each combination of the other scopes, the
            reference's first.
        reference_acc_loss: The reference trial's ``acc_loss``, which the prior shares out over
            the layers.
        seconds: What measuring it took (a one-off cost of the study).
        pairs: What the joint revert of each ambiguous pair of adjacent layers recovers, at the
            same combination (:func:`~optuna_quant.measure.interactions.measure_pairs`).
        base_acc_loss: The loss a trial measured at :meth:`base_params`, where it replaces the
            predicted one (:meth:`measured_at_base`); not stored, the trials hold it.
        plan: The name of the :class:`~optuna_quant.trial.budget.SensitivityPlan` measured.
    """

    layers: dict[str, LayerSensitivity]
    scope_errors: list[ScopeError]
    reference_acc_loss: float
    seconds: float = 0.0
    pairs: tuple[PairRecovery, ...] = ()
    base_acc_loss: float | None = None
    plan: str = FULL.name

    def prior(self, targets: Targets, space: SearchSpace) -> dict[str, dict[Any, float]]:
        """Per-choice scores for ``sampler.set_prior``, for the parameters of ``space``."""
        return prior_for_space(self, space.distributions(), targets)

    def startup_params(
        self,
        distributions: Mapping[str, CategoricalDistribution],
        n: int,
        targets: Targets,
        build: Callable[[Mapping[str, Any]], Hashable] | None = None,
    ) -> list[dict[str, Any]]:
        """Up to ``n`` configurations to try first, each once: the base combination of
        the other scopes with every layer int8; the same with each interacting pair of adjacent
        layers in fp32 (:func:`~optuna_quant.trial.scoring.interacting_pairs`, counted against
        ``targets``' accuracy target), the largest interaction first; the same with only the layers whose int8 pays on its own in int8
        (:attr:`~optuna_quant.measure.sensitivity.LayerSensitivity.alone_speedup` above 1); then
        every layer int8 but the most harmful ones, reverted to fp32 one more each time.

        The one of the layers whose int8 pays comes from the fp32 end. Reverting one layer of the all-int8 model adds Q/DQ
        around it, so a layer can cost much speed when reverted alone and still slow the fp32
        model when quantized alone; the fastest configuration then keeps such layers in fp32
        together, which no single revert reaches (mtcnn_onet, docs/real-models.md).

        Configurations equal to the default of the space of ``distributions`` (the first
        choice of each: the reference) are left out, and so are those equal to an earlier one,
        compared as ``build`` builds them (:meth:`SearchSpace.to_config`: under the dynamic
        approach, reverting a convolution builds the same model), by their params without it.
        """
        default = _default(distributions)
        base = self.base_params(distributions, targets)
        candidates = [base]
        units = [name.removeprefix(LAYER_PREFIX) for name in distributions if name.startswith(LAYER_PREFIX)]
        if units and self.layers:  # a plan without the layers leaves them to the samplers
            # A pair that recovers together what neither does alone is one no single revert reaches.
            interacting = interacting_pairs(
                self.layers,
                self.pairs,
                acc_loss=self.reference_acc_loss,
                accuracy_target=targets.acc_th,
                scope_errors=self.scope_errors,
            )
            for pair in interacting:
                candidates.append({**base, **{LAYER_PREFIX + unit: "fp32" for unit in pair.layers}})
            slower = [unit for unit in units if (self.layers[unit].alone_speedup or math.inf) <= 1.0]
            # None slower is the base again; all slower, the fp32 model.
            if 0 < len(slower) < len(units):
                candidates.append({**base, **{LAYER_PREFIX + unit: "fp32" for unit in slower}})
            reverted: dict[str, Any] = {}
            # All but one layer at most: every layer in fp32 is the fp32 model again.
            for unit in revert_order(self.layers)[: min(n, len(units) - 1)]:
                reverted[LAYER_PREFIX + unit] = "fp32"
                candidates.append({**base, **reverted})
        key = build or _params_key
        built = {key(default)}
        unique = []
        for params in candidates:
            model = key(params)
            if model not in built:
                built.add(model)
                unique.append(params)
        return unique[:n]

    def base_params(self, distributions: Mapping[str, CategoricalDistribution], targets: Targets) -> dict[str, Any]:
        """The base combination of the other scopes with every layer int8, in the space of
        ``distributions``: where the layers were measured, and the first start-up trial."""
        return {**_default(distributions), **self._base(targets)["params"]}

    def _base(self, targets: Targets) -> ScopeError:
        return base_combination(self.scope_errors, acc_loss=self.reference_acc_loss, accuracy_target=targets.acc_th)

    def predicts_base_misses(self, targets: Targets) -> bool:
        """Whether the loss predicted at the base combination (:func:`~optuna_quant.trial.scoring.base_loss`)
        misses the accuracy target: the prior then has the layers buy accuracy back."""
        predicted = base_loss(self.scope_errors, acc_loss=self.reference_acc_loss, accuracy_target=targets.acc_th)
        return predicted > targets.acc_th

    def measured_at_base(
        self,
        distributions: Mapping[str, CategoricalDistribution],
        targets: Targets,
        trials: Sequence[optuna.trial.FrozenTrial],
    ) -> Guidance:
        """This guidance with the loss that the layers share out as measured at :meth:`base_params`
        (:attr:`base_acc_loss`), where the prediction has it miss the accuracy target and one of
        ``trials`` measured it within; itself otherwise.

        The prior predicts the base's loss from the reference's by the ratio of their output
        errors. On a coarse score the two can differ in sign (all-MiniLM-L6-v2's retrieval rank:
        the reference 2.22 % lost, the base 1.19 % gained, docs/real-models.md), and a prediction
        above the target has the layers buy back accuracy that the base never lost, a revert each,
        which costs the speed that the search is for. The other scopes are still scored by the
        prediction: a loss within the score's noise says nothing of a combination with many times
        the error (static int8 on that model loses 63 %). Only that way round: where the
        prediction meets the target, the measured loss changed the prior for the worse on two of
        seven tables (docs/benchmarks.md, "The base configuration measured").
        """
        if not self.predicts_base_misses(targets):
            return self
        base = self.base_params(distributions, targets)
        loss = next((records.acc_loss(t) for t in trials if records.measured(t) and t.params == base), None)
        return self if loss is None or loss > targets.acc_th else dataclasses.replace(self, base_acc_loss=loss)

    def to_records(self) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """The study records: per-layer sensitivity (as the dashboard reads it) and the rest."""
        layers = {
            node: {**s.to_dict(), "acc_cost": s.acc_cost, "time_saved_ms": s.time_saved_ms}
            for node, s in self.layers.items()
        }
        rest = {
            "scope_errors": self.scope_errors,
            "reference_acc_loss": self.reference_acc_loss,
            "seconds": self.seconds,
            "pairs": [pair.to_dict() for pair in self.pairs],
            "plan": self.plan,
        }
        return layers, rest

    @classmethod
    def from_records(cls, layers: Mapping[str, Mapping[str, Any]], rest: Mapping[str, Any]) -> Guidance:
        """The guidance stored by :meth:`to_records`."""
        return cls(
            layers={node: LayerSensitivity.from_dict(data) for node, data in layers.items()},
            scope_errors=list(rest["scope_errors"]),
            reference_acc_loss=float(rest["reference_acc_loss"]),
            seconds=float(rest.get("seconds", 0.0)),
            # Guidance stored before pairs were measured has none.
            pairs=tuple(PairRecovery.from_dict(pair) for pair in rest.get("pairs", ())),
            plan=str(rest.get("plan", FULL.name)),
        )


def measure_guidance(
    measurer: Measurer, space: SearchSpace, reference_acc_loss: float, targets: Targets, plan: SensitivityPlan = FULL
) -> Guidance:
    """Measure the guidance of ``space`` for ``targets`` on ``measurer``'s prepared model and
    calibration data, as much of it as ``plan`` says."""
    _logger.info(
        "Sensitivity: measuring %s, once per study (plan %r, estimated %.0f s) ...",
        "every scope's choices and every layer" if plan.layers else "the other scopes' choices",
        plan.name,
        plan.estimate_seconds,
    )
    start = time.perf_counter()
    scope_errors, layers, pairs = measure_space(
        measurer.prepared.prepared,
        measurer.quantizer,
        measurer.feeds,
        space,
        settings=measurer.benchmark,
        timing_feed=measurer.latency_feed,
        targets=targets,
        reference_acc_loss=reference_acc_loss,
        plan=plan,
    )
    seconds = time.perf_counter() - start
    _logger.info("Sensitivity: measured %d combinations and %d layers in %.1f s", len(scope_errors), len(layers), seconds)
    return Guidance(layers, scope_errors, reference_acc_loss, seconds, tuple(pairs), plan=plan.name)


def prior_for_space(
    guidance: Guidance,
    search_space: Mapping[str, BaseDistribution],
    targets: Targets,
    *,
    fixed: Mapping[str, Any] | None = None,
) -> dict[str, dict[Any, float]]:
    """The prior of ``search_space`` from a measured sensitivity: per-choice scores for
    ``sampler.set_prior`` of its categorical parameters.

    The space may be the study's own or any part of it: some of its parameters (scopes switched
    off, layers left out) and some of their choices (a table replay, a narrowed space). The
    other scopes are scored over the measured combinations that the space holds, its parameters
    at their choices and the others at ``fixed`` (by default the reference's: a switched-off
    scope keeps it); the reference's loss is carried to the first such combination by the ratio
    of the two errors. Layers are scored as measured, and a pair only where the space searches
    both of its layers.

    Args:
        guidance: The measured sensitivity (:func:`measure_guidance`, or a study's :func:`stored`).
        search_space: Parameter name to distribution, named as the study names them
            (``"layer:<node>"``, ``"granularity"``...); other parameters get no prior.
        targets: The targets: the accuracy target is what a revert's gain is counted in.
        fixed: The choice of each measured parameter that ``search_space`` leaves out.

    Example:
        >>> space = {"layer:conv1": CategoricalDistribution(["int8", "fp32"])}
        >>> prior_for_space(stored(study), space, Targets(accuracy_loss=1.0))  # doctest: +SKIP
        {'layer:conv1': {'int8': 0.2, 'fp32': 0.8}}
    """
    choices = {name: d.choices for name, d in search_space.items() if isinstance(d, CategoricalDistribution)}
    reference = guidance.scope_errors[0] if guidance.scope_errors else None
    errors = scope_errors_within(guidance.scope_errors, choices, {**(reference or {}).get("params", {}), **(fixed or {})})
    acc_loss = guidance.reference_acc_loss
    if errors and reference is not None and errors[0] is not reference and errors[0]["error"] and reference["error"]:
        acc_loss *= errors[0]["error"] / reference["error"]
    measured_errors = [entry for entry in errors if entry["error"] is not None]
    pairs = [pair for pair in guidance.pairs if all(LAYER_PREFIX + layer in choices for layer in pair.layers)]
    scores = choice_scores(
        guidance.layers,
        acc_loss=acc_loss,
        accuracy_target=targets.acc_th,
        scope_errors=errors if measured_errors else (),
        pairs=pairs,
        base_acc_loss=guidance.base_acc_loss,
    )
    return {
        name: {choice: score for choice, score in by_choice.items() if choice in choices[name]}
        for name, by_choice in scores.items()
        if name in choices
    }


def guide_study(
    study: optuna.Study,
    lock: StudyLock,
    measurer: Measurer,
    space: SearchSpace,
    reference_acc_loss: float,
    budget: int | None,
    targets: Targets,
    plan: SensitivityPlan = FULL,
    room: Callable[[], int | None] = lambda: None,
) -> None:
    """Measure and store the guidance, and queue the start-up trials (one worker, once).

    Args:
        study: The study.
        lock: The lock its workers share.
        measurer: Measures the guidance.
        space: The study's search space.
        reference_acc_loss: The reference's ``acc_loss``, which the prior shares out.
        budget: The study's trials in total, if known: at most one start-up trial per four.
        targets: The study's targets: which pairs of layers interact enough to be queued.
        plan: What to measure (:func:`optuna_quant.trial.budget.plan_sensitivity`).
        room: The trials the budget still has room for, read under the lock (``None``: no
            limit): the other workers made trials while this one measured.
    """
    if records.stored_guidance(study) is not None:
        return
    guidance = measure_guidance(measurer, space, reference_acc_loss, targets, plan)
    failures.forbid(study, lock, failures.failing_in_measurement(guidance.scope_errors))
    with lock():
        if records.stored_guidance(study) is not None:
            return  # another worker's retry of the reference stored it meanwhile
        records.store_guidance(study, *guidance.to_records())
        queued = queued_params(guidance, study.sampler, budget, space.distributions(), targets, space.to_config)
        left = room()
        for params in queued if left is None else queued[: max(0, left)]:
            study.enqueue_trial(params, skip_if_exists=True)


def queued_params(
    guidance: Guidance,
    sampler: optuna.samplers.BaseSampler,
    budget: int | None,
    distributions: Mapping[str, CategoricalDistribution],
    targets: Targets,
    build: Callable[[Mapping[str, Any]], Hashable] | None = None,
) -> list[dict[str, Any]]:
    """The start-up trials a study queues for ``sampler`` once ``guidance`` is measured: the first
    :func:`startup_trials` of :meth:`Guidance.startup_params` (each model once, as ``build``
    builds it).

    A sampler that takes none (optuna-quant's GP) still gets the base configuration where the
    prior predicts that it misses the accuracy target (:meth:`Guidance.predicts_base_misses`):
    the prediction would have the layers buy accuracy back, and one trial checks it before the
    sampler acts on it (:meth:`Guidance.measured_at_base`). Not on a budget too small for a
    start-up trial, nor where the base is the reference, measured already.
    """
    n = startup_trials(sampler, budget)
    if n > 0:
        return guidance.startup_params(distributions, n, targets, build)
    if startup_trials(None, budget) == 0 or not guidance.predicts_base_misses(targets):
        return []
    base = guidance.base_params(distributions, targets)
    key = build or _params_key
    return [] if key(base) == key(_default(distributions)) else [base]


def _params_key(params: Mapping[str, Any]) -> Hashable:
    """``params`` as a set member: configurations compared by their parameters."""
    return tuple(sorted(params.items()))


def _default(distributions: Mapping[str, CategoricalDistribution]) -> dict[str, Any]:
    """The first choice of each parameter: the reference's configuration."""
    return {name: dist.choices[0] for name, dist in distributions.items()}


def startup_trials(sampler: optuna.samplers.BaseSampler | None, budget: int | None) -> int:
    """How many start-up trials a study queues for ``sampler``: :data:`MAX_STARTUP_TRIALS`, one
    per four trials of a ``budget``, at most the sampler's ``max_startup_trials`` (no cap for
    ``None``).

    optuna-quant's GP takes none: weighted by the prior, its acquisition tries the prior's
    likeliest configurations itself, and the queue, even its first trial alone, only delays it
    (docs/benchmarks.md, "The start-up queue"; but see :func:`queued_params`). Its TPE draws its
    first trials at random from the prior, and Optuna's samplers know no prior: the queue gives
    them the configurations the measurement points at.

    Example:
        >>> from optuna_quant.samplers import DiscreteGPSampler, TPESampler
        >>> startup_trials(TPESampler(), 40), startup_trials(TPESampler(), 9), startup_trials(DiscreteGPSampler(), 40)
        (5, 2, 0)
    """
    queued = MAX_STARTUP_TRIALS if budget is None else min(MAX_STARTUP_TRIALS, (budget - 1) // 4)
    most = getattr(sampler, "max_startup_trials", None)
    return queued if most is None else min(queued, most)


def stored(study: optuna.Study) -> Guidance | None:
    """The study's guidance, or ``None`` before it is measured (or in a study without it)."""
    found = records.stored_guidance(study)
    return None if found is None else Guidance.from_records(*found)


def set_prior(
    sampler: optuna.samplers.BaseSampler,
    study: optuna.Study,
    targets: Targets,
    space: SearchSpace,
    guided: bool = True,
) -> None:
    """Give ``sampler`` the study's prior, where it takes one (Optuna's samplers do not): the
    measured one once stored (when ``guided``), with every choice the study learnt to fail alone
    scored 0, never, and the pairs it learnt to fail together as ``sampler.set_forbidden``
    (:mod:`optuna_quant.trial.failures`). Nothing while the study has none of them.

    Call it before each trial: another worker may have learnt a failing choice meanwhile.
    """
    if not hasattr(sampler, "set_prior"):
        return
    guidance = stored(study) if guided else None
    if guidance is not None and guidance.predicts_base_misses(targets):
        # Only then can a trial change the prior: no read of every trial before each one otherwise.
        guidance = guidance.measured_at_base(space.distributions(), targets, study.get_trials(deepcopy=False))
    prior = {} if guidance is None else guidance.prior(targets, space)
    together = []
    for forbidden in records.forbidden_choices(study):
        if forbidden.together:
            together.append(forbidden.choices)
        else:
            prior.setdefault(forbidden.param, {})[forbidden.choice] = 0.0
    if prior:
        sampler.set_prior(prior)
    if together and hasattr(sampler, "set_forbidden"):
        sampler.set_forbidden(together)
