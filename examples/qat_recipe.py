"""QAT recipe: when PTQ's best configuration misses the accuracy target, fine-tune in fake quant.

1. The model: the demo's wide CNN (64/128/128/128 channels) trained on 3,500 of the 5,000 MNIST digits, made
   as sensitive to int8 as real MobileNets by the demo's function-preserving channel rescaling of
   the conv 4 -> ReLU -> conv 6 pair (:func:`examples.demo_model.sensitise`), kept as a torch
   model so that it can be fine-tuned. The trained weights are cached in ``.cache/qat``.
2. PTQ: an optuna-quant study over every all-int8 configuration (``range_estimator``,
   ``granularity``, ``mode``; no layer falls back to fp32, so the int8 speed-up is kept). Its best
   configuration misses the 1 % accuracy target.
3. QAT: the same float model with fake quantizers (``quantize_modules``), max calibration, two
   epochs of Adam with a cosine decay and parameter groups (``group_parameters``: a lower
   learning rate for the early convolutions than for the last one and the classifier), the
   first convolution frozen (``freeze_parameters``), then the weights written onto the int8 grid
   (``quant_weight_inplace``).
4. ``export_qat`` gives a QDQ ONNX model; its accuracy, ``lat_diff`` and POT loss are measured by
   the study's own objective (``measure_model``: its ``eval_fn``, paired latency timing and loss
   scaling), next to a fresh measurement of the PTQ best.

Run (about 4 minutes on two busy cores with the weights cached, more the first time)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m examples.qat_recipe
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import copy
import logging
import math
from pathlib import Path
import time
import warnings

import optuna
import torch
from torch import nn

from examples import demo_data
from examples.demo_model import sensitise
from examples.demo_model import train_cnn
from examples.mnist import load_mnist
from examples.mnist import MnistSplit
import optuna_quant as oq
from optuna_quant.qat import calibrate
from optuna_quant.qat import export_qat
from optuna_quant.qat import freeze_parameters
from optuna_quant.qat import group_parameters
from optuna_quant.qat import quant_weight_inplace
from optuna_quant.qat import quantize_modules
from optuna_quant.trial.objective import Measurement


CACHE_DIR = Path(".cache") / "qat"
WEIGHTS_FILE = "mnist_cnn.pt"
BATCH_SIZE = 64


def sensitive_cnn(data: MnistSplit, cache_dir: Path = CACHE_DIR) -> nn.Sequential:
    """The trained and rescaled float CNN; training runs once, then the weights come from cache."""
    path = cache_dir / WEIGHTS_FILE
    if path.is_file():
        # No training epochs: train_cnn then only builds the architecture for the cached weights.
        model = train_cnn(data, epochs=0)
        model.load_state_dict(torch.load(path))
    else:
        start = time.perf_counter()
        model = train_cnn(data)
        cache_dir.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
        print(f"Trained the CNN in {time.perf_counter() - start:.0f} s (cached in {path})")
    sensitise(model)
    return model.eval()


def run_ptq(model: nn.Module, trials: int, seed: int) -> oq.QuantStudy:
    """Tune the all-int8 configurations of ``model`` and return the study."""
    study = oq.create_study(
        model=model,
        example_inputs=torch.zeros(1, 1, 28, 28),
        calibration_data=demo_data.calibration(),
        eval_data=demo_data.evaluation(),
        accuracy_loss=1.0,
        latency_reduce=1.5,
        scopes=("range_estimator", "granularity", "mode"),
        sampler="tpe",
        seed=seed,
        storage=optuna.storages.InMemoryStorage(),
        study_name="qat-recipe-ptq",
        artifact_dir=CACHE_DIR / "artifacts",
    )
    study.optimize(n_trials=trials)
    return study


def finetune_qat(model: nn.Module, data: MnistSplit, epochs: int, seed: int) -> nn.Sequential:
    """A fake-quantized copy of ``model``, calibrated, fine-tuned and with int8-grid weights."""
    torch.manual_seed(seed)
    qat = quantize_modules(copy.deepcopy(model))
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    # Max calibration on 512 training digits; inputs after ReLUs (and the pixels) become uint8.
    calibrate(qat, [x[i : i + 128] for i in range(0, 512, 128)])

    # The first convolution has 9 weights per channel and needs no change: freeze it. The
    # early convolutions move slowly, the last convolution and the classifier ten times faster.
    freeze_parameters(qat, [r"^0\."])
    groups = group_parameters(qat, [[r"^2\.", r"^4\."], [r"^6\.", r"^9\."]], lrs=[1e-4, 1e-3])
    optimizer = torch.optim.Adam(groups)
    # Decaying to zero mattered: at a constant rate the accuracy stalled about 0.5 % lower.
    steps_per_epoch = -(-len(x) // BATCH_SIZE)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * steps_per_epoch)
    qat.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            optimizer.zero_grad()
            nn.functional.cross_entropy(qat(x[batch]), y[batch]).backward()
            optimizer.step()
            schedule.step()
    quant_weight_inplace(qat)
    return qat.eval()


def row(name: str, m: Measurement, study: oq.QuantStudy) -> str:
    missed = study.targets.missed(m.acc_loss, m.lat_diff, m.quantized)
    verdict = "targets met" if not missed else "misses " + " and ".join(missed)
    return (
        f"{name:10s} accuracy {m.accuracy:.4f}  acc_loss {100 * m.acc_loss:5.2f} %  "
        f"lat_diff {m.lat_diff:4.2f} (spread {m.latency.spread:.2f})  "
        f"loss {study.objective.loss(m):7.2f}  {verdict}"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="PTQ trials (default 20)")
    parser.add_argument("--epochs", type=int, default=2, help="QAT epochs (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export", default="demo-out/mnist_cnn.qat.onnx")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # torch 2.13's ONNX exporter warns on every export that torchvision is absent, and about its
    # own use of a deprecated pytree API: nothing this recipe can act on.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
    torch.set_num_threads(2)

    data = load_mnist()
    model = sensitive_cnn(data)

    start = time.perf_counter()
    study = run_ptq(model, args.trials, args.seed)
    best = study.best_result
    distinct = len({tuple(sorted(trial.params.items())) for trial in study.trials})
    space_size = math.prod(len(d.choices) for d in study.objective.space.distributions().values())
    print(
        f"PTQ: {len(study.trials)} trials ({distinct} distinct configurations of {space_size}) "
        f"in {time.perf_counter() - start:.0f} s. {best.summary()}"
    )
    print(f"     best configuration: {best.params}")

    start = time.perf_counter()
    qat = finetune_qat(model, data, args.epochs, args.seed)
    Path(args.export).parent.mkdir(parents=True, exist_ok=True)
    qat_onnx = export_qat(qat, torch.zeros(1, 1, 28, 28), args.export)
    qat_seconds = time.perf_counter() - start
    print(f"QAT: calibrated, fine-tuned and exported in {qat_seconds:.0f} s to {args.export}")

    # Both measured now, side by side, so that they share the machine's current load.
    ptq_measurement = study.objective.measure(best.params)
    qat_measurement = study.objective.measure_model(qat_onnx, quantize_seconds=qat_seconds)
    print()
    print(f"fp32       accuracy {study.objective.baseline():.4f}")
    print(row("PTQ best", ptq_measurement, study))
    print(row("QAT", qat_measurement, study))


if __name__ == "__main__":
    main()
