"""The probe: real measurements of the tiny CNN, this machine's onnxruntime, and the advice it gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper
import onnxruntime as ort
import pytest

import optuna_quant as oq
from optuna_quant.cli.probe import probe
from optuna_quant.cli.probe import ProbeReport
from optuna_quant.cli.probe import run_probe
from optuna_quant.cli.probe import suggest_targets
from optuna_quant.measure.cpu import confirmed_by_cpuid
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.cpu import Int8Support
from optuna_quant.measure.int8_causes import slow_int8_causes
from optuna_quant.measure.latency import LatencyResult
from optuna_quant.trial.objective import Measurement


NO_VNNI = Int8Support("1.0", ("CPUExecutionProvider",), ("avx2",))
VNNI = Int8Support("1.0", ("CPUExecutionProvider",), ("avx512_vnni", "avx2"))


def test_int8_support_reads_the_cpu_flags(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpu = "model name\t: Intel(R) Xeon(R) Platinum 8580\nflags\t\t: fpu sse2 avx2 avx512bw avx512_vnni amx_int8\n"
    cpuinfo.write_text(f"processor\t: 0\n{cpu}\nprocessor\t: 1\n{cpu}")
    support = int8_support(cpuinfo)
    assert support.instruction_sets == ("amx_int8", "avx512_vnni", "avx512bw", "avx2")
    assert support.cpu_model == "Intel(R) Xeon(R) Platinum 8580"
    assert support.dot_product
    assert "CPUExecutionProvider" in support.providers and support.onnxruntime_version == ort.__version__
    arm = tmp_path / "arm"
    arm.write_text("Features\t: fp asimd asimddp\n")
    assert int8_support(arm).instruction_sets == ("asimddp",) and int8_support(arm).dot_product
    assert int8_support(arm).cpu_model == "unknown"
    assert int8_support(tmp_path / "missing").instruction_sets == ()
    assert "int8 instructions: none of amx_int8" in int8_support(tmp_path / "missing").describe()


def test_flags_that_cpuid_contradicts_are_dropped() -> None:
    # An AVX2 CPU emulated by qemu-x86_64 on an AMX host: /proc/cpuinfo lists the host's flags,
    # numpy's CPUID reading (the features below, as it reads them there) the emulated CPU's.
    host = {"amx_int8", "avx512_vnni", "avx_vnni", "avx512bw", "avx2"}
    haswell = {"AVX2": True, "AVX512BW": False, "AVX512VNNI": False, "AVX512_SPR": False, "GFNI": False}
    assert confirmed_by_cpuid(host, haswell) == {"avx2"}
    icelake = {**haswell, "AVX512BW": True, "AVX512VNNI": True, "GFNI": True}
    assert confirmed_by_cpuid(host, icelake) == {"avx512_vnni", "avx_vnni", "avx512bw", "avx2"}
    assert confirmed_by_cpuid(host, {}) == host  # nothing read: the kernel's flags stand


@pytest.mark.parametrize(
    "flags, int8_class",
    [("avx2 avx512bw avx512_vnni amx_int8", "x86-amx"), ("avx2 avx_vnni", "x86-vnni"), ("avx2 avx512bw", "x86-avx512"),
     ("sse4_2 avx2", "x86-avx2"), ("sse4_2", "other"), ("asimd asimddp", "arm-dotprod"), ("asimddp i8mm", "arm-i8mm")],
)
def test_the_int8_class_is_named_by_the_fastest_int8_instructions(tmp_path, flags, int8_class) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"flags\t\t: fpu {flags}\n")
    assert int8_support(cpuinfo).int8_class == int8_class
    assert int8_support(cpuinfo).describe().endswith(f"(class {int8_class})")


def test_suggested_targets_follow_the_reference() -> None:
    accuracy_loss, latency_reduce, (why_accuracy, why_latency) = suggest_targets(0.0674, 2.19, 0.015)
    assert (accuracy_loss, latency_reduce) == (1.0, 2.05)  # 2.19 less 5 %, rounded down to 0.05
    assert "loses 6.74 %" in why_accuracy and "ask for 6.8" in why_accuracy
    assert "a little under the reference's 2.19x" in why_latency
    # A noisy speed-up leaves twice its spread.
    assert suggest_targets(0.002, 2.0, 0.1)[1] == 1.6
    assert "within 1 %" in suggest_targets(0.002, 2.0, 0.1)[2][0]
    slower = suggest_targets(0.0, 0.85, 0.02)
    assert slower[:2] == (1.0, 1.0) and "int8 is not faster than fp32 here (lat_diff 0.85x)" in slower[2][1]


def _with_batch_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with an identity BatchNormalization after its first Conv, not folded."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    channels = next(i for i in model.graph.initializer if i.name == conv.input[1]).dims[0]
    names = ["bn_scale", "bn_bias", "bn_mean", "bn_var"]
    for name, value in zip(names, (1.0, 0.0, 0.0, 1.0)):
        model.graph.initializer.append(numpy_helper.from_array(np.full(channels, value, np.float32), name))
    output = conv.output[0]
    conv.output[0] = output + "_pre_bn"
    index = list(model.graph.node).index(conv)
    model.graph.node.insert(index + 1, helper.make_node("BatchNormalization", [conv.output[0], *names], [output]))
    onnx.checker.check_model(model)
    return model


def test_slow_int8_causes_found_in_the_model_come_first(cnn) -> None:
    causes = slow_int8_causes(cnn, VNNI)
    # The tiny CNN: narrow layers, nothing else.
    assert causes[0] == "narrow layers: the widest has 16 output channels; int8 pays from about 64 channels"
    assert all(c.startswith("(not the cause here)") for c in causes[1:])
    causes = slow_int8_causes(_with_batch_norm(cnn), NO_VNNI)
    assert causes[0].startswith("this CPU has no int8 dot-product instructions")
    assert causes[1].startswith("unfolded BatchNormalization (1 in this model)")


def test_run_probe_measures_fp32_and_the_reference(cnn_path, calib, agreement, fast_bench) -> None:
    objective = oq.QuantizationObjective(str(cnn_path), calib, agreement, benchmark=fast_bench)
    report = run_probe(objective)
    assert report.fp32_accuracy == 1.0 == objective.measurer.baseline()  # kept for a study on this objective
    # The reference is the default configuration: its accuracy is that configuration's, measured again.
    assert report.acc_loss == objective.measure(objective.space.default_params()).acc_loss
    latency = report.reference.latency
    assert latency.fp32_ms > 0 and latency.int8_ms > 0
    assert report.lat_diff == pytest.approx(latency.fp32_ms / latency.int8_ms, rel=0.5)
    assert report.support == int8_support()
    text = report.report()
    assert f"accuracy {report.fp32_accuracy:.4f}, latency {latency.fp32_ms:.3f} ms per run" in text
    assert f"lat_diff {report.lat_diff:.2f}x" in text and "Suggested targets" in text
    assert ("int8 is not faster than fp32 here" in text) == (report.lat_diff <= 1.0)


def test_probe_from_arguments_like_create_study(cnn_path, calib, agreement, fast_bench) -> None:
    report = probe(str(cnn_path), calib, eval_data=(agreement.inputs, agreement.labels),
                   benchmark={"warmup": 2, "blocks": 3, "min_seconds": 0.03}, metrics=1.0)
    assert report.fp32_accuracy == 1.0
    with pytest.raises(ValueError, match="exactly one of eval_fn and eval_data"):
        probe(str(cnn_path), calib)


def test_report_says_why_int8_is_slow_and_shows_the_sensitivity() -> None:
    reference = Measurement(accuracy=0.8991, acc_loss=0.001, latency=LatencyResult(1.0, 1.25, 0.8, 0.02),
                            quantize_seconds=0.1, eval_seconds=0.1, latency_seconds=1.0)
    report = ProbeReport(
        fp32_accuracy=0.9, reference=reference, support=NO_VNNI, suggested_accuracy_loss=1.0, suggested_latency_reduce=1.0,
        reasons=("a", "b"), slow_int8_causes=("cause one", "cause two"), sensitivity=None, seconds=2.0,
    )
    text = report.report()
    assert "lat_diff 0.80x ± 2.0 % (1.250 ms per run)" in text
    assert "int8 is not faster than fp32 here (lat_diff 0.80x). Usual causes:\n    - cause one\n    - cause two" in text
    assert "sensitive" not in text
    sensitive = dataclasses.replace(report, sensitivity={
        "conv1": {"acc_cost": 0.01, "time_saved_ms": 0.2}, "fc": {"acc_cost": 0.03, "time_saved_ms": 0.05},
    })
    lines = sensitive.report().splitlines()
    start = lines.index("  most sensitive layers (accuracy cost of int8, time it saves):")
    assert lines[start + 1].split() == ["fc", "acc_cost", "0.0300", "time_saved", "0.050", "ms"]
    assert lines[start + 2].split()[0] == "conv1"


def test_the_causes_on_a_transformer_come_from_its_graph_its_profile_and_the_cpu(
    cnn, bert_path, bert_feeds, bert_agreement, fast_bench, tmp_path
) -> None:
    objective = oq.QuantizationObjective(str(bert_path), bert_feeds, bert_agreement, benchmark=fast_bench)
    report = run_probe(objective)
    causes = report.slow_int8_causes

    def cause(start: str) -> str:
        return next(c for c in causes if c.startswith(start))

    # What stays fp32 between the int8 MatMuls of the tiny BERT's two layers, with its measured share.
    fp32 = cause("operators that run in fp32 between the int8 MatMuls")
    for ops in ("Add (22)", "LayerNormalization (5)", "Softmax (2)", "Erf (2)"):
        assert ops in fp32
    assert "; measured: " in fp32 and "ms of the int8 model's" in fp32
    # Dynamic leaves attention's MatMuls of two activations fp32; the mask path stays fp32 either way.
    attention = cause("attention in fp32: 4 of its 4 MatMuls of two activations")
    assert "attention-mask path" in attention and "Softmax (2)" in attention
    # The reference of a transformer is dynamic: one DynamicQuantizeLinear per distinct MatMul
    # input (query, key and value share theirs), 4 a layer.
    assert cause("the dynamic approach: 8 DynamicQuantizeLinear")
    assert cause("attention not fused")
    # This CPU, said as it is: never whether int8 is faster.
    assert any(c.startswith("this CPU has no int8 dot-product") for c in causes) == (not int8_support().dot_product)
    assert all(c in report.report() for c in report.found_causes)
    # The CPU read from a cpuinfo file, and the static approach's conversions.
    static = objective.build({**objective.space.default_params(), "approach": "static"})
    no_vnni, vnni = tmp_path / "no_vnni", tmp_path / "vnni"
    no_vnni.write_text("flags\t\t: fpu sse2 avx2 avx512bw\n")
    vnni.write_text("flags\t\t: fpu sse2 avx2 avx512bw avx512_vnni\n")
    found = slow_int8_causes(objective.measurer.model, int8_support(no_vnni), static)
    assert found[0].startswith("this CPU has no int8 dot-product instructions")
    assert any(c.startswith("the static approach: ") and "QuantizeLinear" in c for c in found)
    static_attention = next(c for c in found if c.startswith("attention in fp32: "))
    assert "attention-mask path" in static_attention
    assert not static_attention.startswith("attention in fp32: 4 of")  # Q/DQ quantizes some of them
    assert not any("measured:" in c for c in found)  # no profile given
    found = slow_int8_causes(objective.measurer.model, int8_support(vnni), static)
    assert "(not the cause here) no int8 dot-product instructions (VNNI, AMX): this CPU has them" in found
    # A CNN has none of them.
    assert not any("attention" in c for c in slow_int8_causes(cnn, VNNI))
