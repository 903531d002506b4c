"""The engines: one module per chapter's engine, and the registry that builds them by name. Each
engine is a (scheduler, runner) pair run by the one engine loop (``minillm.llm_engine``).

    engine      scheduler                   runner                  chapter   module
    naive       one request at a time       one pass per request    1         naive.py
    static      static / dynamic batches    one padded [B, T] pass  2         static.py
    continuous  iteration-level (Orca)      a pass per new prompt,  3         continuous.py
                                            one for all decodes
    selective   iteration-level (Orca)      one flat token pass     4         selective.py (runner)
    paged       iteration-level + paged KV  one flat token pass     5         paged.py
                blocks, preemption          over per-layer block
                (recompute / swap)          pools, paged attention
    chunked     paged + a token budget per  the paged runner: a     6         chunked.py (scheduler)
                step: decodes first, long   prompt's chunk attends
                prompts cut into chunks     to its cached tokens
    sglang      SGLang's policy             the paged runner        8b        sglang.py (scheduler)
    trtllm      TensorRT-LLM's policies     the paged runner        8b        trtllm.py (scheduler)
    tgi         TGI's batching loop         the paged runner        8b        tgi.py (scheduler)

``scheduler_cls=`` / ``runner_cls=`` swap in your own scheduler / runner class: the course's exercises
run inside the real engine this way, e.g.
``LLM("tiny", engine="continuous", scheduler_cls=IterationLevelScheduler)``. Any class that has what
the engine loop uses (``SCHEDULER_CONTRACT`` / ``RUNNER_CONTRACT``) fits; it need not extend the
engine's own.

Engine options go to the scheduler; the ones in ``RUNNER_OPTIONS`` (the KV pool's shape and the
attention backend of the paged and chunked engines) also go to the runner, and ``RUNNER_ONLY_OPTIONS`` only there.
The paged engine's ``num_gpu_blocks=None`` sizes the pool for 8192 tokens
(``minillm.engines.paged.DEFAULT_NUM_KV_TOKENS``); ``kv_cache_memory_bytes`` (any device) or
``gpu_memory_utilization`` (CUDA) size it by memory instead (``minillm.kv.memory_budget``).
``attention_backend=None`` is Triton on CUDA, the PyTorch implementation elsewhere (``"cpu"`` when
the fast path's ``cpu_attention`` step is on); ``cuda_graphs=True`` replays decode-only steps from
CUDA graphs (``minillm.engines.cuda_graphs``; stand-ins on a CPU); ``fast_path=True`` (or a list of
its steps) runs the model with fused projections and, on a CPU, prepacked oneDNN matmuls and the C
attention kernels (``minillm.models.fast_model``: chapter 9's fast path);
``tensor_parallel_size=N`` splits the model across N processes (``minillm.distributed``: chapter 10;
on a CPU, with gloo). The chunked engine
takes the paged engine's options plus ``max_num_batched_tokens`` (the tokens one step may compute;
512, vLLM's first chunked-prefill default) and ``long_prefill_token_threshold`` (the most one
request takes of a step; 0: no cap). Both take ``enable_prefix_caching`` (vLLM's name; off by
default, so chapters 5, 6 and 8 measure without it): requests share the cached blocks of a common prefix
(``minillm.kv.prefix_cache``).

``sglang``, ``trtllm`` and ``tgi`` are those servers' scheduling policies on the paged engine, each
under its own server's option names and defaults (chapter 8b), beside the paged runner's options.
"""

from __future__ import annotations

import inspect
from functools import partial

from minillm.distributed.tensor_parallel import check_tensor_parallel_size
from minillm.engines.chunked import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    ChunkedPrefillScheduler,
    check_long_prefill_token_threshold,
    check_max_num_batched_tokens,
)
from minillm.engines.continuous import ContinuousBatchRunner, ContinuousBatchScheduler, check_num_kv_tokens
from minillm.engines.cuda_graphs import capture_sizes
from minillm.engines.naive import ModelRunner, NaiveScheduler
from minillm.engines.paged import (
    DEFAULT_BLOCK_SIZE,
    PagedRunner,
    PagedScheduler,
    check_attention_backend,
    check_cuda_graphs,
    check_enable_prefix_caching,
    check_preemption_mode,
    check_tensor_parallel_options,
)
from minillm.engines.selective import SelectiveBatchRunner
from minillm.engines.sglang import (
    DEFAULT_CHUNKED_PREFILL_SIZE,
    DEFAULT_MAX_PREFILL_TOKENS,
    SGLangScheduler,
    check_chunked_prefill_size,
    check_schedule_conservativeness,
    check_schedule_policy,
)
from minillm.engines.static import PaddedBatchRunner, StaticBatchScheduler, check_max_queue_delay
from minillm.engines.tgi import (
    DEFAULT_MAX_BATCH_PREFILL_TOKENS,
    DEFAULT_MAX_WAITING_TOKENS,
    DEFAULT_WAITING_SERVED_RATIO,
    TGIScheduler,
    check_waiting_served_ratio,
)
from minillm.engines.trtllm import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_TOKENS,
    DEFAULT_TOKENS_PER_BLOCK,
    TRTLLMScheduler,
    check_capacity_scheduler_policy,
)
from minillm.kv.block_manager import check_block_size, check_num_gpu_blocks
from minillm.kv.memory_budget import check_memory_options, resolve_kv_memory
from minillm.llm_engine import Engine
from minillm.models.fast_model import check_fast_path
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS, check_count, check_flag, check_max_num_seqs

