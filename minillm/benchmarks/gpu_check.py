"""Every check and measurement a GPU session owes the project, as one script with one JSON result.

    python -m minillm.benchmarks.gpu_check --out DIR            # one GPU: Qwen3-0.6B's shape in bf16
    python -m minillm.benchmarks.gpu_check --small --out DIR    # the same code paths on CPU, tiny shapes, < 60 s

Nothing is downloaded (a GPU machine may have no network): every model is built from a config with
random weights, which is all that timing needs, and the correctness oracle is transformers itself.

Sections, in order, each with a time budget (``BUDGETS``). An exception or an overrun ends only that
section: its entry keeps what it finished, says why it stopped, and the next section runs.

1. ``environment``  torch / CUDA / transformers versions, the device and its memory, what is missing.
2. ``correctness``  minillm's logits against transformers' on the device, for tiny random Qwen3 and
   Llama configs: float32 (must agree to 1e-4) and bfloat16 (recorded beside transformers' own
   bfloat16 error); then every engine's greedy tokens against the naive engine's, in float32 (the
   chunked engine's with CUDA graphs too, and with graphs and chapter 9's fast path, whose small ops
   torch.compile writes on a GPU: the seconds it took, compiling included), the chunked engine's
   sampled tokens (a step's requests drawn together) against the naive engine's (each drawn alone),
   and the chunked engine's with prefix caching on prompts that share a prefix (it must find blocks).
3. ``calibration``  ``minillm.sim.calibrate`` on Qwen3-0.6B's shape in bfloat16; the fitted profile
   is written to ``DIR/<gpu>-qwen3-0.6b.json``, ``<gpu>`` the device's name as a label
   (``gpu_label``: ``h200`` on an H200, ``h100-80gb-hbm3`` on that H100).
4. ``step_curve``   the selective engine's own steps on that shape (scheduler, flat batch,
   per-request attention, sampling): decode at batch 1/8/64/256 and context 256/1024, prefill of
   128/512/2048 tokens. Rows have the keys of ``minillm/benchmarks/anchors/hf_step_curve_h200.json``, plus what
   each profile predicts; a profile fitted to these steps goes to
   ``DIR/<gpu>-qwen3-0.6b.engine-steps.json``.
5. ``end_to_end``   the selective, paged, chunked and continuous engines on a scaled-down anchor workload (32
   requests, prompt and output lengths uniform in [16, 160]): output tok/s, next to the
   simulator's prediction with each profile.
6. ``paged_attention`` the Triton paged-attention kernel (``minillm.kernels``) against its PyTorch
   reference in float32/float16/bfloat16 on a mixed step, then decode bandwidth with Qwen3-0.6B's
   heads (batch 1-256, context 512-8192, block 16) beside a device copy's bandwidth. Estimated
   ~20 s: a few kernel compilations, 12 timed configurations of at most ~9 GB of K/V reads each.
7. ``paged_step``   decode steps of the paged engine (Triton, one call per layer) against the
   selective engine's (attention per request) at batch 1/32/128, context 1024: chapter 5's goal is
   paged faster from batch 32. Estimated ~20 s, most of it the selective engine at batch 128.
8. ``kv_pool``      one engine and one KV pool for an ``LLM``'s life: the chunked engine on a tiny
   random Qwen3 with ``gpu_memory_utilization=0.5`` (on the CPU, ``kv_cache_memory_bytes``), three
   ``generate`` calls in a row: the pool's blocks and storage, and what PyTorch reserves, after
   each (flat: no pool built twice). Estimated a few seconds.
9. ``cuda_graphs``  the chunked engine with ``cuda_graphs=True`` against itself eager on the timed model:
   the same greedy tokens for 12 requests and their mixed steps' median time both ways (those
   replay the forward in pieces, attention between), then a batch-1 decode step's median time both ways (the
   issue's target with graphs: 1 ms or less), and with the fast path too (fused, compiled), and the host syncs per step
   (``set_sync_debug_mode``); and what capturing every size up to ``max_num_seqs`` at start cost:
   seconds, the device memory it took, and the estimate ``gpu_memory_utilization`` leaves out of the
   KV pool for it. On the CPU the graphs are stand-ins: the code path only.
10. ``bench``       ``minillm bench`` on Qwen3-0.6B's shape (``random:h200-qwen3-0.6b``, bf16): the chunked
   engine, eager, with chapter 9's fast path (``chunked:fast``; on a GPU its ``fused`` and
   ``compiled`` steps), and with the fast path and CUDA graphs (``chunked:fast+graphs``: the GPU's fastest minillm),
   beside transformers' ``generate`` and continuous batching, on the ``gpu-check`` workload (64 of
   the anchors' requests, 100-1,024 prompt tokens, 32-128 output tokens; the full anchors' workload
   takes transformers ~7 minutes), with the matmul and copy rates and the roofline floor measured in
   the same run. Estimated ~40 s, mostly transformers.
11. ``notebooks``   only with ``--notebooks``: every chapter notebook, run as ``minillm publish`` runs
   it (small mode: the tiny model), on this device (``minillm.benchmarks.gpu_notebooks``); the
   executed copies go to ``DIR/notebooks``, their pictures to ``DIR/notebooks/pictures``, and each
   one's status, seconds and error to the JSON.

``DIR/gpu_check.json`` has one key per section, each with ``status`` (ok / error / skipped),
``seconds`` and a one-line ``summary``; it is rewritten after every section, so a run cut short
keeps what it finished.

On the device, from the repository root (no install needed: it uses torch with CUDA, numpy and
transformers >= 5; ``environment`` names whatever is missing, and what needs transformers --
correctness, calibration, the simulated figures -- is skipped without it)::

    python -m minillm.benchmarks.gpu_check --out $OUT --notebooks    # the run tool's timeout_s: 540

The whole run stops by itself within ``--budget`` seconds (``RUN_BUDGET_S``, 480: 8 minutes of device
time): each section gets its own budget or what the run has left, whichever is less, and a section left
with under ``MIN_SECTION_S`` is skipped, saying so. The notebooks need nbclient, ipykernel and
ipywidgets, which a GPU image may lack: carry them as wheels for its Python.

Measured on one H200 (2026-12-04, ``results/gpu_check_h200.json``): 155 s for sections 1-9 (the
step curve 42 s and end to end 58 s the longest); the chapters in small mode 17-89 s each, one at a
time, 471 s for the nine that ran (00-07): at that pace all thirteen would take ~680 s (an estimate),
over any budget. So on a GPU the chapters run several at a time (``gpu_notebooks.default_parallel``:
one per 4 CPU cores, at most 4; ``--notebooks-parallel N`` sets it), on the expectation, not yet
measured, that a small-mode chapter spends most of its time on the host (kernel start, imports,
Triton compiles, the tiny model's launches), which 16 cores run side by side. The first such run
says whether the thirteen fit the notebooks' 300 s. The estimate below, from operation counts, came
before the 2026-12-04 run and was too low.
minillm runs eagerly, so host time per PyTorch operation (~8 us) sets most step times: a decode
step is ~1,800 operations plus ~560 per sequence (attention runs per request, 20 operations in each
of 28 layers), about 20 ms at batch 1 and 1.2 s at batch 256. Imports and CUDA start-up ~15 s,
correctness ~15 s, calibration ~15 s (its passes are padded, one attention call per layer), step
curve ~30 s (mostly batch 256), end to end ~35 s (2,421 generated tokens per engine). The budgets
(``BUDGETS``) add up to 360 s. ``--sections step_curve,end_to_end`` reruns a part.

To commit the results (``<gpu>`` as above: a run on another GPU is that GPU's, never the H200's)::

    cp DIR/gpu_check.json minillm/benchmarks/results/gpu_check_<gpu>.json
    cp DIR/h200-qwen3-0.6b.json minillm/sim/profiles/h200-qwen3-0.6b.json    # from an H200 only

With ``--notebooks``, the executed chapters go to ``minillm/benchmarks/results/gpu_<gpu>_notebooks/``
and ``minillm publish --from`` that folder makes their pages under ``docs/gpu/``.

The second line, from an H200's run, replaces the shipped H200 profile's assumed overheads with
calibrate()'s measured ones (another GPU's profile is a profile of its own, not a replacement).
Read the fit first (the RMS error in its notes, each point's ms against fitted_ms) and compare the
two profiles in step_curve's rows and end_to_end's simulated figures: ``*.engine-steps.json`` (same
profile name) predicts minillm's engines, per-request attention included, and may be the better
replacement. Then run the tests and the notebooks again: their simulated figures move with the profile.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import signal
import statistics
import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import torch

from minillm import workloads
from minillm.engines import BUILDERS, REQUESTS_AT_ONCE, build_engine
from minillm.kv.memory_budget import graphs_memory
from minillm.llm import LLM
from minillm.models.llama import CausalLM, ModelConfig
from minillm.models.loader import load_model
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.sim import simulate
from minillm.sim.calibrate import calibrate, fit_profile
from minillm.sim.cost_model import Profile, attention_pairs
from minillm.sim.model_shape import model_numbers

FLOAT32_TOLERANCE = 1e-4  # relative logit error, max|ours - hf| / max|hf|, as tests/test_model.py

RUN_BUDGET_S = 480  # the whole run, --notebooks included: 8 minutes of device time
MIN_SECTION_S = 10  # a section is not started with less of the run's budget left
# Seconds each section may take; all but the notebooks add up to 360, within the 6 minutes a device check may take.
BUDGETS = {
    "environment": 15,
    "correctness": 50,  # 22 s on the H200 (2026-12-04), before the fast path's compile
    "calibration": 20,  # 6 s there
    "step_curve": 55,
    "end_to_end": 60,
    "paged_attention": 15,  # 3 s on the H200
    "paged_step": 25,
    "kv_pool": 10,  # 2 s there
    "cuda_graphs": 35,  # 4 s there, before capture at start and the pieces (three engines capture now)
    "bench": 75,  # not yet finished on a GPU; a third minillm system since
    "notebooks": 300,  # only with --notebooks (or --notebooks-budget)
}


@dataclass(frozen=True)
class Settings:
    """What a run times and on what: ``FULL`` for the GPU, ``SMALL`` for a CPU check of the script."""

    device: str
    dtype: torch.dtype  # of the timed model (correctness uses float32 and bfloat16 on ``device``)
    profile_name: str  # the calibrated profile's name and file name
    shape: dict  # the timed model's shape, as a profile's "model"
    shipped_profile: str | None  # a shipped profile to compare against
    calibration_points: list | None  # (batch, new tokens, context); None: calibrate's GPU_POINTS
    calibration_repeats: int
    decode_batches: tuple
    decode_contexts: tuple
    decode_steps: int  # measured decode steps per (batch, context)
    paged_batches: tuple  # paged_step's decode batches, at the largest decode context
    prefill_tokens: tuple
    prefill_repeats: int
    anchor: dict  # workloads.anchor_benchmark's arguments for end_to_end
    max_num_seqs: int  # end_to_end's batch limit
    bench: dict  # minillm.benchmarks.bench.bench's model and workload
    notebooks: str  # which chapter notebooks ``--notebooks`` runs (a glob in notebooks/)


FULL = Settings(
    device="cuda",
    dtype=torch.bfloat16,
    profile_name="h200-qwen3-0.6b",
    shape=Profile.load("h200-qwen3-0.6b").model,
    shipped_profile="h200-qwen3-0.6b",
    calibration_points=None,
    calibration_repeats=5,
    decode_batches=(1, 8, 64, 256),
    decode_contexts=(256, 1024),
    decode_steps=6,
    paged_batches=(1, 32, 128),
    prefill_tokens=(128, 512, 2048),
    prefill_repeats=5,
    anchor=dict(num_requests=32, low=16, high=160),
    max_num_seqs=32,
    bench=dict(model="random:h200-qwen3-0.6b", workload="gpu-check", max_num_seqs=64),
    notebooks="*.ipynb",
)
SMALL = Settings(
    device="cpu",
    dtype=torch.float32,
    profile_name="cpu-gpu-check-small",
    shape=dict(
        model_type="qwen3",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
    shipped_profile=None,
    calibration_points=[(1, 1, 16), (4, 1, 64), (8, 1, 32), (1, 16, 0), (1, 64, 0), (2, 32, 0)],
    calibration_repeats=2,
    decode_batches=(1, 4),
    decode_contexts=(16, 64),
    decode_steps=4,
    paged_batches=(1, 4),
    prefill_tokens=(16, 64),
    prefill_repeats=3,
    anchor=dict(num_requests=8, low=8, high=32, vocab_size=512),
    max_num_seqs=8,
    bench=dict(model="tiny", workload="tiny", max_num_seqs=8),
    notebooks="00_*.ipynb",
)


def gpu_label(device_name: str) -> str:
    """The device's name as a file-name label: "NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    words = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-").split("-")
    return "-".join(w for w in words if w != "nvidia") or "gpu"


