"""The stored records: what each writer stores, its reader reads back, and when a study is refused."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import Targets
from optuna_quant.trial import records
from optuna_quant.trial.space import SearchSpace


SPACE = SearchSpace(nodes=("conv", "fc"), scopes=frozenset({"layer", "granularity"}))
TARGETS = Targets(accuracy_loss=1.0, latency_reduce=1.5)
MEASURED = {"acc_loss": 0.004, "lat_diff": 1.8, "accuracy": 0.97, "int8_latency_ms": 1.2, "loss": -3.5}


def _share(study: optuna.Study, **changes: object) -> SearchSpace:
    kwargs: dict = {"space": SPACE, "fingerprint": "abc", "targets": TARGETS, "int8_class": "x86-vnni", **changes}
    return records.share_records(study, **kwargs)


def test_shared_records_are_read_back() -> None:
    study = optuna.create_study()
    assert _share(study, node_modules={"conv": "features.0"}) == SPACE
    assert records.stored_space(study) == SPACE
    assert records.stored_targets(study) == TARGETS
    assert records.node_modules(study) == {"conv": "features.0"}
    assert study.user_attrs[records.MODEL_KEY] == "abc"
    assert _share(study) == SPACE  # a second worker with the same records joins


def test_the_stored_space_wins_over_an_equal_one() -> None:
    study = optuna.create_study()
    narrowed = SPACE.narrow(SPACE.to_config({"layer:conv": "fp32", "layer:fc": "int8", "granularity": "per_tensor"}),
                            SPACE.scopes)
    _share(study, space=narrowed)
    # The same parameters and choices: a worker that cannot find the narrowed base joins on it.
    assert _share(study) == narrowed and _share(study).base != SPACE.base


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"fingerprint": "other"}, r"another model sha256 \('abc', here 'other'\)"),
        ({"targets": Targets(accuracy_loss=2.0, latency_reduce=1.5)}, "another targets"),
        ({"space": SearchSpace(nodes=("conv",), scopes=frozenset({"layer", "granularity"}))},
         r"another search space: parameter\(s\) \['layer:fc'\] differ"),
    ],
)
def test_share_records_refuses_another_study_and_writes_nothing(changes: dict, message: str) -> None:
    study = optuna.create_study()
    _share(study)
    before = dict(study.user_attrs)
    with pytest.raises(ValueError, match=message):
        _share(study, node_modules={"conv": "features.0"}, **changes)
    assert study.user_attrs == before  # checked before anything was written


def test_a_study_made_outside_optuna_quant_has_no_records() -> None:
    study = optuna.create_study(study_name="plain")
    with pytest.raises(ValueError, match="Study 'plain' holds no optuna-quant search space"):
        records.stored_space(study)
    assert records.stored_targets(study) is None
    assert records.node_modules(study) == {}
    assert records.reference_scaling(study) is None and records.stored_fp32_accuracy(study) is None
    assert records.stored_guidance(study) is None and records.stored_sensitivity(study) is None


def test_the_first_reference_stored_wins() -> None:
    study = optuna.create_study()
    first = LossScaling.from_reference(0.02, 2.0, TARGETS)
    records.store_reference(study, 0.9, 3.0, first)
    records.store_reference(study, 0.5, 9.0, LossScaling.from_reference(0.1, 1.5, TARGETS))
    assert records.reference_scaling(study) == (0.9, first)
    assert records.stored_fp32_accuracy(study) == 0.9
    assert study.user_attrs[records.FP32_LATENCY_KEY] == 3.0


def test_guidance_is_read_back_once_both_parts_are_stored() -> None:
    study = optuna.create_study()
    sensitivity = {"conv": {"acc_cost": 0.02, "time_saved_ms": 0.1}}
    study.set_user_attr(records.SENSITIVITY_KEY, sensitivity)  # a study stored by an earlier release
    assert records.stored_guidance(study) is None and records.stored_sensitivity(study) == sensitivity
    records.store_guidance(study, sensitivity, {"reference_acc_loss": 0.02})
    assert records.stored_guidance(study) == (sensitivity, {"reference_acc_loss": 0.02})


def test_a_queued_reference_is_one_until_unmarked() -> None:
    study = optuna.create_study()
    records.enqueue_reference(study, {"x": "a"})
    trial = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    assert records.is_reference(trial) and trial.params == {"x": "a"}
    records.unmark_reference(trial)
    assert not records.is_reference(trial)
    assert not records.is_reference(optuna.trial.create_trial(value=0.0))


def test_a_reference_measured_outside_any_trial_is_a_trial_of_the_study() -> None:
    study = optuna.create_study()
    distributions = SPACE.distributions()
    records.reference_trial(
        study, SPACE.default_params(), distributions, [-3.5], MEASURED, TARGETS.constraints(0.004, 1.8)
    )
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE and trial.value == -3.5 and trial.params == SPACE.default_params()
    assert records.is_reference(trial) and trial.user_attrs[records.WORKER_KEY] == records.WORKER
    assert (records.acc_loss(trial), records.lat_diff(trial), records.loss(trial)) == (0.004, 1.8, -3.5)
    assert trial.constraints == pytest.approx({"accuracy": 0.004 - 0.01, "latency": 1.5 - 1.8})


def test_a_result_is_read_back_and_a_copy_names_its_source() -> None:
    study = optuna.create_study()
    first = study.ask()
    records.start_trial(first, "x86-vnni", "1.32.0")
    records.claim(first)
    first.set_user_attr(records.REFERENCE_KEY, True)  # a run key, as the worker and the claim: never copied
    records.record_result(first, MEASURED, {"accuracy": -0.006, "latency": -0.3})
    study.tell(first, -3.5)
    copy = study.ask()
    previous = study.trials[0]
    records.copy_result(copy, previous)
    study.tell(copy, -3.5)
    measured, copied = study.trials
    assert records.measured(measured) and records.is_measuring(measured)
    assert measured.user_attrs[records.WORKER_KEY] == records.WORKER
    assert (records.acc_loss(measured), records.lat_diff(measured)) == (0.004, 1.8)
    assert (records.int8_accuracy(measured), records.loss(measured)) == (0.97, -3.5)
    assert measured.constraints == {"accuracy": -0.006, "latency": -0.3}
    # The copy holds the measurement and the constraints, not who ran the first trial.
    assert copied.user_attrs == {**MEASURED, records.DUPLICATE_KEY: 0}
    assert copied.constraints == measured.constraints
    assert records.measured(copied) and not records.is_measuring(copied) and not records.is_reference(copied)


def test_a_retry_does_not_measure_on_the_claim_it_copied() -> None:
    # A retried trial copies the user attrs of the failed one, whose claim names its own number.
    retry = optuna.trial.create_trial(state=TrialState.RUNNING, user_attrs={records.MEASURING_KEY: 3})
    retry.number = 7
    assert not records.is_measuring(retry)


def test_a_trial_without_measurement_reads_as_none() -> None:
    trial = optuna.trial.create_trial(value=1.0)
    assert not records.measured(trial)
    assert records.int8_accuracy(trial) is None and records.loss(trial) is None
    with pytest.raises(KeyError):
        records.acc_loss(trial)


def test_a_failure_keeps_its_reason() -> None:
    study = optuna.create_study()
    trial = study.ask()
    records.record_failure(trial, KeyError("labels"))
    study.tell(trial, state=TrialState.FAIL)
    assert study.trials[0].user_attrs[records.FAIL_REASON_KEY] == "KeyError: 'labels'"


def test_a_worker_of_another_int8_class_is_refused_and_nothing_is_written() -> None:
    study = optuna.create_study(study_name="tuned-on-vnni")
    _share(study)
    assert records.stored_int8_class(study) == "x86-vnni"
    before = dict(study.user_attrs)
    with pytest.raises(ValueError, match=r"Study 'tuned-on-vnni' is tuned on CPUs of int8 class 'x86-vnni'; this "
                                         r"machine's is 'x86-avx2'.*another study_name, or fine_tune"):
        _share(study, int8_class="x86-avx2")
    assert study.user_attrs == before
    records.check_int8_class(study, "x86-vnni")  # the same class joins


def test_each_trial_names_the_int8_class_and_onnxruntime_that_ran_it() -> None:
    study = optuna.create_study()
    trial = study.ask()
    records.start_trial(trial, "x86-avx2", "1.32.0")
    frozen = study.tell(trial, 1.0)
    assert records.worker_int8_class(frozen) == "x86-avx2"
    assert frozen.user_attrs[records.ONNXRUNTIME_KEY] == "1.32.0"
