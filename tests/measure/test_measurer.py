"""The fp32 model scored beside its preparation, and loaded and checked once."""

from __future__ import annotations

from collections.abc import Callable
import threading

import numpy as np
import onnx

from optuna_quant.measure.evaluate import Top1Accuracy
from optuna_quant.measure.measurer import FP32_THREAD
from optuna_quant.measure.measurer import Measurer
from optuna_quant.quantization.model_io import load_checked
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.trial.records import FP32_ACCURACY_KEY


def _recording(agreement: Top1Accuracy) -> tuple[list[str], Callable[[object], float]]:
    """``agreement``, and the names of the threads it was called from, in order."""
    threads: list[str] = []

    def eval_fn(session: object) -> float:
        threads.append(threading.current_thread().name)
        return agreement(session)

    return threads, eval_fn


def test_a_new_study_scores_fp32_once_in_a_thread_beside_preparation(make_study, cnn_path, calib, agreement) -> None:
    threads, eval_fn = _recording(agreement)
    study = make_study(eval_fn=eval_fn)
    study.optimize(n_trials=2)
    assert threads[0].startswith(FP32_THREAD)  # the fp32 score, before any int8 model's
    assert sum(name.startswith(FP32_THREAD) for name in threads) == 1
    assert len(threads) == 1 + len(study.trials)  # and never again: one int8 score a trial
    # The same score as the fp32 model scored in the caller's thread.
    assert study.user_attrs[FP32_ACCURACY_KEY] == Measurer(cnn_path, calib, agreement).baseline()


def test_a_study_whose_reference_is_stored_scores_no_fp32(make_study, agreement) -> None:
    make_study().optimize(n_trials=1)
    threads, eval_fn = _recording(agreement)
    study = make_study(eval_fn=eval_fn, trials_load_method="warm_start")
    study.optimize(n_trials=2)
    assert len(study.trials) == 2
    assert threads == [threading.current_thread().name]  # the new trial's int8 score alone


def test_a_stored_score_is_adopted_once_the_one_beside_preparation_ended(cnn_path, calib) -> None:
    release = threading.Event()

    def blocked(session: object) -> float:
        release.wait()
        return 0.5

    measurer = Measurer(cnn_path, calib, blocked, fp32_alongside=True)
    adopting = threading.Thread(target=measurer.adopt_baseline, args=(0.9,))
    adopting.start()
    adopting.join(timeout=0.5)
    assert adopting.is_alive()  # nothing is timed while the fp32 model is being scored
    release.set()
    adopting.join(timeout=60)
    assert not adopting.is_alive() and measurer.baseline() == 0.9


def test_given_fp32_accuracy_starts_no_score(cnn_path, calib) -> None:
    def never(session: object) -> float:
        raise AssertionError("the fp32 model was scored although its accuracy was given")

    assert Measurer(cnn_path, calib, never, fp32_accuracy=0.75, fp32_alongside=True).baseline() == 0.75


def test_a_loaded_model_is_prepared_without_a_copy_and_the_prepared_model_is_its_own(cnn_path, calib) -> None:
    loaded = load_checked(cnn_path)
    assert onnx.ModelProto.FromString(loaded.serialized) == loaded.proto
    feeds = [{"input": np.asarray(x, np.float32)} for x in calib[:4]]
    for pre_process in (True, False):
        prepared = prepare_model(loaded, feeds, pre_process=pre_process)
        assert prepared.original is loaded.proto
        assert prepared.prepared is not prepared.original  # the quantizer's to change