def full_settings(device_name: str | None) -> Settings:
    """``FULL``, its calibrated profile named for the GPU it runs on (an H100's figures must never
    pass for the H200's the shipped profile models); without a GPU, as it is."""
    if device_name is None:
        return FULL
    return replace(FULL, profile_name=f"{gpu_label(device_name)}-qwen3-0.6b")


@dataclass
class Check:
    """One run: its settings, where results go, and what later sections take from earlier ones."""

    settings: Settings
    out: Path
    profiles: dict = field(default_factory=dict)  # label -> Profile, for the simulator's predictions
    notebooks: str = ""  # the notebooks section's glob; "": the settings'
    notebooks_parallel: int = 0  # notebooks run at once; 0: gpu_notebooks.default_parallel()
    deadline: float = 0.0  # time.monotonic() at which the running section's time is up
    fast_path_error: str | None = None  # why the fast path failed in correctness: bench leaves it out
    _model: CausalLM | None = None

    def model(self) -> CausalLM:
        """The timed model, built once for step_curve and end_to_end."""
        if self._model is None:
            self._model = random_model(self.settings.shape, self.settings.dtype, self.settings.device)
        return self._model


class Skip(Exception):
    """A section that cannot run here, and why."""


class SectionTimeout(Exception):
    """A section that ran past its budget."""


