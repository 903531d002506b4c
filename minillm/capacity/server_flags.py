"""Chapter 8b: the same server settings in each server's own words.

A capacity measured here holds for the settings it was measured with: ``max_num_seqs`` requests at
once, a token budget per step, a KV pool of so many tokens. ``KNOBS`` is the course's translation
table -- what each knob bounds, its flag and default in vLLM, SGLang, TensorRT-LLM and TGI
[vllm-source-arg-utils] [sglang-docs-server-args] [trtllm-scheduler-docs] [tgi-launcher-docs], and the
minillm option closest to it -- and ``server_flags`` writes the limits a run of minillm's paged or
chunked engine had as one server's flags, so that what was measured here can be typed there. The
translation is of the *limits*: each server still schedules by its own rules inside them
(``minillm.engines.sglang``, ``trtllm``, ``tgi``).
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.engines import REQUESTS_AT_ONCE, engine_options
from minillm.engines.paged import resolve_num_gpu_blocks

SERVERS = ("vllm", "sglang", "trtllm", "tgi")


@dataclass(frozen=True)
class Knob:
    bounds: str  # what it limits
    flags: dict[str, str]  # server -> "its flag (its default)", or what it has instead
    minillm: str  # the closest minillm option


KNOBS = [
    Knob(
        "requests running at once",
        {
            "vllm": "--max-num-seqs (1,024 on an H100-class GPU)",
            "sglang": "--max-running-requests (from the pool: half its tokens, at most a request pool of 2,048-4,096)",
            "trtllm": "--max_batch_size (2,048)",
            "tgi": "--max-batch-size (none)",
        },
        "max_num_seqs",
    ),
    Knob(
        "tokens one step computes",
        {
            "vllm": "--max-num-batched-tokens (8,192 for the server on an H100-class GPU)",
            "sglang": "--chunked-prefill-size (by GPU memory: 8,192 on an H200; -1 turns chunking off) "
            "and --max-prefill-tokens (16,384)",
            "trtllm": "--max_num_tokens (8,192)",
            "tgi": "--max-batch-prefill-tokens (from the GPU's FLOP/s, else 4,096)",
        },
        "max_num_batched_tokens",
    ),
    Knob(
        "prompts cut into chunks",
        {
            "vllm": "always (V1)",
            "sglang": "whenever --chunked-prefill-size > 0; decodes join a prefill step only with --enable-mixed-chunk",
            "trtllm": "enable_chunked_prefill: true (off by default)",
            "tgi": "on where its attention backend allows (PREFILL_CHUNKING=0 turns it off)",
        },
        "the chunked engine (the paged engine runs prompts whole)",
    ),
    Knob(
        "the KV cache's size",
        {
            "vllm": "--gpu-memory-utilization: a share of the GPU for everything vLLM allocates "
            "(--num-gpu-blocks-override fixes the blocks)",
            "sglang": "--mem-fraction-static: a share for weights and KV pool together "
            "(--max-total-tokens caps the pool)",
            "trtllm": "kv_cache_config.free_gpu_memory_fraction: a share of what is free after loading (0.9); "
            "kv_cache_config.max_tokens caps it",
            "tgi": "--max-batch-total-tokens (measured at warm-up from the free memory)",
        },
        "num_gpu_blocks x block_size, or gpu_memory_utilization / kv_cache_memory_bytes",
    ),
    Knob(
        "tokens a KV block holds",
        {
            "vllm": "--block-size (16)",
            "sglang": "--page-size (1)",
            "trtllm": "kv_cache_config.tokens_per_block (32)",
            "tgi": "set by its attention backend (1, 16 or 256)",
        },
        "block_size",
    ),
    Knob(
        "who waits when memory runs out",
        {
            "vllm": "preempt the newest request, recompute it later",
            "sglang": "retract the requests with the fewest tokens; --schedule-conservativeness (1.0) sets the "
            "estimate admission trusts",
            "trtllm": "capacity_scheduler_policy: GUARANTEED_NO_EVICT (never, by reserving) or MAX_UTILIZATION (pause)",
            "tgi": "never: each request reserves its whole length when admitted",
        },
        "the engine: chunked, sglang, trtllm (capacity_scheduler_policy), tgi",
    ),
    Knob(
        "the waiting queue's order",
        {
            "vllm": "arrival (--scheduling-policy priority for priorities)",
            "sglang": "--schedule-policy (fcfs; lpm: longest cached prefix first)",
            "trtllm": "arrival",
            "tgi": "arrival, and a running batch admits only --waiting-served-ratio (0.3) of its size at once, "
            "or after --max-waiting-tokens (20) steps",
        },
        "sglang's schedule_policy; tgi's waiting_served_ratio, max_waiting_tokens",
    ),
]


SERVER_ENGINES = {"vllm": "chunked", "sglang": "sglang", "trtllm": "trtllm", "tgi": "tgi"}  # whose rules each follows
VLLM_GPU_BUDGET = 8192  # vLLM's server's token budget on an H100-class GPU [vllm-source-arg-utils]


def server_engine(server: str, max_num_seqs: int, num_gpu_blocks: int, block_size: int = 16, **own) -> tuple[str, dict]:
    """``(engine, options)``: minillm's engine that follows ``server``'s rules, with one slice --
    ``max_num_seqs`` requests at once, ``num_gpu_blocks`` blocks of ``block_size`` tokens -- in that
    engine's option names, the server's defaults for everything else (vLLM's rules with its GPU
    server's token budget), and ``own``: that server's own options on top."""
    if server not in SERVERS:
        raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {server!r}")
    engine = SERVER_ENGINES[server]
    options = {REQUESTS_AT_ONCE[engine]: max_num_seqs, "num_gpu_blocks": num_gpu_blocks, "block_size": block_size}
    if server == "vllm":
        options["max_num_batched_tokens"] = VLLM_GPU_BUDGET
    return engine, {**options, **own}


def server_flags(server: str, engine: str, options: dict) -> list[str]:
    """The limits engine ``engine`` (``"paged"`` or ``"chunked"``) ran with, ``options`` over its
    defaults, as ``server``'s flags, one per line. TensorRT-LLM's that have no command-line flag are
    given as the YAML its ``--extra_llm_api_options`` file takes."""
    if server not in SERVERS:
        raise ValueError(f"format must be one of {', '.join(SERVERS)}, got {server!r}")
    if engine not in ("paged", "chunked"):
        raise ValueError(f"format translates the paged and chunked engines' limits, not engine {engine!r}'s")
    options = engine_options(engine, options)
    seqs, block_size, caching = options["max_num_seqs"], options["block_size"], options["enable_prefix_caching"]
    budget = options.get("max_num_batched_tokens")  # None: the paged engine runs prompts whole
    blocks = resolve_num_gpu_blocks(options["num_gpu_blocks"], block_size)
    pool = blocks * block_size
    if server == "vllm":
        lines = [f"--max-num-seqs {seqs}", f"--num-gpu-blocks-override {blocks}", f"--block-size {block_size}"]
        no_chunks = "# vLLM V1 always chunks prompts: the paged engine's whole prompts have no flag"
        lines += [f"--max-num-batched-tokens {budget}"] if budget else [no_chunks]
        return lines + ["--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]
    if server == "sglang":
        lines = [f"--max-running-requests {seqs}", f"--max-total-tokens {pool}", f"--page-size {block_size}"]
        if budget:
            lines += [f"--chunked-prefill-size {budget}", "--enable-mixed-chunk  # decodes share a step with a chunk"]
        else:
            lines += ["--chunked-prefill-size -1"]
        return lines + ([] if caching else ["--disable-radix-cache"])
    if server == "trtllm":
        lines = [f"--max_batch_size {seqs}"] + ([f"--max_num_tokens {budget}"] if budget else [])
        lines += ["# in the --extra_llm_api_options YAML:", f"enable_chunked_prefill: {'true' if budget else 'false'}"]
        lines += ["scheduler_config:", "  capacity_scheduler_policy: MAX_UTILIZATION  # pauses, as minillm preempts"]
        lines += ["kv_cache_config:", f"  max_tokens: {pool}", f"  tokens_per_block: {block_size}"]
        return lines + [f"  enable_block_reuse: {'true' if caching else 'false'}"]
    lines = [f"--max-batch-size {seqs}"] + ([f"--max-batch-prefill-tokens {budget}"] if budget else [])
    lines += [] if budget else ["# PREFILL_CHUNKING=0 in the environment: whole prompts"]
    return lines + [f"# --max-batch-total-tokens {pool}: a flash model's pool is measured at warm-up instead"]
