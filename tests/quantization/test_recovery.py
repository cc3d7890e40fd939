"""Recovery transforms as scopes of the search: the space, the quantizer's checked models, a study."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import numpy_helper
import optuna
import pytest

from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
import optuna_quant as oq
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.quantization.recovery import applicable_transforms
from optuna_quant.quantization.recovery import TRANSFORMS
from optuna_quant.trial.space import SCOPES
from optuna_quant.trial.space import SearchSpace


EQUALIZED = QuantConfig(recovery=frozenset({"equalization"}))


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer if init.name.startswith("w")}


def test_the_space_offers_equalization_off_first_where_it_applies() -> None:
    space = SearchSpace.from_model(build_cnn())
    assert space.transforms == ("equalization",)
    assert space.distributions()["equalization"].choices == ("off", "on")
    assert space.to_config(space.default_params()).recovery == frozenset()
    assert space.to_config({**space.default_params(), "equalization": "on"}).recovery == {"equalization"}
    assert SearchSpace.from_dict(space.to_dict()) == space
    assert SearchSpace.from_model(build_cnn(), scopes=iter(SCOPES)) == space  # scopes read twice
    narrowed = space.narrow(space.to_config({**space.default_params(), "equalization": "on"}), ["granularity"])
    assert narrowed.to_config(narrowed.default_params()).recovery == {"equalization"}
    assert SearchSpace.from_dict(narrowed.to_dict()) == narrowed


def test_a_model_where_no_transform_applies_leaves_the_scope_out_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    single = build_cnn(channels=(8,))  # one convolution, then pooling and the classifier
    assert applicable_transforms(single) == ()
    with caplog.at_level(logging.INFO, logger="optuna_quant"):
        space = SearchSpace.from_model(single)
    assert "equalization" not in space.distributions()
    lines = [r.getMessage() for r in caplog.records if "equalization" in r.getMessage()]
    assert lines == ["The equalization scope is left out of the search: it changes nothing in this model."]
    without = SearchSpace.from_model(build_cnn(), scopes=[s for s in SCOPES if s not in TRANSFORMS])
    assert "equalization" not in without.distributions()


def test_a_transformer_gets_no_equalization(bert_path) -> None:
    """Its MatMuls are joined by GELU, softmax and layer norms, none of which commutes with a scale."""
    assert applicable_transforms(onnx.load(str(bert_path))) == ()


def test_under_the_dynamic_approach_equalization_is_inactive() -> None:
    space = SearchSpace(nodes=("conv", "fc"), approaches=("static", "dynamic"), dynamic_nodes=("fc",), transforms=("equalization",))
    assert "equalization" in space.inactive()["approach"]["dynamic"]
    dynamic = {**space.default_params(), "approach": "dynamic"}
    assert space.to_config({**dynamic, "equalization": "on"}) == space.to_config(dynamic)


def test_the_quantizer_builds_the_equalized_model_once_and_quantizes_it() -> None:
    model = build_cnn()
    quantizer = Quantizer(model, to_feeds(calibration_data(model)[:8], model))
    plain, equalized = quantizer.quantize(QuantConfig()), quantizer.quantize(EQUALIZED)
    assert quantizer.transformed(EQUALIZED.recovery) is quantizer.transformed(EQUALIZED.recovery)
    assert list(quantizer.transform_seconds) == ["equalization"]
    # The same graph, other int8 weights: the equalized model's.
    assert [n.op_type for n in plain.graph.node] == [n.op_type for n in equalized.graph.node]
    differ = [name for name, array in _weights(plain).items() if not np.array_equal(array, _weights(equalized)[name])]
    assert differ


class _Doubling:
    """A transform that breaks its contract: it doubles the first convolution's weights."""

    def sites(self, model: onnx.ModelProto) -> tuple[str, ...]:
        return (model.graph.node[0].name,)

    def apply(self, model: onnx.ModelProto) -> onnx.ModelProto:
        changed = onnx.ModelProto()
        changed.CopyFrom(model)
        first = changed.graph.node[0].input[1]
        for init in changed.graph.initializer:
            if init.name == first:
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, first))
        return changed


def test_a_transform_that_changes_the_fp32_outputs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TRANSFORMS, "doubling", _Doubling())
    model = build_cnn()
    quantizer = Quantizer(model, to_feeds(calibration_data(model)[:8], model))
    with pytest.raises(ValueError, match=r"The recovery transform doubling changes what the fp32 model computes: output 'logits' differs"):
        quantizer.quantize(QuantConfig(recovery=frozenset({"doubling"})))
    with pytest.raises(ValueError, match="The recovery transform doubling changes"):  # refused again, not rebuilt
        quantizer.quantize(QuantConfig(recovery=frozenset({"doubling"}), per_channel=False))
    assert quantizer.transform_seconds == {}


def test_a_study_measures_equalization_as_a_trial(cnn_path, calib, agreement, fast_bench, tmp_path) -> None:
    study = oq.create_study(
        cnn_path,
        calib,
        agreement,
        storage=optuna.storages.InMemoryStorage(),
        sampler=optuna.samplers.RandomSampler(seed=0),
        benchmark=fast_bench,
        scopes=["equalization", "granularity"],
        artifact_dir=tmp_path,
        sensitivity=False,
        recipes=False,
    )
    study.optimize(n_trials=1)  # the reference
    study.enqueue_trial({"equalization": "on", "granularity": "per_tensor"})
    study.optimize(n_trials=1)
    reference, equalized = study.trials
    assert reference.params["equalization"] == "off"
    assert equalized.params == {"equalization": "on", "granularity": "per_tensor"}
    assert equalized.state == optuna.trial.TrialState.COMPLETE
    assert list(study.objective.measurer.quantizer.transform_seconds) == ["equalization"]