def needs_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError as err:
        raise Skip(f"needs transformers, which does not import here ({err}); install transformers>=5") from err


def random_model(shape: dict, dtype: torch.dtype, device: str) -> CausalLM:
    """minillm's model of ``shape`` with random weights. ``ModelConfig.from_hf`` only reads
    attributes, so a namespace stands in for the transformers config: timing needs no transformers."""
    torch.manual_seed(0)
    with torch.device(device):
        return CausalLM(ModelConfig.from_hf(SimpleNamespace(rms_norm_eps=1e-6, **shape))).to(dtype).eval()


def run_engine(model: CausalLM, engine: str, workload: workloads.Workload, max_num_seqs: int, **options):
    """``workload`` through the real engine (what ``LLM.generate`` runs, without text); returns the
    requests, whose metrics hold their times, and the trace, one row per step."""
    eng = build_engine(engine, model, next(model.parameters()).device, None, max_num_seqs=max_num_seqs, **options)
    requests = [
        Request(str(i), p, sp, arrival_time=t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
    for r in requests:
        eng.add_request(r)
    eng.run_to_completion()
    return requests, eng.trace


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or platform.machine()} CPU"


# --- 1. environment ---------------------------------------------------------------------------


def environment(check: Check, entry: dict) -> None:
    import numpy

    entry.update(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        numpy=numpy.__version__,
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
    )  # "highest": no TF32 in float32 checks
    try:
        import transformers

        entry["transformers"] = transformers.__version__
    except ImportError as err:
        entry["transformers"] = None
        entry["missing"] = [
            f"transformers ({err}): correctness and calibration are skipped, and end_to_end has no simulated figures"
        ]
    if check.settings.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device: every later section will fail")
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        entry.update(
            device=device_name("cuda"),
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(total / 2**30, 1),
            free_gib=round(free / 2**30, 1),
        )
    else:
        entry["device"] = device_name("cpu")
    entry["summary"] = (
        f"{entry['device']}, torch {torch.__version__}, transformers {entry['transformers'] or 'MISSING'}"
    )


# --- 2. correctness ---------------------------------------------------------------------------

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,  # logits far from uniform
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
FAMILIES = {"qwen3": ("Qwen3Config", dict(head_dim=32)), "llama": ("LlamaConfig", {})}
PROMPT_LENS, MAX_TOKENS = [5, 17, 2, 11, 8, 23], [6, 2, 9, 4, 12, 7]


def tiny_hf_model(family: str):
    """A random transformers model, float32 on the CPU, with biases and norm weights perturbed: a
    missing or swapped parameter would hide behind all-zero biases and all-one norms."""
    import transformers

    config_class, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**TINY, **extra)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@torch.no_grad()