# name -> the chapter that builds it
ENGINE_CHAPTERS = {
    "naive": 1,
    "static": 2,
    "continuous": 3,
    "selective": 4,
    "paged": 5,
    "chunked": 6,
    "sglang": "8b",
    "trtllm": "8b",
    "tgi": "8b",
}

# name -> the engine options it takes (vLLM's names where vLLM has one) and their defaults
ENGINE_OPTIONS = {
    "naive": {},
    "static": {"max_num_seqs": DEFAULT_MAX_NUM_SEQS, "max_queue_delay": None},
    "continuous": {"max_num_seqs": DEFAULT_MAX_NUM_SEQS, "num_kv_tokens": None},
    "selective": {"max_num_seqs": DEFAULT_MAX_NUM_SEQS, "num_kv_tokens": None},
    "paged": {
        "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
        "block_size": DEFAULT_BLOCK_SIZE,
        "num_gpu_blocks": None,
        "kv_cache_memory_bytes": None,
        "gpu_memory_utilization": None,
        "preemption_mode": "recompute",
        "enable_prefix_caching": False,
        "attention_backend": None,
        "cuda_graphs": False,
        "fast_path": False,
        "tensor_parallel_size": 1,
    },
    "chunked": {
        "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
        "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "long_prefill_token_threshold": 0,
        "block_size": DEFAULT_BLOCK_SIZE,
        "num_gpu_blocks": None,
        "kv_cache_memory_bytes": None,
        "gpu_memory_utilization": None,
        "preemption_mode": "recompute",
        "enable_prefix_caching": False,
        "attention_backend": None,
        "cuda_graphs": False,
        "fast_path": False,
        "tensor_parallel_size": 1,
    },
}

# name -> the engine options its runner is built with (after ``model, device``), and those of them
# the scheduler does not take
# the paged runner's options, which every server's policy below also takes
_PAGED_RUNNER_DEFAULTS = {
    "num_gpu_blocks": None,
    "kv_cache_memory_bytes": None,
    "gpu_memory_utilization": None,
    "attention_backend": None,
    "cuda_graphs": False,
    "fast_path": False,
    "tensor_parallel_size": 1,
}
# Other servers' policies on the paged engine, under their own option names (chapter 8b): each
# server's defaults, except the pool, which is minillm's (``num_gpu_blocks``).
ENGINE_OPTIONS |= {
    "sglang": {
        "schedule_policy": "fcfs",
        "schedule_conservativeness": 1.0,
        "chunked_prefill_size": DEFAULT_CHUNKED_PREFILL_SIZE,
        "max_prefill_tokens": DEFAULT_MAX_PREFILL_TOKENS,
        "max_running_requests": None,
        "enable_mixed_chunk": False,
        "disable_radix_cache": False,
        "block_size": DEFAULT_BLOCK_SIZE,
        **_PAGED_RUNNER_DEFAULTS,
    },
    "trtllm": {
        "capacity_scheduler_policy": "GUARANTEED_NO_EVICT",
        "max_batch_size": DEFAULT_MAX_BATCH_SIZE,
        "max_num_tokens": DEFAULT_MAX_NUM_TOKENS,
        "enable_chunked_prefill": False,
        "block_size": DEFAULT_TOKENS_PER_BLOCK,
        **_PAGED_RUNNER_DEFAULTS,
    },
    "tgi": {
        "max_batch_prefill_tokens": DEFAULT_MAX_BATCH_PREFILL_TOKENS,
        "waiting_served_ratio": DEFAULT_WAITING_SERVED_RATIO,
        "max_waiting_tokens": DEFAULT_MAX_WAITING_TOKENS,
        "max_batch_size": None,
        "prefill_chunking": True,
        "block_size": DEFAULT_BLOCK_SIZE,
        **_PAGED_RUNNER_DEFAULTS,
    },
}

