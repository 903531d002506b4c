"""Calibrate a profile on this machine: time minillm's model forward pass at a few batch shapes,
then fit the cost model's device numbers to those times by least squares.

    from minillm.sim import Profile
    from minillm.sim.calibrate import calibrate
    profile = calibrate(Profile.load("cpu-tiny").model, "cpu-tiny")  # a model shape, a name
    profile.save("my-profile.json")

Time does not depend on weight values, so the model gets random weights of the profile's shape:
no download. The model's own numbers (weight bytes, KV bytes per token, attention FLOPs) are
counted, not fitted; the fit finds the *effective* memory bandwidth and FLOP rate this device
reaches with this model, and the per-pass and per-sequence overheads. On a GPU the same call
(``device="cuda", dtype=torch.bfloat16``) replaces a shipped profile's assumed numbers with
measured ones: ``python -m minillm.benchmarks.calibrate_profile`` does it from the command line.
"""

from __future__ import annotations

import platform
import time

import numpy as np
import torch

from minillm.attention.causal import causal_attention
from minillm.models.llama import CausalLM, ModelConfig
from minillm.sim.cost_model import Profile, attention_pairs
from minillm.sim.model_shape import model_numbers

# (sequences, new tokens per sequence, cached tokens per sequence): decodes from one sequence to a
# full batch at short and long contexts, and prefills from short to long prompts. On a CPU, the
# shapes the course runs there: the fit is only as good as the range it was measured on.
CPU_POINTS = [
    (1, 1, 32),
    (1, 1, 512),
    (4, 1, 128),
    (8, 1, 256),
    (16, 1, 128),
    (16, 1, 512),
    (1, 16, 0),
    (1, 64, 0),
    (1, 256, 0),
    (4, 64, 0),
    (1, 32, 256),
]
GPU_POINTS = [  # every point's KV cache is allocated at once: about 56 GB for Qwen3-0.6B in bf16
    (1, 1, 128),
    (1, 1, 4096),
    (16, 1, 512),
    (64, 1, 1024),
    (256, 1, 512),
    (64, 1, 4096),
    (1, 128, 0),
    (1, 512, 0),
    (1, 2048, 0),
    (1, 8192, 0),
    (8, 1024, 0),
    (1, 512, 4096),
]