def correctness(check: Check, entry: dict) -> None:
    needs_transformers()
    device = check.settings.device
    failures, entry["logits"], entry["engines"] = [], [], []
    ids = torch.randint(0, TINY["vocab_size"], (3, 40), generator=torch.Generator().manual_seed(1)).to(device)
    positions = torch.arange(40, device=device).expand(3, 40)
    for family in FAMILIES:
        hf32 = tiny_hf_model(family).to(device)
        hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
        ref32, ref16 = hf32(ids).logits, hf16(ids).logits
        ours32, ours16 = (
            load_model(hf, dtype, torch.device(device))[0]
            for hf, dtype in ((hf32, torch.float32), (hf16, torch.bfloat16))
        )
        got32 = ours32.compute_logits(ours32(ids, positions))
        got16 = ours16.compute_logits(ours16(ids, positions))
        row = {
            "family": family,
            "float32_rel_err": rel_err(got32, ref32),
            "bfloat16_rel_err": rel_err(got16, ref16),
            # bfloat16 against float32: minillm's rounding error beside transformers' own
            "bfloat16_vs_float32": {"minillm": rel_err(got16, ref32), "transformers": rel_err(ref16, ref32)},
        }
        entry["logits"].append(row)
        if not row["float32_rel_err"] < FLOAT32_TOLERANCE:
            failures.append(f"{family} float32 logits differ by {row['float32_rel_err']:.1e}")

        prompts = [
            torch.randint(3, TINY["vocab_size"], (n,), generator=torch.Generator().manual_seed(n)).tolist()
            for n in PROMPT_LENS
        ]
        params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
        expected = None
        for engine in BUILDERS:  # naive first: the reference
            options = {REQUESTS_AT_ONCE[engine]: 3} if engine in REQUESTS_AT_ONCE else {}  # fewer slots than prompts
            llm = LLM(hf32, engine=engine, dtype="float32", device=device, **options)
            tokens = [o.token_ids for o in llm.generate(prompts, params)]
            expected = expected or tokens
            differ = [i for i, (t, e) in enumerate(zip(tokens, expected)) if t != e]
            entry["engines"].append(
                {"family": family, "engine": engine, "matches_naive": not differ, "differing_prompts": differ}
            )
            if differ:
                failures.append(f"{family} {engine} engine differs from naive on prompts {differ}")
        # CUDA graphs: decode steps from whole graphs, mixed steps from pieces, the naive tokens still
        graphed = LLM(hf32, engine="chunked", dtype="float32", device=device, max_num_seqs=3, cuda_graphs=True)
        same = [o.token_ids for o in graphed.generate(prompts, params)] == expected
        entry["engines"].append({"family": family, "engine": "chunked, cuda graphs", "matches_naive": same})
        if not same:
            failures.append(f"{family} CUDA graphs: the chunked engine's tokens differ from the naive engine's")
        # the fast path too (on a GPU: fused projections, the small ops compiled by torch.compile)
        start, row = time.perf_counter(), {"family": family, "engine": "chunked, fast path, cuda graphs"}
        try:
            options = dict(max_num_seqs=3, cuda_graphs=True, fast_path=True)
            fast = LLM(hf32, engine="chunked", dtype="float32", device=device, **options)
            row["fast_path"] = list(fast.llm_engine.runner.fast_path)
            same = [o.token_ids for o in fast.generate(prompts, params)] == expected
        except Exception as error:  # recorded, and the checks after it still run (bench leaves it out)
            row["error"], same = f"{type(error).__name__}: {str(error)[:300]}", False
            check.fast_path_error = row["error"]
        row.update(matches_naive=same, seconds_compiling_included=round(time.perf_counter() - start, 1))
        entry["engines"].append(row)
        if not same:
            why = row.get("error") or "the chunked engine's tokens differ from the naive's"
            failures.append(f"{family} fast path and graphs: {why}")
        # Sampling: the chunked engine draws a step's sampling requests together, the naive one alone;
        # each request's own generator must give it the same tokens either way (on a GPU too).
        sampled = [
            SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.8, top_k=20, top_p=0.9, seed=i)
            for i, m in enumerate(MAX_TOKENS)
        ]
        alone, together = (
            [o.token_ids for o in LLM(hf32, engine=e, dtype="float32", device=device).generate(prompts, sampled)]
            for e in ("naive", "chunked")
        )
        entry["engines"].append({"family": family, "engine": "chunked, sampling", "matches_naive": alone == together})
        if alone != together:
            failures.append(f"{family} sampling: the chunked engine's draws differ from the naive engine's")
        # Prefix caching: prompts that share a prefix, twice on one engine (the second call finds blocks).
        shared = [prompts[-1] + p for p in prompts]
        reference = [
            o.token_ids for o in LLM(hf32, engine="naive", dtype="float32", device=device).generate(shared, params)
        ]
        cached = LLM(hf32, engine="chunked", dtype="float32", device=device, enable_prefix_caching=True, max_num_seqs=3)
        runs = [cached.generate(shared, params) for _ in range(2)]
        same = all([o.token_ids for o in run] == reference for run in runs)
        hits = cached.stats()["prefix_cache_hits"]
        entry["engines"].append(
            {"family": family, "engine": "chunked, prefix caching", "matches_naive": same, "cached_tokens": hits}
        )
        if not same or not hits:
            failures.append(f"{family} prefix caching: same tokens {same}, {hits} cached tokens")
    entry["failures"] = failures
    worst32 = max(r["float32_rel_err"] for r in entry["logits"])
    worst16 = max(r["bfloat16_rel_err"] for r in entry["logits"])
    matching = sum(r["matches_naive"] for r in entry["engines"])
    entry["summary"] = (
        f"logits rel err float32 <= {worst32:.1e}, bfloat16 <= {worst16:.1e}; "
        f"{matching}/{len(entry['engines'])} engine runs give the naive tokens"
    )
    if failures:
        raise AssertionError("; ".join(failures))


# --- 3. calibration ---------------------------------------------------------------------------


def calibration(check: Check, entry: dict) -> None:
    needs_transformers()  # calibrate() builds its model from a transformers config
    s = check.settings
    profile = calibrate(
        s.shape,
        s.profile_name,
        s.device,
        s.dtype,
        points=s.calibration_points,
        repeats=s.calibration_repeats,
        notes="Random weights of the profile's model shape, timed by python -m minillm.benchmarks.gpu_check "
        "(padded [batch, new tokens] passes, one attention call per layer).",
    )
    path = check.out / f"{s.profile_name}.json"
    profile.save(path)
    check.profiles["calibrated"] = profile
    entry.update(
        profile_file=path.name,
        **profile_figures(profile),
        notes=profile.notes,
        points=[
            {
                "batch": p["batch"],
                "new_tokens": p["new_tokens"],
                "context": p["context"],
                "ms": round(p["seconds"] * 1e3, 3),
                "fitted_ms": round(p["fitted_seconds"] * 1e3, 3),
            }
            for p in profile.calibration_points
        ],
    )
    entry["summary"] = describe(profile)


def profile_figures(profile: Profile) -> dict:
    """A profile's fitted device numbers, in readable units, to 4 significant digits."""
    figures = {
        "memory_bandwidth_gb_s": profile.memory_bandwidth / 1e9,
        "peak_tflop_s": profile.peak_flops / 1e12,
        "forward_overhead_ms": profile.forward_overhead * 1e3,
        "seq_overhead_us": profile.seq_overhead * 1e6,
    }
    return {k: float(f"{v:.4g}") for k, v in figures.items()}


def describe(profile: Profile) -> str:
    f = profile_figures(profile)
    return (
        f"{f['memory_bandwidth_gb_s']:.4g} GB/s, {f['peak_tflop_s']:.4g} TFLOP/s, {f['forward_overhead_ms']:.2f} ms "
        f"per pass + {f['seq_overhead_us']:.1f} us per sequence; "
        f"{profile.notes.rsplit('Fitted by least squares: ', 1)[-1]}"
    )


# --- 4. step curve ----------------------------------------------------------------------------


