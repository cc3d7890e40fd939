"""How much of the sensitivity measurement a study can afford: a share of its budget in time.

The measurement guides the search (:mod:`optuna_quant.trial.guidance`), but the trials it holds
back are what a user waits for. A study spends on it at most :data:`SENSITIVITY_SHARE` of its
planned time: ``n_trials`` times the mean time of the trials run so far (the reference and the
recipes), or what is left of ``timeout`` if that is less. Within that, the most thorough plan
whose estimate fits is measured, in this order:

1. every combination of the other scopes, their kernels timed, every layer (``"full"``);
2. each other scope's choices one at a time from the reference, kernels timed, every layer;
3. the same without timing the kernels (a trial's timing each, the dearest part where timing is
   slow or noisy);
4. the other scopes' choices one at a time, kernels timed, no layer (the layers are then left to
   the samplers);
5. the same without timing the kernels;
6. nothing: the search goes on unguided.

The estimate counts the models each plan builds, times the measured cost of one (quantized and
run on the measurement's samples), a trial's timing per set of kernels, and each calibration
that no trial ran yet (:func:`calibration_estimate`).

Example:
    >>> space = SearchSpace(nodes=("conv", "fc"), scopes=frozenset({"layer", "granularity"}))
    >>> plan_sensitivity(space, model_seconds=0.1, latency_seconds=1.0, budget_seconds=60).name
    'full'
    >>> print(plan_sensitivity(space, model_seconds=0.1, latency_seconds=1.0, budget_seconds=0.05))
    None
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
import itertools
import math
import time
from typing import Any

from optuna.distributions import CategoricalDistribution

from optuna_quant.measure.interactions import MAX_PAIRS
from optuna_quant.measure.measurer import Measurer
from optuna_quant.measure.sensitivity import model_outputs
from optuna_quant.measure.sensitivity import REVERT_TIMING
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import RANGE_ESTIMATORS
from optuna_quant.quantization.quantize import calibration_family
from optuna_quant.quantization.recovery import TRANSFORMS
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.space import SearchSpace


SENSITIVITY_SHARE = 0.25
"""The share of a study's planned time that its sensitivity measurement may take."""
PERCENTILE_COST = 1.5
"""A Percentile calibration's cost in MinMax calibrations (histograms collected over its ranges)."""
ENTROPY_SECONDS_PER_TENSOR = 0.07
"""An Entropy calibration's estimated cost per calibrated tensor, its threshold search included
(docs/benchmarks.md, "Seconds a study spends besides its trials")."""
MEASURED_SAMPLES = 32
"""Calibration samples on which the sensitivity measures each model's output error."""

ONE_AT_A_TIME = ("weight_type", *TRANSFORMS)
"""Parameters whose choices every plan measures one at a time, at the lowest-error combination of
the others: ``weight_type``'s three choices would triple the models measured, for a choice that
depends on the CPU's kernels more than on the other scopes; a recovery transform's ``on`` would
double them and calibrate every range estimator again on the transformed model."""


