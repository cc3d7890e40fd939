"""The best model as an artifact of its study: stored once, exported as stored, paths checked first."""

from __future__ import annotations

import onnx
from optuna.artifacts import get_all_artifact_meta
import pytest

from conftest import assert_int8_layers
from optuna_quant.storages.artifacts import model_filename
from optuna_quant.storages.artifacts import NotWritableError


def test_export_path_is_checked_before_the_model_is_built(tmp_path, make_study, monkeypatch) -> None:
    study = make_study()
    study.optimize(n_trials=2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    built = []
    monkeypatch.setattr(study.objective, "build", lambda params: built.append(params))
    with pytest.raises(NotWritableError, match=r"export path '.*a-file/best.onnx' is not writable"):
        study.export_best(blocker / "best.onnx")
    assert built == []


def test_best_model_is_an_artifact_and_loss_is_named(tmp_path, make_study) -> None:
    study = make_study(accuracy_loss=50.0)
    best = study.optimize(n_trials=3)
    assert study.study.metric_names == ["loss"]
    files = [meta.filename for meta in get_all_artifact_meta(study.study)]
    assert files == [model_filename(best.number)]
    study.export_best(tmp_path / "best.onnx")  # the same model: not stored twice
    assert len(get_all_artifact_meta(study.study)) == 1
    assert len(list((tmp_path / "study-artifacts").iterdir())) == 1
    # The exported file is the stored artifact, and the int8 model of the best trial.
    (stored,) = (tmp_path / "study-artifacts").iterdir()
    assert (tmp_path / "best.onnx").read_bytes() == stored.read_bytes()
    assert_int8_layers(onnx.load(str(tmp_path / "best.onnx")), best.params)