def step_curve(check: Check, entry: dict) -> None:
    """Every step here is a real engine step, timed by the engine's own trace: the selective engine
    is the one whose single flat pass per step the simulator's flat-batch twin models."""
    s = check.settings
    model = check.model()
    vocab = s.shape["vocab_size"]
    run_engine(model, "selective", workloads.fixed([8], [4], vocab_size=vocab), 1)  # warm-up: lazy CUDA set-up
    rows = entry["rows"] = []
    measured = []  # (batch, new tokens, context, seconds) for the fit
    for context in s.decode_contexts:
        for batch in s.decode_batches:
            # ``batch`` prompts of ``context`` tokens: step 0 prefills them all, then one decode step per token.
            wl = workloads.fixed([context] * batch, [1 + s.decode_steps] * batch, vocab_size=vocab)
            _, trace = run_engine(model, "selective", wl, batch)
            decode = statistics.median(r.duration for r in trace.steps[2:])  # step 1 may still pick kernels
            rows.append(
                {
                    "kind": "decode_step",
                    "batch": batch,
                    "context": context,
                    "ms": round(decode * 1e3, 3),
                    "prefill_step_ms": round(trace.steps[0].duration * 1e3, 3),
                }
            )
            measured += [
                (batch, 1, context + s.decode_steps // 2, decode),
                (batch, context, 0, trace.steps[0].duration),
            ]
            print(f"  decode batch {batch:>3} context {context:>5}: {decode * 1e3:8.2f} ms", flush=True)
    for tokens in s.prefill_tokens:
        # One prompt at a time (max_num_seqs=1): each step is one prefill.
        wl = workloads.fixed([tokens] * s.prefill_repeats, [1] * s.prefill_repeats, vocab_size=vocab)
        _, trace = run_engine(model, "selective", wl, 1)
        prefill = statistics.median(r.duration for r in trace.steps[1:])
        rows.append({"kind": "prefill", "tokens": tokens, "ms": round(prefill * 1e3, 3)})
        measured.append((1, tokens, 0, prefill))
        print(f"  prefill {tokens:>5} tokens: {prefill * 1e3:8.2f} ms", flush=True)

    # A profile fitted to the engine's steps: what the simulator needs to predict this engine.
    points = [{"batch": b, "new_tokens": n, "context": c, "seconds": t} for b, n, c, t in measured]
    fitted = fit_profile(
        s.profile_name,
        s.shape,
        model_numbers(model, s.dtype.itemsize),
        points,
        notes=f"Fitted to the selective engine's own steps (scheduler, flat batch, per-request attention, "
        f"sampling) on {device_name(s.device)}, torch {torch.__version__}, {s.dtype}, random weights, "
        "by python -m minillm.benchmarks.gpu_check.",
    )
    path = check.out / f"{s.profile_name}.engine-steps.json"
    fitted.save(path)
    check.profiles["engine_steps"] = fitted
    for label, profile in profiles_to_compare(check).items():
        for row in rows:
            b, n, c = (row["batch"], 1, row["context"]) if row["kind"] == "decode_step" else (1, row["tokens"], 0)
            row[f"{label}_ms"] = round(profile.forward_time(b, b * n, b * (c + n), b * attention_pairs(c, n)) * 1e3, 3)
    entry.update(engine_steps_profile_file=path.name, engine_steps_profile=profile_figures(fitted))
    decodes = [row for row in rows if row["kind"] == "decode_step"]
    first, last = decodes[0], decodes[-1]
    entry["summary"] = (
        f"decode {first['ms']:.1f} ms (batch {first['batch']}, context {first['context']}) .. "
        f"{last['ms']:.1f} ms (batch {last['batch']}, context {last['context']}); "
        f"prefill {rows[-1]['tokens']} tokens {rows[-1]['ms']:.1f} ms; fit: {describe(fitted)}"
    )


def profiles_to_compare(check: Check) -> dict:
    """The shipped profile (its assumed overheads), then those measured in this run."""
    shipped = {"shipped": Profile.load(check.settings.shipped_profile)} if check.settings.shipped_profile else {}
    return {**shipped, **check.profiles}


# --- 5. end to end ----------------------------------------------------------------------------


def end_to_end(check: Check, entry: dict) -> None:
    s = check.settings
    wl = workloads.anchor_benchmark(**s.anchor)
    entry["workload"] = {
        "anchor_benchmark": s.anchor,
        "prompt_tokens": wl.num_prompt_tokens,
        "output_tokens": wl.num_output_tokens,
        "max_num_seqs": s.max_num_seqs,
    }
    model = check.model()
    rows = entry["engines"] = []
    for engine in ("selective", "paged", "chunked", "continuous"):  # a run cut short by the budget keeps the first
        requests, trace = run_engine(model, engine, wl, s.max_num_seqs)
        seconds = max(r.metrics.finished_time for r in requests)
        tokens = sum(len(r.output_token_ids) for r in requests)
        row = {
            "engine": engine,
            "seconds": round(seconds, 3),
            "output_tok_s": round(tokens / seconds, 1),
            "steps": len(trace),
            "mean_step_ms": round(seconds / len(trace) * 1e3, 3),
            "simulated": {},
        }
        rows.append(row)
        print(f"  {engine}: {row['output_tok_s']} output tok/s in {seconds:.1f} s", flush=True)
        try:
            needs_transformers()  # the simulator builds its weightless model from a transformers config
        except Skip as why:
            entry["simulator"] = str(why)
            continue
        for label, profile in profiles_to_compare(check).items():
            result = simulate(engine, wl, profile, max_num_seqs=s.max_num_seqs)
            row["simulated"][label] = {
                "seconds": round(result.summary["duration_seconds"], 3),
                "output_tok_s": round(result.summary["output_throughput_tokens_per_second"], 1),
                "steps": len(result.trace),
            }  # the real run's steps: the same scheduler decided
    entry["summary"] = "; ".join(
        f"{r['engine']} {r['output_tok_s']:.0f} tok/s (simulated: "
        + (", ".join(f"{k} {v['output_tok_s']:.0f}" for k, v in r["simulated"].items()) or "none")
        + ")"
        for r in rows
    )


# --- 6. paged attention kernel ------------------------------------------------------------------

# Qwen3-0.6B's attention: 16 query heads share 8 KV heads of 128 dims; the cache in vLLM's layout.
PAGED = dict(num_heads=16, num_kv_heads=8, head_dim=128, block_size=16)
PAGED_FULL = dict(batches=(1, 16, 64, 256), contexts=(512, 2048, 8192), repeats=10)
PAGED_SMALL = dict(batches=(1, 4), contexts=(32, 64), repeats=2)  # the reference on the CPU: checks the code path
PAGED_TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 3e-2}  # max|err| / max|ref|


