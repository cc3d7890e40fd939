"""Groups of a transformer's layers, by block or by role, that the ``layer`` scope can switch as one.

A BERT has six MatMuls with weights a block (query, key, value, attention output, feed-forward
in and out) and two of activations (attention's ``Q K^T`` and ``probabilities V``): 48 to
hundreds of layers, one parameter each. :func:`layer_groups` gathers them so that one parameter
keeps a whole group in fp32 or int8:

- ``"block"``: ``block.<i>``, every layer of the i-th transformer block;
- ``"role"``: one group per role of :data:`ROLES` across the blocks.

A layer's place (:func:`layer_places`) is read from its module name (a ``torch.nn.Module``
export's map, :func:`optuna_quant.quantization.torch_export.export_module`) or its node name
(the TorchScript exporter's ``/encoder/layer.3/attention/self/query/MatMul``) when the name gives
both the block and the role; otherwise from the graph, which every export has: the MatMuls of two
activations are the attention, ``Q K^T`` the one whose output reaches a Softmax; a weighted layer
whose output reaches ``Q K^T`` first (through no other layer) is its query (first input) or key
(second), one that reaches ``probabilities V`` its value; one whose input comes from
``probabilities V`` the attention output; one with an activation function (Erf, Gelu, Relu...)
after it the feed-forward in, one with it before it the feed-forward out. A block is the index of
its attention, in graph order. A layer with no place (a classifier head, a CNN's convolution)
stays a group of its own, named as the node.

Example:
    >>> places = {"q0": LayerPlace(0, "query"), "k0": LayerPlace(0, "key"),
    ...           "q1": LayerPlace(1, "query"), "head": LayerPlace(None, None)}
    >>> groups_of(places, "block")
    {'block.0': ('q0', 'k0'), 'block.1': ('q1',), 'head': ('head',)}
    >>> groups_of(places, "role")
    {'query': ('q0', 'q1'), 'key': ('k0',), 'head': ('head',)}
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
import re

import onnx

from optuna_quant.quantization.config import quantizable_nodes
from optuna_quant.quantization.config import QUANTIZABLE_OP_TYPES


GROUPINGS: tuple[str, ...] = ("block", "role")
"""The values of ``layer_groups`` besides ``None`` (one parameter per layer)."""
ROLES: tuple[str, ...] = ("query", "key", "value", "attention", "attention_output", "ffn_in", "ffn_out")
"""The roles of a transformer block's layers; ``attention`` is its two MatMuls of activations."""
ACTIVATIONS = frozenset({"Erf", "Gelu", "FastGelu", "BiasGelu", "Relu", "Sigmoid", "Tanh", "QuickGelu"})
"""Operators of a feed-forward's activation function (Gelu exported as Erf)."""
_SHAPE_READS = frozenset({"Shape", "Size"})
_BLOCK = re.compile(r"(?:^|[./])(?:layer|layers|h|block|blocks)[._](\d+)(?=[./]|$)")
# The role of a module or node name, by its segments: the first pattern that matches wins, so
# the attention's output comes before the feed-forward's.
_ROLE_NAMES = (
    ("query", re.compile(r"[./](?:query|q_proj|q_lin|q)(?:[./]|$)")),
    ("key", re.compile(r"[./](?:key|k_proj|k_lin|k)(?:[./]|$)")),
    ("value", re.compile(r"[./](?:value|v_proj|v_lin|v)(?:[./]|$)")),
    ("attention_output", re.compile(r"attention[./]output|[./](?:out_proj|o_proj|out_lin)(?:[./]|$)")),
    ("ffn_in", re.compile(r"[./](?:intermediate|fc1|up_proj|gate_proj|lin1|c_fc)(?:[./]|$)")),
    ("ffn_out", re.compile(r"[./](?:output|fc2|down_proj|lin2)(?:[./]|$)")),
)


@dataclass(frozen=True)
class LayerPlace:
    """Where a layer sits in a transformer: its block's index and its role (:data:`ROLES`), or
    ``None`` for what it does not have."""

    block: int | None
    role: str | None


def place_from_name(name: str) -> LayerPlace:
    """The place a module or node name gives, ``None`` where it says nothing.

    Example:
        >>> place_from_name("/encoder/layer.3/attention/self/query/MatMul")
        LayerPlace(block=3, role='query')
        >>> place_from_name("encoder.layer.11.attention.output.dense")
        LayerPlace(block=11, role='attention_output')
        >>> place_from_name("model.layers.0.mlp.down_proj"), place_from_name("node_MatMul_82")
        (LayerPlace(block=0, role='ffn_out'), LayerPlace(block=None, role=None))
    """
    block = _BLOCK.search(name)
    role = next((role for role, pattern in _ROLE_NAMES if pattern.search("/" + name)), None)
    return LayerPlace(int(block.group(1)) if block else None, role)


def layer_places(model: onnx.ModelProto, module_of_node: Mapping[str, str] | None = None) -> dict[str, LayerPlace]:
    """The place of each quantizable node of ``model``, in graph order: from its module name
    (``module_of_node``) or node name when that gives block and role, else from the graph (see
    the module docstring)."""
    structural = _structural_places(model)
    places = {}
    for node in quantizable_nodes(model):
        named = place_from_name((module_of_node or {}).get(node, node))
        places[node] = named if named.block is not None and named.role is not None else structural[node]
    return places