def scope_combinations(
    distributions: Mapping[str, CategoricalDistribution], held: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Every combination of the choices of the parameters other than layers, the first choices
    first; a parameter of ``held`` at its first choice.

    Example:
        >>> from optuna.distributions import CategoricalDistribution as C
        >>> scope_combinations({"layer:a": C(["int8", "fp32"]), "granularity": C(["per_channel", "per_tensor"])})
        [{'granularity': 'per_channel'}, {'granularity': 'per_tensor'}]
        >>> both = {"granularity": C(["per_channel", "per_tensor"]), "weight_type": C(["int8", "int7"])}
        >>> scope_combinations(both, ["weight_type"])
        [{'granularity': 'per_channel', 'weight_type': 'int8'}, {'granularity': 'per_tensor', 'weight_type': 'int8'}]
    """
    names = [name for name in distributions if not name.startswith(LAYER_PREFIX)]
    choices = (distributions[name].choices[:1] if name in held else distributions[name].choices for name in names)
    product = itertools.product(*choices)
    return [dict(zip(names, values)) for values in product]


def all_int8(space: SearchSpace, params: Mapping[str, Any]) -> QuantConfig:
    """The configuration of ``space`` with the other scopes' ``params`` and every layer int8."""
    return space.to_config({**space.default_params(), **params})


@dataclass(frozen=True)
class SensitivityPlan:
    """What a sensitivity measurement measures.

    Attributes:
        name: ``"full"``, ``"one_at_a_time"``, ``"one_at_a_time_untimed"``, ``"scopes"`` or
            ``"scopes_untimed"``.
        every_combination: Measure every combination of the other scopes' choices; otherwise
            each choice alone, changed from the reference.
        time_kernels: Time each set of kernels that the combinations build.
        layers: Measure each layer (reverted alone, alone in int8, timed).
        estimate_seconds: What the plan was estimated to take.
    """

    name: str
    every_combination: bool = True
    time_kernels: bool = True
    layers: bool = True
    estimate_seconds: float = 0.0

    def held(self, distributions: Mapping[str, Any]) -> list[str]:
        """The parameters measured one at a time rather than in every combination."""
        names = [name for name in distributions if not name.startswith(LAYER_PREFIX)]
        return [name for name in names if name in ONE_AT_A_TIME or not self.every_combination]


FULL = SensitivityPlan("full")
"""Everything, whatever it costs (``create_study(sensitivity="full")``)."""
PLANS: tuple[SensitivityPlan, ...] = (
    FULL,
    SensitivityPlan("one_at_a_time", every_combination=False),
    SensitivityPlan("one_at_a_time_untimed", every_combination=False, time_kernels=False),
    SensitivityPlan("scopes", every_combination=False, layers=False),
    SensitivityPlan("scopes_untimed", every_combination=False, time_kernels=False, layers=False),
)
"""The plans, most thorough first (not always the dearest first: the layers against the kernels'
timing depends on the model)."""


def planned_seconds(
    trial_seconds: Sequence[float], n_trials: int | None, seconds_left: float | None
) -> float:
    """The time a study plans to run: ``n_trials`` trials of the mean of ``trial_seconds``, or
    ``seconds_left`` of its timeout where that is less.

    Example:
        >>> planned_seconds([2.0, 4.0], n_trials=40, seconds_left=None)
        120.0
        >>> planned_seconds([2.0, 4.0], n_trials=40, seconds_left=30.0)
        30.0
    """
    by_trials = math.inf
    if n_trials is not None and trial_seconds:
        by_trials = n_trials * sum(trial_seconds) / len(trial_seconds)
    return min(by_trials, math.inf if seconds_left is None else max(0.0, seconds_left))


def plan_sensitivity(
    space: SearchSpace,
    *,
    model_seconds: float,
    latency_seconds: float,
    budget_seconds: float,
    calibration_seconds: Callable[[str], float] = lambda family: 0.0,
) -> SensitivityPlan | None:
    """The most thorough plan of :data:`PLANS` whose estimate fits ``budget_seconds``, or ``None``.

    Args:
        space: The study's search space.
        model_seconds: What one model's output error costs: quantizing it and running it on the
            measurement's samples.
        latency_seconds: What one trial's timing costs (each set of kernels gets one).
        budget_seconds: What the measurement may take.
        calibration_seconds: What a calibration family (``"Entropy"``...) not run yet costs.
    """
    for plan in PLANS:
        estimate = estimate_seconds(
            space,
            plan,
            model_seconds=model_seconds,
            latency_seconds=latency_seconds,
            calibration_seconds=calibration_seconds,
        )
        if estimate <= budget_seconds:
            return replace(plan, estimate_seconds=estimate)
    return None


def estimate_seconds(
    space: SearchSpace,
    plan: SensitivityPlan,
    *,
    model_seconds: float,
    latency_seconds: float,
    calibration_seconds: Callable[[str], float] = lambda family: 0.0,
) -> float:
    """What ``plan`` is estimated to take on ``space`` (see the module's docstring)."""
    configs = combination_configs(space, plan)
    families = {calibration_family(config.range_estimator) for config in configs if config.approach == "static"}
    seconds = len(configs) * model_seconds + sum(calibration_seconds(family) for family in families)
    if plan.time_kernels:
        kernels = {replace(config, range_estimator=RANGE_ESTIMATORS[0]) for config in configs}
        seconds += len(kernels) * latency_seconds
    units = len(space.units()) if plan.layers and "layer" in space.scopes else 0
    if units:
        # 2 n + 2 output errors, 2 n short paired timings (a session each), the pairs.
        reverts = 2 * units * (REVERT_TIMING.min_seconds + model_seconds / 2)
        seconds += (2 * units + 2 + MAX_PAIRS) * model_seconds + reverts
    return seconds


def combination_configs(space: SearchSpace, plan: SensitivityPlan) -> set[QuantConfig]:
    """The distinct all-int8 configurations whose output error ``plan`` measures on ``space``
    (those measured one at a time counted from the reference, their upper bound)."""
    distributions = space.distributions()
    held = plan.held(distributions)
    configs = {all_int8(space, combination) for combination in scope_combinations(distributions, held)}
    first = space.default_params()
    for name in held:
        for choice in distributions[name].choices[1:]:
            configs.add(all_int8(space, {**first, name: choice}))
    return configs


def model_seconds(measurer: Measurer, config: QuantConfig) -> float:
    """What one model's output error costs on ``measurer``: ``config`` quantized (from cached
    calibration) and run on :data:`MEASURED_SAMPLES` samples, timed once."""
    start = time.perf_counter()
    model_outputs(measurer.quantizer.quantize(config), measurer.feeds[:MEASURED_SAMPLES], measurer.benchmark)
    return time.perf_counter() - start


def calibration_estimate(measurer: Measurer) -> Callable[[str], float]:
    """What each calibration family costs on ``measurer``: nothing once run; Percentile
    :data:`PERCENTILE_COST` times MinMax's; Entropy :data:`ENTROPY_SECONDS_PER_TENSOR` per tensor
    that MinMax calibrated (MinMax is run here if no trial ran it: every static plan needs it)."""
    quantizer = measurer.quantizer
    tensors = len(quantizer.ranges("minmax").data)
    done = dict(quantizer.calibration_seconds)
    estimates = {"Percentile": PERCENTILE_COST * done["MinMax"], "Entropy": ENTROPY_SECONDS_PER_TENSOR * tensors}
    return lambda family: 0.0 if family in done else estimates[family]