def paged_batch(seq_lens, q_lens, dtype, device, num_blocks, seed=0, caches=None):
    """Random q and pool (or the given ``caches``) with shuffled block tables, as an allocator hands
    them out after some churn."""
    gen = torch.Generator(device=device).manual_seed(seed)
    bs, kvh, d = PAGED["block_size"], PAGED["num_kv_heads"], PAGED["head_dim"]
    need = [-(-s // bs) for s in seq_lens]
    k_cache, v_cache = caches or (
        torch.randn(num_blocks, bs, kvh, d, generator=gen, device=device, dtype=dtype) for _ in range(2)
    )
    perm = torch.randperm(num_blocks, generator=gen, device=device)[: sum(need)].to(torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(need), dtype=torch.int32, device=device)
    for i, chunk in enumerate(perm.split(need)):
        block_tables[i, : len(chunk)] = chunk
    q = torch.randn(sum(q_lens), PAGED["num_heads"], d, generator=gen, device=device, dtype=dtype)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=qsl,
        scale=d**-0.5,
    )


def time_call(fn, device: str, repeats: int) -> float:
    """Seconds per call, after a warm-up call (which also compiles a Triton kernel)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


@torch.no_grad()
def paged_attention_check(check: Check, entry: dict) -> None:
    """The Triton kernel against the reference in float32/16/bfloat16 on a mixed step, then decode
    bandwidth: (K/V bytes read + q + out) / time, beside a plain device copy's bandwidth. On the CPU
    (SMALL) the reference stands in for the kernel, at tiny sizes, so the code path stays checked."""
    from minillm.kernels import paged_attention

    device = check.settings.device
    backend = "triton" if device == "cuda" else "torch"
    sizes = PAGED_SMALL if check.settings is SMALL else PAGED_FULL
    entry.update(backend=backend, shape=PAGED, accuracy=[], rows=[])
    failures = []
    # a mixed step: prefill chunks, decodes, a chunk in mid-context, lengths off the block grid
    seq_lens, q_lens = [77, 1, 300, 45, 129, 16], [77, 1, 40, 1, 1, 16]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        batch = paged_batch(seq_lens, q_lens, dtype, device, num_blocks=64, seed=1)
        got = paged_attention(**batch, backend=backend)
        exact = paged_attention(**{k: v.double() if k in ("q", "k_cache", "v_cache") else v for k, v in batch.items()})
        err = rel_err(got, exact)
        ok = bool(err < PAGED_TOLERANCE[dtype]) and not got.isnan().any().item()
        entry["accuracy"].append({"dtype": str(dtype), "rel_err": err, "tolerance": PAGED_TOLERANCE[dtype], "ok": ok})
        if not ok:
            failures.append(f"{dtype} rel err {err:.1e}")

    dtype = check.settings.dtype
    elem = torch.tensor([], dtype=dtype).element_size()
    if device == "cuda":  # a copy reads and writes each byte: the bandwidth a memory-bound kernel can hope for
        src = torch.empty(2**30 // elem, dtype=dtype, device=device)
        dst = torch.empty_like(src)
        entry["copy_gb_s"] = round(2 * src.numel() * elem / time_call(lambda: dst.copy_(src), device, 10) / 1e9, 1)
        del src, dst
    most = max(sizes["batches"]) * -(-max(sizes["contexts"]) // PAGED["block_size"])
    pool = paged_batch([PAGED["block_size"]], [1], dtype, device, num_blocks=most)  # one pool for every row
    caches = (pool["k_cache"], pool["v_cache"])
    for context in sizes["contexts"]:
        for batch_size in sizes["batches"]:
            batch = paged_batch(
                [context] * batch_size,
                [1] * batch_size,
                dtype,
                device,
                num_blocks=most,
                seed=context + batch_size,
                caches=caches,
            )
            seconds = time_call(lambda b=batch: paged_attention(**b, backend=backend), device, sizes["repeats"])
            kv_bytes = 2 * batch_size * context * PAGED["num_kv_heads"] * PAGED["head_dim"] * elem
            q_out_bytes = 2 * batch["q"].numel() * elem
            entry["rows"].append(
                {
                    "batch": batch_size,
                    "context": context,
                    "us": round(seconds * 1e6, 1),
                    "gb_s": round((kv_bytes + q_out_bytes) / seconds / 1e9, 1),
                }
            )
            del batch
    best = max(entry["rows"], key=lambda r: r["gb_s"])
    entry["failures"] = failures
    entry["summary"] = (
        f"{backend}: rel err "
        + ", ".join(f"{a['dtype'].split('.')[-1]} {a['rel_err']:.0e}" for a in entry["accuracy"])
        + f"; decode best {best['gb_s']} GB/s (batch {best['batch']}, context {best['context']})"
        + (f" vs copy {entry['copy_gb_s']} GB/s" if "copy_gb_s" in entry else "")
    )
    if failures:
        raise AssertionError("; ".join(failures))


# --- 7. paged step -----------------------------------------------------------------------------


def paged_step(check: Check, entry: dict) -> None:
    """Decode steps of the paged engine (one paged-attention call per layer for the whole batch)
    against the selective engine's (attention per request, in Python), same model, same requests,
    one run each per batch, in turn; each figure is the median decode step of its run. The goal for
    chapter 5: paged faster at batch >= 32."""
    s = check.settings
    model, vocab, context = check.model(), s.shape["vocab_size"], max(s.decode_contexts)
    rows = entry["rows"] = []
    for batch in s.paged_batches:
        wl = workloads.fixed([context] * batch, [1 + s.decode_steps] * batch, vocab_size=vocab)
        blocks = batch * -(-(context + s.decode_steps + 1) // 16) + 1  # every request's blocks, at once
        row = {"batch": batch, "context": context}
        for engine, options in (("selective", {}), ("paged", {"num_gpu_blocks": blocks})):
            _, trace = run_engine(model, engine, wl, batch, **options)
            row[f"{engine}_ms"] = round(statistics.median(r.duration for r in trace.steps[2:]) * 1e3, 3)
        row["speedup"] = round(row["selective_ms"] / row["paged_ms"], 2)
        rows.append(row)
        print(
            f"  decode batch {batch:>3} context {context}: selective {row['selective_ms']:.2f} ms, "
            f"paged {row['paged_ms']:.2f} ms",
            flush=True,
        )
    big = [r for r in rows if r["batch"] >= 32]
    entry["paged_faster_at_batch_32_plus"] = all(r["speedup"] > 1 for r in big) if big else None
    entry["summary"] = "; ".join(
        f"batch {r['batch']}: paged {r['paged_ms']:.1f} ms vs selective {r['selective_ms']:.1f} ms" for r in rows
    )


def kv_pool(check: Check, entry: dict) -> None:
    """Three calls on one ``LLM`` sized by ``gpu_memory_utilization``: every call finds the same pool
    (storage, blocks) empty, and the memory PyTorch reserves does not grow from call to call."""
    needs_transformers()
    from minillm.llm import LLM

    device = check.settings.device
    budget = {"gpu_memory_utilization": 0.5} if device == "cuda" else {"kv_cache_memory_bytes": 1 << 22}
    llm = LLM(
        tiny_hf_model("qwen3"),
        engine="chunked",
        device=device,
        dtype="bfloat16" if device == "cuda" else None,
        **budget,
    )
    runner = llm.llm_engine.runner
    pool = [t.data_ptr() for t in runner.k_caches]
    prompts = [[(7 * i + j) % TINY["vocab_size"] for j in range(16 + 8 * i)] for i in range(8)]
    rows = entry["calls"] = []
    for call in range(3):
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
        stats = llm.stats()
        rows.append(
            {
                "call": call,
                "output_tokens": sum(len(o.token_ids) for o in outputs),
                "same_pool": [t.data_ptr() for t in runner.k_caches] == pool,
                "num_free_blocks": stats["num_free_blocks"],
                "num_total_blocks": stats["num_total_blocks"],
                "reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1) if device == "cuda" else None,
            }
        )
    entry["one_pool_for_every_call"] = all(
        r["same_pool"] and r["num_free_blocks"] == r["num_total_blocks"] for r in rows
    )
    entry["summary"] = (
        f"{rows[0]['num_total_blocks']:,} blocks; the same pool, empty after each of 3 calls: "
        f"{entry['one_pool_for_every_call']}; reserved MiB per call: {[r['reserved_mib'] for r in rows]}"
    )


# --- 9. CUDA graphs ---------------------------------------------------------------------------


def cuda_graphs(check: Check, entry: dict) -> None:
    """Graphs replay the eager step's arithmetic: the same greedy tokens (decode steps from whole
    graphs, mixed ones from pieces), the mixed steps' median time both ways; then batch 1's step."""
    model, s = check.model(), check.settings
    vocab = s.shape["vocab_size"]
    wl = workloads.anchor_benchmark(num_requests=12, low=8, high=40, vocab_size=vocab)
    tokens, mixed_ms = {}, entry.setdefault("mixed_step_ms", {})
    for label, graphs in (("eager", False), ("graphs", True)):
        requests, trace = run_engine(model, "chunked", wl, s.max_num_seqs, cuda_graphs=graphs)
        tokens[label] = [r.output_token_ids for r in requests]
        mixed_ms[label] = round(statistics.median(t.duration for t in trace if t.prefill_ids) * 1e3, 3)
    entry["same_greedy_tokens"] = tokens["graphs"] == tokens["eager"]
    runner = build_engine("chunked", model, s.device, None, max_num_seqs=s.max_num_seqs, cuda_graphs=True).runner
    largest = max(runner.graphs.sizes[-1], runner.piecewise.sizes[-1])
    entry["capture"] = {
        "decode_sizes": len(runner.graphs.sizes),
        "mixed_sizes": len(runner.piecewise.sizes),
        "seconds": round(runner.graph_capture_seconds, 3),
        "memory_mib": round(runner.graph_memory_bytes / 2**20, 1),
        "estimate_mib": round(graphs_memory(model, s.device, largest) / 2**20, 1) if s.device == "cuda" else None,
    }
    one = workloads.Workload([[1] * 64], [SamplingParams(max_tokens=48, ignore_eos=True)], [0.0])
    step_ms, syncs = entry["batch1_decode_step_ms"], entry["host_syncs_per_step"] = {}, {}
    # last, the fast path with graphs (on a GPU its small ops compiled, when the engine is built)
    for label, graphs, fast in (("eager", False, False), ("graphs", True, False), ("fast path + graphs", True, True)):
        try:
            with count_host_syncs(s.device) as warned:
                options = dict(cuda_graphs=graphs, fast_path=fast, max_num_batched_tokens=128)
                _, trace = run_engine(model, "chunked", one, 1, **options)
        except Exception as error:  # recorded: the compiler may not suit this device's software
            if not fast:
                raise
            step_ms[label] = f"failed ({type(error).__name__}: {str(error)[:200]})"
            continue
        step_ms[label] = round(statistics.median(t.duration for t in trace[8:] if not t.prefill_ids) * 1e3, 3)
        synced = [w for w in warned if "synchroniz" in str(w.message)]  # torch's sync-debug warnings only
        syncs[label] = round(len(synced) / len(trace), 2) if s.device == "cuda" else None
    capture = entry["capture"]
    entry["summary"] = (
        f"same greedy tokens: {entry['same_greedy_tokens']}; mixed steps {mixed_ms['eager']} ms eager, "
        f"{mixed_ms['graphs']} ms in pieces; batch-1 decode step {step_ms['eager']} ms eager, "
        f"{step_ms['graphs']} ms with graphs, {step_ms['fast path + graphs']} ms with the fast path too; "
        f"host syncs per step {syncs}; {capture['decode_sizes']} decode and "
        f"{capture['mixed_sizes']} mixed sizes captured at start in {capture['seconds']} s, "
        f"{capture['memory_mib']} MiB (estimated {capture['estimate_mib']})"
    )


@contextmanager
def count_host_syncs(device: str):
    """The synchronising CUDA calls made inside, as warnings (``torch.cuda.set_sync_debug_mode``);
    the list stays empty off CUDA. The fast path's aim: one per step, the sampled tokens' copy."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield warned
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")


