"""The approach scope: dynamic int8 on a BERT as ``torch.onnx.export`` gives it, measured, deduplicated
and exported like any configuration."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest

import optuna_quant as oq
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.samplers._discrete import DiscreteSpace
from optuna_quant.samplers._discrete import Excluded
from optuna_quant.trial.space import SearchSpace


@pytest.fixture(scope="module")
def bert_space(bert_path, bert_feeds) -> SearchSpace:
    return SearchSpace.from_model(prepare_model(bert_path, bert_feeds).prepared)


def _integer_ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.op_type in {"DynamicQuantizeLinear", "MatMulInteger"})


def test_dynamic_comes_first_on_a_transformer_and_not_at_all_on_a_cnn(bert_space, cnn) -> None:
    assert bert_space.approaches == ("dynamic", "static")
    assert bert_space.default_params()["approach"] == "dynamic"
    assert bert_space.to_config(bert_space.default_params()).approach == "dynamic"
    # The 12 MatMuls with constant weights; the 4 of two activations (Q K^T, scores V) stay fp32 in dynamic.
    assert (len(bert_space.nodes), len(bert_space.dynamic_nodes)) == (16, 12)
    cnn_space = SearchSpace.from_model(load_model(cnn))
    assert cnn_space.approaches == ("static",) and "approach" not in cnn_space.distributions()
    assert cnn_space.default_params()["granularity"] == "per_channel" and cnn_space.base.per_channel


def test_the_transformer_reference_is_quantize_dynamic_defaults_and_stored_spaces_keep_theirs(bert_space) -> None:
    # quantize_dynamic's per tensor, also with the granularity scope off; per channel is the next choice.
    assert bert_space.granularities == ("per_tensor", "per_channel") and not bert_space.base.per_channel
    assert not bert_space.to_config(bert_space.default_params()).per_channel
    assert SearchSpace.from_dict(bert_space.to_dict()) == bert_space
    # A space stored before the granularity order was: per channel first, as its base says.
    stored = {key: value for key, value in bert_space.to_dict().items() if key != "granularities"}
    stored["base"] = {**stored["base"], "per_channel": True}
    older = SearchSpace.from_dict(stored)
    assert older.granularities == ("per_channel", "per_tensor") and older.to_config(older.default_params()).per_channel
    with pytest.raises(ValueError, match="granularity choices"):
        SearchSpace(nodes=("fc",), granularities=("per_tensor",))


def test_params_that_differ_only_where_the_approach_does_not_look_are_one_configuration(bert_space) -> None:
    dynamic = {**bert_space.default_params(), "approach": "dynamic"}
    ignored = {"range_estimator": "entropy", "activation_mode": "symmetric", "op_types": "all"}
    activation_matmul = next(n for n in bert_space.nodes if n not in bert_space.dynamic_nodes)
    same = {**dynamic, **ignored, f"layer:{activation_matmul}": "fp32"}
    assert bert_space.to_config(same) == bert_space.to_config(dynamic)
    # What dynamic reads makes another configuration; under static every scope does.
    for name, choice in [("granularity", "per_channel"), ("weight_mode", "asymmetric"), (f"layer:{bert_space.dynamic_nodes[0]}", "fp32")]:
        assert bert_space.to_config({**dynamic, name: choice}) != bert_space.to_config(dynamic), name
    static = {**dynamic, "approach": "static"}
    for name, choice in {**ignored, f"layer:{activation_matmul}": "fp32"}.items():
        assert bert_space.to_config({**static, name: choice}) != bert_space.to_config(static), name


def test_dynamic_models_follow_granularity_weight_mode_and_fallback(bert_path, bert_feeds, bert_agreement, bert_space) -> None:
    quantizer = Quantizer(prepare_model(bert_path, bert_feeds).prepared, bert_feeds)
    kept = bert_space.dynamic_nodes[0]
    for per_channel in (True, False):
        for weight_symmetric in (True, False):
            config = QuantConfig(
                approach="dynamic", per_channel=per_channel, weight_symmetric=weight_symmetric, fallback=frozenset({kept})
            )
            int8 = quantizer.quantize(config)
            onnx.checker.check_model(int8)
            assert _integer_ops(int8)["MatMulInteger"] == len(bert_space.dynamic_nodes) - 1
            assert kept in {n.name for n in int8.graph.node if n.op_type == "MatMul"}
            inits = {i.name: onnx.numpy_helper.to_array(i) for i in int8.graph.initializer}
            weights = [inits[n.input[1]] for n in int8.graph.node if n.op_type == "MatMulInteger"]
            zero_points = [inits[n.input[3]] for n in int8.graph.node if n.op_type == "MatMulInteger"]
            assert all(w.dtype == np.int8 for w in weights)
            assert all(z.size > 1 for z in zero_points) == per_channel
            assert all(not z.any() for z in zero_points) == weight_symmetric
            session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
            assert bert_agreement(session) > 0.99
    assert quantizer.calibration_seconds == {}  # dynamic needs no calibration


def _bert_study(tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench, **kwargs) -> oq.QuantStudy:
    kwargs.setdefault("sampler", "random")
    return oq.create_study(
        bert_path, bert_feeds, bert_agreement, seed=0, storage=f"sqlite:///{tmp_path}/study.db",
        benchmark=fast_bench, sensitivity=False, **kwargs
    )


@pytest.mark.slow
def test_a_bert_study_copies_params_that_differ_only_where_dynamic_does_not_look(
    tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench, caplog
) -> None:
    study = _bert_study(tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench)
    first = {**study.objective.space.default_params(), "granularity": "per_tensor"}
    study.enqueue_trial(first)
    study.enqueue_trial({**first, "range_estimator": "percentile_99.9", "activation_mode": "symmetric"})
    study.optimize(n_trials=3)
    reference = next(t for t in study.trials if t.user_attrs.get("reference"))
    assert reference.params["approach"] == "dynamic"
    measured, copied = study.trials[0], study.trials[1]
    assert copied.user_attrs["duplicate_of"] == measured.number and copied.value == measured.value
    assert "Params already evaluated" in caplog.text


@pytest.mark.slow
def test_the_best_dynamic_model_is_exported_checked_and_runs(
    tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench
) -> None:
    # The approach scope off: every configuration is the model's reference approach, dynamic.
    study = _bert_study(tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench, scopes=["granularity", "mode"])
    best = study.optimize(n_trials=3)
    path = tmp_path / "bert.int8.onnx"
    study.export_best(path, best)
    exported = onnx.load(str(path))
    onnx.checker.check_model(exported)
    assert _integer_ops(exported)["MatMulInteger"] == len(study.objective.space.dynamic_nodes)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert all(np.isfinite(a).all() for a in session.run(None, bert_feeds[0]))
    assert bert_agreement(session) == pytest.approx(1.0 - best.acc_loss)


def test_the_inactive_parameters_are_exactly_those_that_build_the_same_model(bert_space) -> None:
    # Two params are one configuration for the samplers (Excluded.canonical) exactly when
    # to_config builds one model of them.
    space = DiscreteSpace(bert_space.distributions())
    excluded = Excluded(inactive=space.encode_inactive(bert_space.inactive()))
    ignored = bert_space.inactive()["approach"]["dynamic"]
    assert {"range_estimator", "activation_mode", "op_types"} <= set(ignored)
    assert sorted(n for n in ignored if n.startswith("layer:")) == sorted(
        f"layer:{n}" for n in bert_space.nodes if n not in bert_space.dynamic_nodes
    )
    rng = np.random.RandomState(0)
    configs = [tuple(row) for row in space.random_configs(rng, 300).tolist()]
    # Pairs that differ in one parameter only: random pairs would almost never build one model.
    pairs = [
        (c, tuple((v + 1) % n if j == k else v for j, (v, n) in enumerate(zip(c, space.n_choices))))
        for c in configs
        for k in rng.randint(space.dim, size=3)
    ]
    same = [space.decode(a) for a, b in pairs if excluded.canonical(a) == excluded.canonical(b)]
    for a, b in pairs:
        built_alike = bert_space.to_config(space.decode(a)) == bert_space.to_config(space.decode(b))
        assert built_alike == (excluded.canonical(a) == excluded.canonical(b)), (space.decode(a), space.decode(b))
    assert same and all(p["approach"] == "dynamic" for p in same)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_our_samplers_do_not_propose_what_dynamic_ignores_once_its_model_was_measured(
    tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench, sampler
) -> None:
    # Dynamic with four models (granularity x weight mode), static with 40: twelve trials, no copy.
    study = _bert_study(
        tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench, sampler=sampler,
        scopes=["approach", "range_estimator", "granularity", "mode"],
    )
    study.optimize(n_trials=12)
    space = study.objective.space
    configs = [space.to_config(t.params) for t in study.trials]
    assert len(study.trials) == 12 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert not any("duplicate_of" in t.user_attrs for t in study.trials)
    assert len(set(configs)) == 12
    assert sum(c.approach == "dynamic" for c in configs) >= 2