# engine -> the option that bounds how many requests run at once, under that engine's name for it
# (the naive engine runs one at a time)
REQUESTS_AT_ONCE = {name: "max_num_seqs" for name, options in ENGINE_OPTIONS.items() if "max_num_seqs" in options}
REQUESTS_AT_ONCE |= {"sglang": "max_running_requests", "trtllm": "max_batch_size", "tgi": "max_batch_size"}

PAGED_ENGINES = ("paged", "chunked", "sglang", "trtllm", "tgi")  # those the paged runner runs
RUNNER_OPTIONS = {
    name: ("block_size", "num_gpu_blocks", "attention_backend", "cuda_graphs", "fast_path", "tensor_parallel_size")
    for name in PAGED_ENGINES
}
RUNNER_ONLY_OPTIONS = {
    name: ("attention_backend", "cuda_graphs", "fast_path", "tensor_parallel_size") for name in PAGED_ENGINES
}


# name -> the (scheduler class, runner class) pair that builds it
BUILDERS = {
    "naive": (NaiveScheduler, ModelRunner),
    "static": (StaticBatchScheduler, PaddedBatchRunner),
    "continuous": (ContinuousBatchScheduler, ContinuousBatchRunner),
    "selective": (ContinuousBatchScheduler, SelectiveBatchRunner),
    "paged": (PagedScheduler, PagedRunner),
    "chunked": (ChunkedPrefillScheduler, PagedRunner),  # the paged runner computes a chunk as it is
    "sglang": (SGLangScheduler, PagedRunner),
    "trtllm": (TRTLLMScheduler, PagedRunner),
    "tgi": (TGIScheduler, PagedRunner),
}


# What the engine loop (``minillm.llm_engine.Engine``), ``LLM`` and the server use of a scheduler (what
# ``minillm.scheduler.Scheduler`` declares) and of a runner.
SCHEDULER_CONTRACT = (
    "check_request",
    "add_request",
    "finish_requests",
    "has_unfinished_requests",
    "schedule",
    "stats",
    "changed_block_tables",
    "waiting",
    "running",
    "requests",
    "kv_capacity_tokens",
    "num_gpu_blocks",
    "block_size",
    "enable_prefix_caching",
)
RUNNER_CONTRACT = ("execute_model", "free", "kv_tokens", "kv_allocated_tokens")

# option -> the check of its value (a ValueError naming the option); None passes where it is the default
OPTION_CHECKS = {
    "max_num_seqs": check_max_num_seqs,
    "max_queue_delay": check_max_queue_delay,
    "num_kv_tokens": check_num_kv_tokens,
    "block_size": check_block_size,
    "num_gpu_blocks": check_num_gpu_blocks,
    "preemption_mode": check_preemption_mode,
    "enable_prefix_caching": check_enable_prefix_caching,
    "max_num_batched_tokens": check_max_num_batched_tokens,
    "long_prefill_token_threshold": check_long_prefill_token_threshold,
    "cuda_graphs": check_cuda_graphs,
    "fast_path": check_fast_path,
    "tensor_parallel_size": check_tensor_parallel_size,
    "schedule_policy": check_schedule_policy,
    "schedule_conservativeness": check_schedule_conservativeness,
    "chunked_prefill_size": check_chunked_prefill_size,
    "max_prefill_tokens": partial(check_count, "max_prefill_tokens"),
    "max_running_requests": partial(check_count, "max_running_requests"),
    "enable_mixed_chunk": partial(check_flag, "enable_mixed_chunk"),
    "disable_radix_cache": partial(check_flag, "disable_radix_cache"),
    "capacity_scheduler_policy": check_capacity_scheduler_policy,
    "max_batch_size": partial(check_count, "max_batch_size"),
    "max_num_tokens": partial(check_count, "max_num_tokens"),
    "enable_chunked_prefill": partial(check_flag, "enable_chunked_prefill"),
    "max_batch_prefill_tokens": partial(check_count, "max_batch_prefill_tokens"),
    "waiting_served_ratio": check_waiting_served_ratio,
    "max_waiting_tokens": partial(check_count, "max_waiting_tokens", least=0),
    "prefill_chunking": partial(check_flag, "prefill_chunking"),
}


def check_engine_name(name: str) -> None:
    """Unknown names are a ValueError listing the engines that exist (and which chapter builds the
    others); known names that a later chapter builds are not ready yet."""
    if name not in ENGINE_CHAPTERS:
        later = [f"{n}: chapter {c}" for n, c in ENGINE_CHAPTERS.items() if n not in BUILDERS]
        raise ValueError(
            f"unknown engine {name!r}; available: {', '.join(BUILDERS)}" + (f" ({', '.join(later)})" if later else "")
        )
    if name not in BUILDERS:
        raise NotImplementedError(
            f"engine {name!r} is built in chapter {ENGINE_CHAPTERS[name]} and is not available yet"
        )