# --- 10. minillm bench -------------------------------------------------------------------------


def bench_section(check: Check, entry: dict) -> None:
    """The chunked engine, eager, with chapter 9's fast path (on a GPU its ``fused`` and ``compiled``
    steps) and with CUDA graphs too, and transformers' two batchings on one workload, in this process."""
    needs_transformers()
    from minillm.benchmarks import bench

    s = check.settings
    engines = ("chunked", "chunked:fast", "chunked:fast+graphs")
    if check.fast_path_error:  # one system that cannot run would end the whole comparison
        engines = ("chunked", "chunked:graphs")
        entry["left_out"] = f"the fast path, which failed in correctness: {check.fast_path_error}"
    report = bench.bench(engines=engines, device=s.device, dtype=s.dtype, **s.bench)
    entry["report"] = report
    entry["summary"] = (
        ("without the fast path (it failed); " if check.fast_path_error else "")
        + "; ".join(f"{x['system']} {x['output_tok_s']:,.0f} tok/s" for x in report["systems"])
        + (f"; the floor {report['floor']['floor_output_tok_s']:,.0f} tok/s ({report['floor']['bound']}-bound)")
    )


# --- 11. the chapters (--notebooks) -----------------------------------------------------------


def notebooks(check: Check, entry: dict) -> None:
    """Every chapter notebook in small mode on this device; the executed copies go to ``DIR/notebooks``."""
    from minillm.benchmarks.gpu_notebooks import default_parallel, run_notebooks

    parallel = check.notebooks_parallel or default_parallel()
    left = check.deadline - time.monotonic() - 5  # its own deadline first: it stops the kernels still running
    rows = entry["rows"] = run_notebooks(check.out / "notebooks", left, check.notebooks, parallel=parallel)
    entry["parallel"] = parallel
    counts = {status: sum(r["status"] == status for r in rows) for status in ("ok", "error", "not run")}
    entry["failed"] = [r["notebook"] for r in rows if r["status"] == "error"]
    entry["summary"] = ", ".join(f"{n} {status}" for status, n in counts.items() if n) + (
        f" (failed: {', '.join(entry['failed'])})" if entry["failed"] else ""
    )