def groups_of(places: Mapping[str, LayerPlace], by: str) -> dict[str, tuple[str, ...]]:
    """The groups of ``places`` by ``"block"`` or ``"role"``: the blocks in order, the roles in
    the order of :data:`ROLES`, then each layer without a place, a group of its own named as the
    layer (in the order of ``places``).

    Raises:
        ValueError: If ``by`` is not one of :data:`GROUPINGS`.
    """
    if by not in GROUPINGS:
        raise ValueError(f"Unknown layer_groups {by!r}; choose from {GROUPINGS} or None (one parameter per layer).")
    placed: dict[tuple[int, str], list[str]] = {}
    alone = []
    for node, place in places.items():
        if place.role is None or place.block is None:
            alone.append(node)
        elif by == "block":
            placed.setdefault((place.block, f"block.{place.block}"), []).append(node)
        else:
            placed.setdefault((ROLES.index(place.role), place.role), []).append(node)
    groups = {name: tuple(nodes) for (_, name), nodes in sorted(placed.items())}
    return {**groups, **{node: (node,) for node in alone}}


def layer_groups(
    model: onnx.ModelProto, by: str, module_of_node: Mapping[str, str] | None = None
) -> dict[str, tuple[str, ...]]:
    """The quantizable nodes of ``model`` grouped by ``"block"`` or ``"role"`` (:func:`groups_of`
    of :func:`layer_places`)."""
    return groups_of(layer_places(model, module_of_node), by)


def _structural_places(model: onnx.ModelProto) -> dict[str, LayerPlace]:
    """The place of each quantizable node read from the graph alone (the module docstring's rule)."""
    graph = _Graph(model)
    attention = [n for n in graph.layers if not graph.weighted(n)]
    scores = [n.name for n in attention if any(r.op_type == "Softmax" for r in graph.reached(n, downstream=True))]
    contexts = [n.name for n in attention if n.name not in scores]
    block_of = {name: i for i, name in enumerate(scores)} | {name: i for i, name in enumerate(contexts)}
    places = {}
    seen_scores = 0
    for node in graph.layers:
        seen_scores += node.name in scores
        if not graph.weighted(node):
            places[node.name] = LayerPlace(block_of[node.name], "attention")
            continue
        role, block = _role(graph, node, set(scores), block_of)
        if role is not None and block is None and seen_scores:
            block = seen_scores - 1  # a feed-forward belongs to the last attention before it
        places[node.name] = LayerPlace(block, role) if block is not None else LayerPlace(None, None)
    return places


def _role(graph: _Graph, node: onnx.NodeProto, scores: set[str], block_of: Mapping[str, int]) -> tuple[str | None, int | None]:
    """The role of a weighted layer, and its block when its attention tells it."""
    after = list(graph.reached(node, downstream=True))
    carried = {out for n in [node, *after] if n is node or n.op_type not in QUANTIZABLE_OP_TYPES for out in n.output}
    for consumer in (n for n in after if n.name in block_of):
        # Which input of the attention's MatMul this layer's output reaches.
        for index, name in enumerate(consumer.input[:2]):
            if name in carried and consumer.name in scores:
                return ("query", "key")[index], block_of[consumer.name]
            if name in carried and index == 1:
                return "value", block_of[consumer.name]
    before = list(graph.reached(node, downstream=False))
    context = next((n for n in before if n.name in block_of and n.name not in scores), None)
    if context is not None:
        return "attention_output", block_of[context.name]
    if any(n.op_type in ACTIVATIONS for n in after):
        return "ffn_in", None
    if any(n.op_type in ACTIVATIONS for n in before):
        return "ffn_out", None
    return None, None


class _Graph:
    """Producers and consumers of a graph's tensors, and walks that stop at its layers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        nodes = list(model.graph.node)
        self.constants = {init.name for init in model.graph.initializer}
        self.constants |= {out for n in nodes if n.op_type == "Constant" for out in n.output}
        self.producer = {out: n for n in nodes for out in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for name in n.input:
                self.consumers.setdefault(name, []).append(n)
        self.layers = [n for n in nodes if n.op_type in QUANTIZABLE_OP_TYPES]

    def weighted(self, node: onnx.NodeProto) -> bool:
        """Whether the layer has a constant input (its weight): else it multiplies two activations."""
        return bool(self.constants & set(node.input[:2]))

    def reached(self, node: onnx.NodeProto, downstream: bool) -> Iterator[onnx.NodeProto]:
        """The nodes whose values ``node``'s output flows into (``downstream``) or that flow into
        its input, walking through nodes that are not layers (the layers reached are given, not
        walked through) nor shape reads (a Shape's output carries no values: through it, a walk
        would reach the tensors that the shape reshapes)."""
        seen = {id(node)}
        todo = [node]
        while todo:
            current = todo.pop()
            if downstream:
                following: Iterable[onnx.NodeProto] = (c for out in current.output for c in self.consumers.get(out, ()))
            else:
                following = (self.producer[i] for i in current.input if i in self.producer and i not in self.constants)
            for other in following:
                if id(other) in seen:
                    continue
                seen.add(id(other))
                yield other
                if other.op_type not in QUANTIZABLE_OP_TYPES and other.op_type not in _SHAPE_READS:
                    todo.append(other)
