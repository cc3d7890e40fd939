"""Silero VAD's sequence model on speech synthesized by espeak-ng.

silero-vad 6.2.3 ships ``silero_vad_16k_sequence.onnx``: a whole sequence of 32 ms frames (512
samples plus the 64-sample context that the wheel's own ``frame_blocks`` prepends) in one call,
with the LSTM state as inputs ``h`` and ``c``. Each evaluation clip is noise with one or two
utterances placed at random, spoken by espeak-ng in varied voices, speeds and pitches; a frame's
ground truth is speech where the clean utterance's energy, widened by 96 ms on each side,
is above 5 % of its peak. The score is the share of frames whose decision (probability above
0.5, Silero's default) matches that ground truth.

Example:
    >>> workload = silero_vad(n_eval=4, n_calibration=2, seed=0)  # doctest: +SKIP
    >>> round(workload.eval_fn(session(workload.onnx_model())), 2)  # doctest: +SKIP
    0.93
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import onnxruntime as ort
from scipy.ndimage import binary_dilation
from scipy.signal import resample_poly

from benchmarks.real_models.base import Workload
from benchmarks.real_models.wheels import shipped_file


RATE = 16000
FRAME, CONTEXT = 512, 64
CLIP_SECONDS = 6.0
THRESHOLD = 0.5
ENERGY_FLOOR = 0.05
HANGOVER_FRAMES = 3
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags.",
    "The weather today is cloudy with a chance of rain in the afternoon.",
    "Turn left at the next corner and the station is on your right.",
    "Numbers like four hundred and twenty seven are hard to hear over noise.",
    "Quantization keeps the model small and makes it run faster.",
    "Good morning, how are you doing this fine day?",
)
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-gb+f2", "en-us+m3", "de", "fr", "es")


def espeak(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    """``text`` spoken by espeak-ng, as float32 samples at 16 kHz.

    Raises:
        FileNotFoundError: If espeak-ng is not installed (Debian: ``apt-get install espeak-ng``).
    """
    if shutil.which("espeak-ng") is None:
        raise FileNotFoundError("espeak-ng is not on PATH: install it (Debian: apt-get install espeak-ng).")
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    with wave.open(io.BytesIO(wav)) as reader:
        rate = reader.getframerate()
        samples = np.frombuffer(reader.readframes(reader.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    divisor = np.gcd(RATE, rate)
    return resample_poly(samples, RATE // divisor, rate // divisor).astype(np.float32)


def frame_labels(speech: np.ndarray) -> np.ndarray:
    """Per 32 ms frame, whether the clean speech track ``speech`` is speaking there."""
    frames = speech[: len(speech) // FRAME * FRAME].reshape(-1, FRAME)
    energy = np.sqrt(np.mean(frames**2, axis=1))
    return binary_dilation(energy > ENERGY_FLOOR * energy.max(), iterations=HANGOVER_FRAMES)


def clip(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One clip of noise with one or two utterances, and its per-frame ground truth."""
    length = int(CLIP_SECONDS * RATE) // FRAME * FRAME
    speech = np.zeros(length, dtype=np.float32)
    for _ in range(rng.integers(1, 3)):
        voice = VOICES[rng.integers(len(VOICES))]
        utterance = espeak(SENTENCES[rng.integers(len(SENTENCES))], voice, int(rng.integers(130, 200)), int(rng.integers(30, 70)))
        utterance = utterance[: length // 2] * rng.uniform(0.3, 1.0) / max(np.abs(utterance).max(), 1e-6)
        start = int(rng.integers(0, length - len(utterance)))
        speech[start : start + len(utterance)] += utterance
    noise = rng.normal(0, 1, length).astype(np.float32) * 10 ** (rng.uniform(-3.5, -2.0))
    return speech + noise, frame_labels(speech)


def frames(audio: np.ndarray) -> np.ndarray:
    """The model's ``frames x 576`` input, framed by the wheel's own ``frame_blocks``."""
    from silero_vad.sequence_vad import frame_blocks

    return np.concatenate(list(frame_blocks(audio, FRAME, CONTEXT, max_frames=len(audio) // FRAME + 1)))


def _feed(audio: np.ndarray) -> dict[str, np.ndarray]:
    state = np.zeros((1, 1, 128), dtype=np.float32)
    return {"input": frames(audio), "h": state, "c": state.copy()}


class FrameAgreement:
    """``eval_fn``: the share of frames whose speech decision matches the ground truth.

    Args:
        feeds: One model input per clip.
        labels: Per clip, the ground truth of each frame.
    """

    def __init__(self, feeds: list[dict[str, np.ndarray]], labels: list[np.ndarray]) -> None:
        self.feeds, self.labels = feeds, labels

    def __call__(self, session: ort.InferenceSession) -> float:
        hits = [
            (session.run(["speech_probs"], feed)[0].reshape(-1) > THRESHOLD) == truth
            for feed, truth in zip(self.feeds, self.labels)
        ]
        return float(np.mean(np.concatenate(hits)))


def silero_vad(n_eval: int = 16, n_calibration: int = 8, seed: int = 0) -> Workload:
    """Silero VAD's sequence model on ``n_eval`` clips of 6 s of synthesized speech in noise."""
    rng = np.random.default_rng(seed)
    calibration = [_feed(clip(rng)[0]) for _ in range(n_calibration)]
    clips = [clip(rng) for _ in range(n_eval)]
    return Workload(
        name="silero_vad",
        source="silero-vad 6.2.3, data/silero_vad_16k_sequence.onnx (opset 16, LSTM, inputs input/h/c)",
        model=shipped_file("silero_vad", "data/silero_vad_16k_sequence.onnx"),
        calibration=calibration,
        eval_fn=FrameAgreement([_feed(audio) for audio, _ in clips], [truth for _, truth in clips]),
        score=f"frame accuracy against the ground truth on {n_eval} clips of {CLIP_SECONDS:.0f} s "
        "(espeak-ng speech in noise, 32 ms frames)",
    )