SECTIONS = {
    "environment": environment,
    "correctness": correctness,
    "calibration": calibration,
    "step_curve": step_curve,
    "end_to_end": end_to_end,
    "paged_attention": paged_attention_check,
    "paged_step": paged_step,
    "kv_pool": kv_pool,
    "cuda_graphs": cuda_graphs,
    "bench": bench_section,
    "notebooks": notebooks,
}
DEFAULT_SECTIONS = tuple(name for name in SECTIONS if name != "notebooks")


# --- running the sections ---------------------------------------------------------------------


@contextmanager
def time_limit(seconds: float):
    """Raise ``SectionTimeout`` once ``seconds`` have passed. SIGALRM interrupts Python code (the
    engine loop) between operations; a single kernel finishes first, which takes under a second.
    Not used off the main thread, or where an alarm is already set (pytest-timeout sets one)."""
    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def on_alarm(signum, frame):
        raise SectionTimeout(f"ran past its {seconds:.0f} s budget")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_sections(
    settings: Settings,
    out: Path,
    sections=DEFAULT_SECTIONS,
    notebooks: str = "",
    budget_s: float = RUN_BUDGET_S,
    notebooks_parallel: int = 0,
) -> dict:
    """Run ``sections`` in order, each within its budget and all within ``budget_s`` (a section left
    with under ``MIN_SECTION_S`` is skipped); write ``out/gpu_check.json`` after each one; return the
    report."""
    out.mkdir(parents=True, exist_ok=True)
    check = Check(settings, out, notebooks=notebooks or settings.notebooks, notebooks_parallel=notebooks_parallel)
    run_deadline = time.monotonic() + budget_s
    report = {
        "mode": "small" if settings is SMALL else "full",
        "device": settings.device,
        "dtype": str(settings.dtype),
        "model_shape": settings.shape,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    for name in sections:
        print(f"{name} ...", flush=True)
        entry, start = {}, time.perf_counter()
        run_left = run_deadline - time.monotonic()
        seconds = min(BUDGETS[name], run_left)
        check.deadline = time.monotonic() + seconds
        try:
            if run_left < MIN_SECTION_S:
                raise Skip(f"the run's {budget_s:.0f} s were spent")
            with time_limit(seconds):
                SECTIONS[name](check, entry)
            status = "ok"
        except Skip as why:
            status, entry["summary"] = "skipped", str(why)
        except Exception as err:  # any failure is recorded, and the next section runs
            status = "error"
            entry["error"] = f"{type(err).__name__}: {err}"
            entry["traceback"] = traceback.format_exc(limit=-6)
            entry.setdefault("summary", entry["error"])
        report[name] = {"status": status, "seconds": round(time.perf_counter() - start, 2), **entry}
        if settings.device == "cuda":
            torch.cuda.empty_cache()  # the next section starts with the memory this one held
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"{name:<12} {status:<7} {report[name]['seconds']:7.1f} s  {report[name]['summary']}", flush=True)
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for gpu_check.json and the profiles")
    parser.add_argument("--small", action="store_true", help="tiny shapes on the CPU in float32: checks the script")
    parser.add_argument(
        "--sections", default=",".join(DEFAULT_SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}"
    )
    parser.add_argument(
        "--notebooks", nargs="?", const="", metavar="GLOB", help="then run the chapter notebooks (all, or GLOB's)"
    )
    parser.add_argument("--notebooks-budget", type=float, help=f"seconds for them (default {BUDGETS['notebooks']})")
    parser.add_argument(
        "--notebooks-parallel",
        type=int,
        default=0,
        help="notebooks run at once (default: 1 on a CPU, up to 4 on a GPU)",
    )
    parser.add_argument(
        "--budget", type=float, default=RUN_BUDGET_S, help=f"seconds for the whole run ({RUN_BUDGET_S})"
    )
    args = parser.parse_args(argv)
    if args.notebooks_parallel < 0:
        parser.error(f"--notebooks-parallel must be >= 1 (0: the default), got {args.notebooks_parallel}")
    if not args.budget > 0:
        parser.error(f"--budget must be a number of seconds above 0, got {args.budget:g}")
    if args.notebooks_budget:
        BUDGETS["notebooks"] = args.notebooks_budget
    sections = args.sections.split(",") + (["notebooks"] if args.notebooks is not None else [])
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    start = time.perf_counter()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    settings = SMALL if args.small else full_settings(gpu)
    report = run_sections(settings, args.out, sections, args.notebooks or "", args.budget, args.notebooks_parallel)
    bad = [name for name in sections if report[name]["status"] != "ok"]
    print(
        f"{time.perf_counter() - start:.1f} s in all; {args.out / 'gpu_check.json'}"
        + (f"; not ok: {', '.join(bad)}" if bad else "; all sections ok")
    )


if __name__ == "__main__":
    main()