def engine_options(name: str, options: dict) -> dict:
    """``options`` over the engine's defaults; a ValueError names any option the engine does not take."""
    defaults = ENGINE_OPTIONS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown and not defaults:
        raise ValueError(f"engine {name!r} takes no engine options, got {unknown}")
    if unknown:
        raise ValueError(f"engine {name!r} does not take the option(s) {unknown}; it takes {sorted(defaults)}")
    return {**defaults, **options}


def check_engine_options(name: str, options: dict) -> None:
    """Engine ``name``'s options checked by name and by value, with nothing built, loaded or
    allocated: ``LLM`` calls it before it loads any weights. (``build_engine`` checks them as it builds.)"""
    check_engine_name(name)
    options = dict(options)
    for plug_in in ("scheduler_cls", "runner_cls"):
        _class_or_default(plug_in, options.pop(plug_in, None), None)
    full = engine_options(name, options)
    for option, value in options.items():
        if option in OPTION_CHECKS and not (value is None and ENGINE_OPTIONS[name][option] is None):
            OPTION_CHECKS[option](value)
    check_memory_options(options)
    if "attention_backend" in full:
        check_attention_backend(full["attention_backend"], full["block_size"])
    if full.get("tensor_parallel_size", 1) > 1:
        check_tensor_parallel_options(full["fast_path"], full["cuda_graphs"])


def build_engine(name: str, model, device, eos_token_ids, scheduler_cls=None, runner_cls=None, **options) -> Engine:
    """Engine ``name``. ``scheduler_cls`` / ``runner_cls`` (vLLM's ``scheduler_cls``) swap in your own
    scheduler / runner: how a course exercise runs inside the real engine. The scheduler is built
    with the engine's options (less ``RUNNER_ONLY_OPTIONS``), the runner with ``(model, device)``
    and the engine's ``RUNNER_OPTIONS``."""
    check_engine_name(name)
    default_scheduler, default_runner = BUILDERS[name]
    scheduler_cls = _class_or_default("scheduler_cls", scheduler_cls, default_scheduler)
    runner_cls = _class_or_default("runner_cls", runner_cls, default_runner)
    options = engine_options(name, options)
    graph_options = {}
    if options.get("cuda_graphs"):  # graphs for every batch this scheduler may run
        graph_options = {
            "max_num_seqs": options[REQUESTS_AT_ONCE[name]],
            "max_num_batched_tokens": options.get("max_num_batched_tokens"),
        }
    if "kv_cache_memory_bytes" in options:  # a memory budget becomes the num_gpu_blocks it buys
        graph_tokens = max((capture_sizes(bound)[-1] for bound in graph_options.values()), default=0)
        options = resolve_kv_memory(options, model, device, graph_tokens)
    runner_options = {k: options[k] for k in RUNNER_OPTIONS.get(name, ())} | graph_options
    options = {k: v for k, v in options.items() if k not in RUNNER_ONLY_OPTIONS.get(name, ())}
    check_takes_options(scheduler_cls, name, options)
    scheduler = scheduler_cls(**options)
    runner = runner_cls(model, device, **runner_options)
    check_contract("scheduler_cls", scheduler, SCHEDULER_CONTRACT)
    check_contract("runner_cls", runner, RUNNER_CONTRACT)
    return Engine(scheduler, runner, eos_token_ids)


def check_takes_options(scheduler_cls: type, name: str, options: dict) -> None:
    """A ValueError when ``scheduler_cls(**options)`` does not fit its ``__init__``'s signature (e.g.
    one without the engine's options). Checked before the call, so that a TypeError raised inside
    a plug-in's ``__init__``, the plug-in's own bug, reaches its author as it is."""
    try:
        signature = inspect.signature(scheduler_cls)
    except (TypeError, ValueError):  # no signature to check: the call itself will tell
        return
    try:
        signature.bind(**options)
    except TypeError as error:
        raise ValueError(
            f"scheduler_cls={scheduler_cls.__name__} cannot be built with engine {name!r}'s options {options}: {error}"
        ) from error


def _class_or_default(option: str, cls, default: type) -> type:
    if cls is None:
        return default
    if not isinstance(cls, type):
        raise ValueError(f"{option} must be a class, got {cls!r}")
    return cls


def check_contract(option: str, obj, names: tuple[str, ...]) -> None:
    """A ValueError naming what ``obj`` lacks of ``names`` (checked on the built object, since
    attributes such as ``waiting`` are set by its ``__init__``)."""
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise ValueError(
            f"{option}={type(obj).__name__} lacks {', '.join(missing)}: the engine needs a class with "
            f"{', '.join(names)}"
        )