class _FilledKVCache:
    """An attention backend like the real ones (keys and values preallocated, new ones written in
    place) whose ``batch`` sequences already hold ``context`` random tokens each."""

    def __init__(self, model: CausalLM, batch: int, context: int, new_tokens: int):
        cfg, p = model.config, next(model.parameters())
        shape = (cfg.num_hidden_layers, batch, context + new_tokens, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.randn(shape, dtype=p.dtype, device=p.device)
        self.v = torch.randn(shape, dtype=p.dtype, device=p.device)
        self.context = context

    def attend(self, layer_idx, q, k, v):
        self.k[layer_idx, :, self.context :] = k
        self.v[layer_idx, :, self.context :] = v
        return causal_attention(q, self.k[layer_idx], self.v[layer_idx])


class _TimedPass:
    """One ``[batch, new_tokens]`` forward pass after ``context`` cached tokens, inputs made once."""

    def __init__(self, model: CausalLM, batch: int, new_tokens: int, context: int):
        device = next(model.parameters()).device
        self.model = model
        self.ids = torch.randint(0, model.config.vocab_size, (batch, new_tokens), device=device)
        self.positions = torch.arange(context, context + new_tokens, device=device).expand(batch, -1)
        self.cache = _FilledKVCache(model, batch, context, new_tokens)

    @torch.inference_mode()
    def seconds(self) -> float:
        """Time of the pass, the last positions' logits and reading the tokens back (the host-device
        sync every step pays)."""
        start = time.perf_counter()
        hidden = self.model(self.ids, self.positions, self.cache)
        self.model.compute_logits(hidden[:, -1]).argmax(-1).tolist()
        return time.perf_counter() - start


def calibrate(
    shape: dict, name: str, device="cpu", dtype=torch.float32, points=None, repeats: int = 5, notes: str = ""
) -> Profile:
    """Time a random-weight model of ``shape`` (a profile's ``model``) at ``points`` (by default
    ``CPU_POINTS`` or ``GPU_POINTS``); fit a profile.

    Each point keeps its fastest time, the one least disturbed by other work; the points take
    turns, so a burst of other work cannot spoil every repeat of one point."""
    from transformers import AutoConfig

    device = torch.device(device)
    points = points or (CPU_POINTS if device.type == "cpu" else GPU_POINTS)
    with torch.device(device):
        model = CausalLM(ModelConfig.from_hf(AutoConfig.for_model(**shape))).to(dtype).eval()
    passes = [_TimedPass(model, b, n, c) for b, n, c in points]
    for p in passes:
        p.seconds()  # warm up
    best = [min(times) for times in zip(*([p.seconds() for p in passes] for _ in range(repeats)))]
    measured = [{"batch": b, "new_tokens": n, "context": c, "seconds": t} for (b, n, c), t in zip(points, best)]
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    notes = f"{notes} Measured on {where}, torch {torch.__version__}, {dtype}.".strip()
    return fit_profile(name, shape, model_numbers(model, dtype.itemsize), measured, notes)


def fit_profile(name: str, shape: dict, numbers: dict, measured: list[dict], notes: str = "") -> Profile:
    """The device numbers that best explain ``measured`` pass times, by least squares on relative
    error (a 1 ms pass counts as much as a 100 ms one). The ceilings sit inside a ``max``, so they
    are searched on a grid; for each grid point the two overheads follow in closed form."""
    probe = Profile(name, 1.0, 1.0, **numbers, forward_overhead=0.0, seq_overhead=0.0, model=shape)
    costs = [probe.forward_cost(*_pass(m)) for m in measured]
    bytes_, flops = np.array([c.bytes for c in costs]), np.array([c.flops for c in costs])
    seqs, seconds = np.array([m["batch"] for m in measured], float), np.array([m["seconds"] for m in measured])

    bandwidth = np.geomspace(1e8, 1e14, 121)[:, None, None]  # bytes/s, on axis 0
    peak = np.geomspace(1e8, 1e16, 161)[None, :, None]  # FLOP/s, on axis 1
    roof = np.maximum(bytes_ / bandwidth, flops / peak)  # [121, 161, points]
    overheads, errors = _fit_overheads(seqs, seconds, seconds - roof)
    i, j = np.unravel_index(np.argmin(errors), errors.shape)
    forward_overhead, seq_overhead = overheads[i, j]
    fitted = Profile(
        name,
        float(bandwidth[i, 0, 0]),
        float(peak[0, j, 0]),
        **numbers,
        forward_overhead=float(forward_overhead),
        seq_overhead=float(seq_overhead),
        model=shape,
    )
    for m in measured:
        m["fitted_seconds"] = fitted.forward_cost(*_pass(m)).time
    rms = float(np.sqrt(errors[i, j] / len(measured)))
    notes = f"{notes} Fitted by least squares: RMS relative error {rms:.1%} over {len(measured)} points.".strip()
    return Profile(**{**fitted.__dict__, "notes": notes, "calibration_points": measured})


def _pass(m: dict) -> tuple[int, int, int, int]:
    """``forward_cost``'s arguments for a measured ``[batch, new_tokens]`` pass after ``context``."""
    b, n, c = m["batch"], m["new_tokens"], m["context"]
    return b, b * n, b * (c + n), b * attention_pairs(c, n)


def _fit_overheads(seqs: np.ndarray, seconds: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``rest`` (``[..., points]``: time the roofline leaves unexplained), the
    non-negative ``(a, b)`` minimising the squared relative error of ``a + b * seqs ~ rest``, and
    that error. Candidates: both free (when both come out >= 0), or one of them held at zero."""
    A = np.stack([np.ones_like(seqs), seqs], axis=1) / seconds[:, None]  # [points, 2], relative
    y = rest / seconds
    both = y @ np.linalg.pinv(A).T  # [..., 2]
    a_only = np.clip(y @ A[:, 0] / (A[:, 0] @ A[:, 0]), 0, None)[..., None] * [1.0, 0.0]
    b_only = np.clip(y @ A[:, 1] / (A[:, 1] @ A[:, 1]), 0, None)[..., None] * [0.0, 1.0]
    candidates = np.stack([both, a_only, b_only], axis=-2)  # [..., 3, 2]
    errors = ((candidates @ A.T - y[..., None, :]) ** 2).sum(-1)  # [..., 3]
    errors[..., 0] = np.where((both >= 0).all(-1), errors[..., 0], np.inf)
    k = errors.argmin(-1)[..., None]
    return np.take_along_axis(candidates, k[..., None], -2)[..., 0, :], np.take_along_axis(errors, k, -1)[..., 0]
