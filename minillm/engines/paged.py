"""Chapter 5: the paged engine -- iteration-level scheduling, one flat token pass, paged KV blocks.

Chapters 3 and 4 reserved each request a contiguous cache for its longest possible sequence, so
memory went to tokens that might never be generated. Here the KV pool is cut into fixed-size blocks
(``minillm.kv.block_manager``) handed out just in time, as tokens arrive. Admission asks only for the
blocks the prompt needs now, so more requests run at once; the price is that a running request may
need a block when none is free. Then the scheduler *preempts* the most recently admitted request:

  recompute  free its blocks, put it back at the front of ``waiting``; when readmitted it recomputes
             prompt + generated tokens as one prefill (cheap compute, no memory traffic)
  swap       copy its blocks to host memory (the ``swapped`` queue) and back when blocks free up;
             a swapped request resumes before any new admission

Either way the request continues exactly where it stopped: the runner keeps its sampling generator,
and a recompute samples only the next token, never one it already generated.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from itertools import chain

import numpy as np
import torch

from minillm.attention.paged_kv import ATTENTION_BACKENDS, PagedKVCache
from minillm.distributed.workers import TensorParallelWorkers
from minillm.engines.cuda_graphs import DecodeGraphs, free_memory
from minillm.engines.input_batch import InputBatch, StepInputs, carries_chunks, flat_positions
from minillm.engines.piecewise_graphs import PiecewiseGraphs
from minillm.kernels import cpu_build
from minillm.kernels.paged_attention import MIN_TRITON_BLOCK_SIZE
from minillm.kv.block_manager import BlockManager, check_block_options
from minillm.kv.prefix_cache import PrefixCachingBlockManager
from minillm.models.fast_model import MODEL_STEPS, FastCausalLM, check_fast_path, fast_path_steps
from minillm.request import Request, RequestStatus
from minillm.runner import ModelRunnerBase, ModelRunnerOutput
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, SchedulerOutput, check_max_num_seqs

DEFAULT_BLOCK_SIZE = 16
# num_gpu_blocks=None gives the pool this many tokens: a few dozen requests of a few hundred tokens,
# a few MB on the tiny model and ~1 GB for Qwen3-0.6B in bf16. Pass num_gpu_blocks to size it.
DEFAULT_NUM_KV_TOKENS = 8192
PREEMPTION_MODES = ("recompute", "swap")


def check_preemption_mode(preemption_mode) -> None:
    if preemption_mode not in PREEMPTION_MODES:
        raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")


def check_enable_prefix_caching(enable_prefix_caching) -> None:
    if not isinstance(enable_prefix_caching, bool):
        raise ValueError(f"enable_prefix_caching must be True or False, got {enable_prefix_caching!r}")


def check_attention_backend(attention_backend, block_size) -> None:
    """``None`` (chosen by the device), or one of ``ATTENTION_BACKENDS``; Triton's kernel needs blocks
    of at least ``MIN_TRITON_BLOCK_SIZE`` tokens."""
    if attention_backend is not None and attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {attention_backend!r}")
    if attention_backend == "triton" and block_size < MIN_TRITON_BLOCK_SIZE:
        raise ValueError(
            f"attention_backend='triton' needs block_size >= {MIN_TRITON_BLOCK_SIZE}, got block_size={block_size}; "
            "use attention_backend='torch' for smaller blocks"
        )


def resolve_num_gpu_blocks(num_gpu_blocks, block_size: int) -> int:
    """``num_gpu_blocks``, or (None) enough blocks for ``DEFAULT_NUM_KV_TOKENS`` tokens; checked."""
    if num_gpu_blocks is None:
        check_block_options(1, block_size)
        num_gpu_blocks = -(-DEFAULT_NUM_KV_TOKENS // block_size)
    check_block_options(num_gpu_blocks, block_size)
    return num_gpu_blocks


@dataclass
class PagedSchedulerOutput(SchedulerOutput):
    """A step plan plus what the paged runner needs: each scheduled request's block table (the live
    lists: read them during the step only) and the block copies of this step's swaps."""

    block_tables: dict[str, list[int]] = field(default_factory=dict)
    block_size: int = DEFAULT_BLOCK_SIZE
    blocks_to_swap_out: dict[str, list[int]] = field(
        default_factory=dict
    )  # request id -> its blocks, to copy out first
    blocks_to_swap_in: dict[str, list[int]] = field(default_factory=dict)  # request id -> its new blocks, to copy in


class PagedScheduler(Scheduler):
    """Orca's iteration-level policy over a ``BlockManager``, with preemption when blocks run out.

    ``block_manager_cls`` is the allocator class, built as ``block_manager_cls(num_blocks, block_size)``:
    a subclass that sets it runs the engine on another allocator (chapter 5's exercise plugs in its own).
    What the scheduler uses of it: ``allocate_slots``, ``free`` (returning the freed table),
    ``get_block_table``, ``num_blocks_for``, ``block_tables``, ``num_free_blocks``, ``usage``,
    ``num_blocks`` and ``block_size``.

    ``enable_prefix_caching`` (vLLM's name) builds ``prefix_caching_block_manager_cls`` instead: a
    request admitted from scratch then starts with the cached blocks that hold its first tokens
    (``minillm.kv.prefix_cache``), and computes only the rest."""

    block_manager_cls = BlockManager
    prefix_caching_block_manager_cls = PrefixCachingBlockManager

    def __init__(
        self,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_gpu_blocks: int | None = None,
        preemption_mode: str = "recompute",
        enable_prefix_caching: bool = False,
    ):
        super().__init__()
        check_max_num_seqs(max_num_seqs)
        check_preemption_mode(preemption_mode)
        check_enable_prefix_caching(enable_prefix_caching)
        self.max_num_seqs = max_num_seqs
        self.preemption_mode = preemption_mode
        self.enable_prefix_caching = enable_prefix_caching
        manager_cls = self.prefix_caching_block_manager_cls if enable_prefix_caching else self.block_manager_cls
        self.block_manager = manager_cls(resolve_num_gpu_blocks(num_gpu_blocks, block_size), block_size)
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache (vLLM V1's counters) ...
        self.prefix_cache_hits = 0  # ... and those found there
        self.swapped: deque[Request] = deque()  # preempted to host memory, oldest admitted first
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self._recorded_tables: dict[str, tuple[int, ...]] | None = None

    @property
    def block_size(self) -> int:
        return self.block_manager.block_size

    @property
    def num_gpu_blocks(self) -> int:
        return self.block_manager.num_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def check_request(self, request: Request) -> None:
        """A request longer than the whole pool could never finish: refused at submission."""
        if request.max_num_tokens > self.kv_capacity_tokens:
            raise ValueError(
                f"request {request.request_id}: {request.num_prompt_tokens} prompt tokens + max_tokens="
                f"{request.sampling_params.max_tokens} needs {request.max_num_tokens} KV cache tokens, more than the "
                f"whole pool of num_gpu_blocks={self.num_gpu_blocks} x block_size={self.block_size} = "
                f"{self.kv_capacity_tokens} tokens"
            )

    def schedule(self, now: float) -> PagedSchedulerOutput:
        """Give every running request (oldest first) the blocks for its next tokens, preempting the
        newest ones while blocks run short; then, unless someone was preempted, resume swapped
        requests and admit waiting ones in order while blocks and slots last."""
        bm = self.block_manager
        self.cache_running_blocks()
        scheduled, num_tokens, preempted, swap_out = [], {}, [], {}
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted above as a victim
            n = request.num_tokens - request.num_computed_tokens
            while not bm.allocate_slots(request, n):
                if self.preempt(preempted, swap_out) is request:
                    break
            if request.status is RequestStatus.RUNNING:
                scheduled.append(request)
                num_tokens[request.request_id] = n

        admitted, swap_in = [], {}
        if not preempted or not scheduled:
            while self.swapped and len(self.running) < self.max_num_seqs:
                request = self.swapped[0]
                n = request.num_tokens - request.num_computed_tokens
                if not bm.allocate_slots(request, n):
                    break
                self.swapped.popleft()
                swap_in[request.request_id] = self.computed_blocks(request)
                self._admit(request)
                admitted.append(request.request_id)
                scheduled.append(request)
                num_tokens[request.request_id] = n
            while not self.swapped and self.waiting and len(self.running) < self.max_num_seqs:
                request = self.waiting[0]
                hit = self.reuse_cached_prefix(request)
                n = request.num_tokens - request.num_computed_tokens
                if not bm.allocate_slots(request, n):
                    self.forget_cached_prefix(request, hit)
                    break
                self.count_prefix_hit(request, hit)
                self.waiting.popleft()
                self._admit(request)
                admitted.append(request.request_id)
                scheduled.append(request)
                num_tokens[request.request_id] = n

        return PagedSchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=num_tokens,
            admitted_ids=admitted,
            preempted_ids=preempted,
            slots=self.slots,
            block_tables={r.request_id: bm.get_block_table(r.request_id) for r in scheduled},
            block_size=self.block_size,
            swapped_out_ids=[rid for rid in preempted if rid in swap_out],
            blocks_to_swap_out=swap_out,
            blocks_to_swap_in=swap_in,
        )

    # --- prefix caching (no-ops when enable_prefix_caching is False) ---------------------------------
    def reuse_cached_prefix(self, request: Request) -> int | None:
        """A request about to be admitted from scratch starts with the cached blocks holding its first
        tokens, and its ``num_computed_tokens`` after them; at least its last token is left to
        compute (its logits give the next token). Returns the tokens found, or None when no lookup
        was made (caching off, or the request already has tokens computed)."""
        if not self.enable_prefix_caching or request.num_computed_tokens:
            return None
        bm = self.block_manager
        blocks = bm.find_cached_blocks(request.token_ids_slice(0, request.num_tokens - 1))
        if blocks:
            bm.share_cached_blocks(request.request_id, blocks)
        request.num_computed_tokens = len(blocks) * bm.block_size
        return request.num_computed_tokens

    def forget_cached_prefix(self, request: Request, hit: int | None) -> None:
        """Undo ``reuse_cached_prefix`` for a request that could not be admitted after all."""
        if hit:
            self.block_manager.free(request)
            request.num_computed_tokens = 0

    def count_prefix_hit(self, request: Request, hit: int | None) -> None:
        """Count an admitted request's lookup; its first one is its ``num_cached_tokens`` (vLLM's name)."""
        if hit is None:
            return
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += hit
        if request.num_cached_tokens is None:
            request.num_cached_tokens = hit

    def cache_blocks(self, request: Request) -> None:
        """Name ``request``'s full, computed blocks in the prefix cache (before they can be freed)."""
        if self.enable_prefix_caching and request.request_id in self.block_manager.block_tables:
            self.block_manager.cache_full_blocks(request)

    def cache_running_blocks(self) -> None:
        """At the start of a step: name the blocks the last step filled."""
        if not self.enable_prefix_caching:
            return  # no loop over the running requests on every step of an engine without the cache
        for request in self.running:
            self.cache_blocks(request)

    def cached_free_blocks(self) -> list[int]:
        """The free blocks whose hash is still cached, in id order: no request holds them, yet a later
        prompt that starts with their tokens reuses them until the allocator evicts them (what the
        engine records for the block map). The work grows with the cached blocks, so only engines
        with the cache on are asked."""
        if not self.enable_prefix_caching:
            return []
        bm = self.block_manager
        return sorted(b for b in bm.cached_block_ids.values() if not bm.ref_counts[b])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing changed) while requests hold blocks or caching is off."""
        return self.enable_prefix_caching and self.block_manager.reset_prefix_cache()

    def computed_blocks(self, request: Request) -> list[int]:
        """The blocks of ``request``'s table that hold its computed tokens: what a swap copies (out
        at preemption, back in at resumption), leaving a new chunk's still empty blocks."""
        table = self.block_manager.get_block_table(request.request_id)
        return table[: self.block_manager.num_blocks_for(request.num_computed_tokens)]

    def preempt(self, preempted: list[str], swap_out: dict[str, list[int]]) -> Request:
        """Preempt the running request of lowest priority, the one admitted last (vLLM's choice), and
        return it. It leaves ``running``, its slot and its blocks, becomes WAITING, and its id is
        appended to ``preempted``. Recompute: back to the front of ``waiting`` with nothing computed.
        Swap: its computed blocks are listed in ``swap_out`` (the runner copies them out before the
        step writes anything), and it goes to the front of ``swapped``, its progress kept."""
        request = self.running.pop()
        self.release_slot(request)
        request.status = RequestStatus.WAITING
        if self.preemption_mode == "swap":
            swap_out[request.request_id] = self.computed_blocks(request)
        self.cache_blocks(request)
        self.block_manager.free(request)
        self.num_preemptions += 1
        preempted.append(request.request_id)
        # appendleft: victims go newest first, so the oldest admitted ends up at the front
        if self.preemption_mode == "swap":
            self.num_swapped_out += 1
            self.swapped.appendleft(request)
        else:
            request.num_computed_tokens = 0  # prompt + generated tokens are recomputed as one prefill
            self.waiting.appendleft(request)
        return request

    def free_request(self, request: Request) -> None:
        """Also out of ``swapped``, and every block it holds back to the free queue."""
        if request in self.swapped:
            self.swapped.remove(request)
        else:
            super().free_request(request)
        if request.request_id in self.block_manager.block_tables:  # a swapped or recomputing one holds none
            self.cache_blocks(request)
            self.block_manager.free(request)

    def changed_block_tables(self) -> dict[str, list[int]] | None:
        """Every request's block table now, or None when none changed since the last call (what the
        trace records after each step)."""
        tables = {rid: tuple(t) for rid, t in self.block_manager.block_tables.items()}
        if tables == self._recorded_tables:
            return None
        self._recorded_tables = tables
        return {rid: list(t) for rid, t in tables.items()}

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of blocks in use (vLLM's definition)."""
        return self.block_manager.usage

    def stats(self) -> dict:
        """The base's, with swapped-out requests counted as waiting, the pool's blocks, and the
        preemptions since the engine was built."""
        bm = self.block_manager
        return {
            **super().stats(),
            "num_waiting": len(self.waiting) + len(self.swapped),
            "num_swapped": len(self.swapped),
            "num_total_blocks": bm.num_blocks,
            "num_free_blocks": bm.num_free_blocks,
            "block_size": bm.block_size,
            "num_preemptions": self.num_preemptions,
            "num_swapped_out": self.num_swapped_out,
            "preemption_mode": self.preemption_mode,
            "enable_prefix_caching": self.enable_prefix_caching,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_hit_rate": self.prefix_cache_hits / self.prefix_cache_queries
            if self.prefix_cache_queries
            else 0.0,
        }


def check_cuda_graphs(cuda_graphs) -> None:
    if not isinstance(cuda_graphs, bool):
        raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")


def check_tensor_parallel_options(fast_path, cuda_graphs) -> None:
    """The fast path's fused model and CUDA graphs have no all-reduce in them: not with tensor parallelism."""
    for name, value in (("fast_path", fast_path), ("cuda_graphs", cuda_graphs)):
        if value:
            raise ValueError(f"{name}={value!r} cannot be combined with tensor_parallel_size > 1; set {name}=False")


def default_attention_backend(device: torch.device, fast_path: tuple[str, ...] = ()) -> str:
    """Triton on CUDA; on a CPU the PyTorch backend, or with the fast path's ``cpu_attention`` its C kernel."""
    if torch.device(device).type == "cuda":
        return "triton"
    return "cpu" if "cpu_attention" in fast_path else "torch"


class PagedRunner(ModelRunnerBase):
    """One flat token pass per step (as chapter 4's), over one preallocated K and V pool per layer.

    ``kv_cache_cls`` is the attention backend each step hands the model; a subclass that sets it
    attends with another kernel (chapter 5's kernel exercise plugs in its decode kernel).

    ``fast_path`` (chapter 9) runs the model through ``minillm.models.fast_model`` instead: fused
    projections and, on a CPU, prepacked oneDNN matmuls and chapter 9's C kernels (attention,
    the small ops, few-token matmuls); the same tokens, in less time. ``cuda_graphs`` captures a
    graph per decode batch size up to ``max_num_seqs`` (the scheduler's bound; None: every size), and
    the forward in pieces per token count up to ``max_num_batched_tokens`` (the step's token budget)."""

    kv_cache_cls = PagedKVCache

    def __init__(
        self,
        model,
        device,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_gpu_blocks: int | None = None,
        attention_backend: str | None = None,
        cuda_graphs: bool = False,
        fast_path: bool | list[str] = False,
        tensor_parallel_size: int = 1,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
    ):
        super().__init__(model, device)
        check_fast_path(fast_path)
        self.workers = None  # chapter 10: the other tensor-parallel ranks, when there are any
        if tensor_parallel_size > 1:
            check_tensor_parallel_options(fast_path, cuda_graphs)
            worker_runner = partial(
                PagedRunner,
                device=device,
                block_size=block_size,
                num_gpu_blocks=num_gpu_blocks,
                attention_backend=attention_backend,
            )
            self.workers = TensorParallelWorkers(model, tensor_parallel_size, worker_runner)
            model = self.model = self.workers.start()  # this rank's shard: its heads, its KV heads
        self.fast_path = fast_path_steps(fast_path, device, self.dtype)  # the steps this device takes
        if model_steps := tuple(s for s in self.fast_path if s in MODEL_STEPS):
            self.model = FastCausalLM(model, model_steps)
        num_gpu_blocks = resolve_num_gpu_blocks(num_gpu_blocks, block_size)
        backend = attention_backend or default_attention_backend(device, self.fast_path)
        check_attention_backend(backend, block_size)
        if backend == "cpu":
            cpu_build.check_usable(device, self.dtype, "attention_backend")
        else:  # an explicit attention_backend wins over the fast path's kernel
            self.fast_path = tuple(s for s in self.fast_path if s != "cpu_attention")
        self.block_size, self.num_gpu_blocks, self.attention_backend = block_size, num_gpu_blocks, backend
        cfg = model.config
        # with graphs, one block more than the block manager hands out: where padded rows write
        shape = (num_gpu_blocks + cuda_graphs, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=self.dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v_caches = [torch.zeros(shape, dtype=self.dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.scale = cfg.head_dim**-0.5
        self.host_kv: dict[str, torch.Tensor] = {}  # swapped-out requests' blocks: [2 x layers, blocks, ...]
        self.num_kv_tokens: dict[str, int] = {}  # request id -> tokens its blocks hold
        self.num_blocks_held: dict[str, int] = {}
        max_blocks_per_seq = min(num_gpu_blocks, -(-cfg.max_position_embeddings // block_size))
        self.input_batch = InputBatch(max_blocks_per_seq, device)
        self.graphs = self.piecewise = None
        if cuda_graphs:
            self._capture_graphs(max_blocks_per_seq, max_num_seqs, max_num_batched_tokens)

    @torch.inference_mode()
    def _capture_graphs(self, max_blocks_per_seq: int, max_num_seqs, max_num_batched_tokens) -> None:
        """The mixed steps' graphs, then the decode steps' (the larger activations first), in one
        memory pool, captured on one side stream; what it cost in ``graph_capture_seconds`` and
        ``graph_memory_bytes``."""
        start, free = time.perf_counter(), free_memory(self.device)
        # one side stream for every warm-up and capture (memory freed on a stream is reused only on it)
        on_gpu = self.device.type == "cuda"
        pool, stream = (torch.cuda.graph_pool_handle(), torch.cuda.Stream()) if on_gpu else (None, None)
        self.piecewise = PiecewiseGraphs(self, max_num_batched_tokens, pool, stream)
        self.graphs = DecodeGraphs(self, max_blocks_per_seq, max_num_seqs, pool, stream)
        self.graph_capture_seconds = time.perf_counter() - start
        self.graph_memory_bytes = free - free_memory(self.device)

    @torch.inference_mode()
    def execute_model(self, plan: PagedSchedulerOutput) -> ModelRunnerOutput:
        self._swap(plan)
        if self.graphs is not None and (size := self.graphs.size_for(plan)) is not None:
            return self.graphs.execute(plan, size)  # a decode-only step: replayed from its CUDA graph
        requests = plan.scheduled
        done = [r.num_computed_tokens + plan.num_scheduled_tokens[r.request_id] == r.num_tokens for r in requests]
        inputs = self.input_batch.prepare(
            requests, plan.num_scheduled_tokens, plan.block_tables, self.slot_mapping, sample=done
        )
        hidden = self.forward(inputs) if self.workers is None else self._forward_with_workers(plan, inputs)
        self._held(plan)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [sum(done), vocab]
        tokens = self._sample([r for r, d in zip(requests, done) if d], logits)
        num_tokens = len(inputs.input_ids)
        if self.piecewise is not None:  # a step replayed in pieces computed its padding rows too
            num_tokens = self.piecewise.size_for(num_tokens) or num_tokens
        return ModelRunnerOutput(tokens, num_tokens, num_forward_passes=1)

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """The model over one step's flat tokens, attending through this runner's KV pool: ``[num_tokens, hidden]``."""
        attn = self.kv_cache_cls(
            self.k_caches,
            self.v_caches,
            inputs.slot_mapping,
            inputs.block_tables,
            inputs.context_lens,
            inputs.query_start_loc,
            self.scale,
            self.attention_backend,
        )
        if self.piecewise is not None and (size := self.piecewise.size_for(len(inputs.input_ids))) is not None:
            return self.piecewise.forward(inputs.input_ids, inputs.positions, attn, size)  # attention between graphs
        return self.model(inputs.input_ids, inputs.positions, attn)

    def _forward_with_workers(self, plan: PagedSchedulerOutput, inputs: StepInputs) -> torch.Tensor:
        """Send the step to the other ranks, run this rank's shard; they meet in each layer's
        all-reduces. If anything fails part way, the ranks no longer agree on where they are: stop
        them all (the next step starts new ones) and raise the worker's own error when it sent one."""
        if not self.workers.started:
            if self.num_kv_tokens:  # new workers hold no KV: a request that did would go on with half its cache
                raise RuntimeError("tensor-parallel workers stopped while requests held KV blocks: abort them first")
            self.model = self.workers.start()
        try:
            self.workers.send(plan, inputs)
            return self.forward(inputs)
        except BaseException as error:
            reason = self.workers.failure() if isinstance(error, (RuntimeError, OSError)) else None
            self.workers.stop()
            if reason is None:
                raise
            raise RuntimeError(reason) from error

    def _held(self, plan: PagedSchedulerOutput) -> None:
        """After a step: the tokens and blocks each scheduled request now holds."""
        for r in plan.scheduled:
            self.num_kv_tokens[r.request_id] = r.num_computed_tokens + plan.num_scheduled_tokens[r.request_id]
            self.num_blocks_held[r.request_id] = len(plan.block_tables[r.request_id])

    def slot_mapping(
        self, block_tables: list[list[int]], num_computed_tokens: list[int], num_scheduled_tokens: list[int]
    ):
        """Each of this step's tokens' slot in the flat pool, computed on the host (it travels in the
        step's one copy): ``slot_mapping`` below, or in numpy (``slot_mapping_array``) when the step
        carries prompt chunks, many tokens a request (chapter 5's exercise plugs in its own). Anything
        ``numpy.asarray`` takes: a CPU tensor, a list, an array."""
        how = slot_mapping_array if carries_chunks(num_scheduled_tokens) else slot_mapping
        return how(block_tables, num_computed_tokens, num_scheduled_tokens, self.block_size)

    def _swap(self, plan: PagedSchedulerOutput) -> None:
        """Copy swapped-out blocks to host memory before this step overwrites them, and swapped-in
        blocks back before it reads them. On a GPU the host copies are pinned and every copy is queued
        on the stream, in order, without waiting: the step's own kernels come after them, and nothing on
        the host reads a swapped block, so no copy needs a sync (a layer-by-layer copy to pageable memory
        would wait twice a layer). A server would keep a preallocated swap space instead of new copies."""
        for rid in plan.preempted_ids:
            self.input_batch.remove(rid)
            self.num_kv_tokens.pop(rid, None)
            self.num_blocks_held.pop(rid, None)
        caches = (*self.k_caches, *self.v_caches)
        pinned = caches[0].is_cuda
        for rid, blocks in plan.blocks_to_swap_out.items():
            index = torch.tensor(blocks, dtype=torch.long, device=self.device)
            host = torch.empty((len(caches), len(blocks), *caches[0].shape[1:]), dtype=self.dtype, pin_memory=pinned)
            for layer_kv, cache in zip(host, caches):  # every layer's K, then every layer's V
                layer_kv.copy_(cache[index], non_blocking=pinned)
            self.host_kv[rid] = host
        for rid, blocks in plan.blocks_to_swap_in.items():
            host = self.host_kv.pop(rid)
            index = torch.tensor(blocks, dtype=torch.long, device=self.device)
            for layer_kv, cache in zip(host, caches):
                cache[index] = layer_kv.to(self.device, non_blocking=pinned)

    def free(self, request_id: str) -> None:
        super().free(request_id)
        if self.workers is not None:
            self.workers.freed.append(request_id)
        self.input_batch.remove(request_id)
        self.num_kv_tokens.pop(request_id, None)
        self.num_blocks_held.pop(request_id, None)
        self.host_kv.pop(request_id, None)

    def kv_tokens(self) -> int:
        return sum(self.num_kv_tokens.values())

    def kv_allocated_tokens(self) -> int:
        return sum(self.num_blocks_held.values()) * self.block_size


def slot_mapping(
    block_tables: list[list[int]], num_computed_tokens: list[int], num_scheduled_tokens: list[int], block_size: int
) -> list[int]:
    """The flat pool slot of every token of a step, in the step's flat token order (request i's
    ``num_scheduled_tokens[i]`` tokens, at positions ``num_computed_tokens[i]`` onwards, then request
    i + 1's): the physical block of a token's position, times ``block_size``, plus its offset in the
    block. A loop on the host: a decode step has one token per request, and the result travels in
    the step's one copy to the device."""
    return [
        table[p // block_size] * block_size + p % block_size
        for table, start, n in zip(block_tables, num_computed_tokens, num_scheduled_tokens)
        for p in range(start, start + n)
    ]


def slot_mapping_array(
    block_tables: list[list[int]], num_computed_tokens: list[int], num_scheduled_tokens: list[int], block_size: int
) -> np.ndarray:
    """``slot_mapping``'s slots without a Python iteration per token: per request, the blocks its new
    tokens fall in (a slice of its table); then, for every token at once in numpy, its block among
    them and its offset in the block."""
    first = [start // block_size for start in num_computed_tokens]
    blocks = [
        table[f : (start + n - 1) // block_size + 1]
        for table, f, start, n in zip(block_tables, first, num_computed_tokens, num_scheduled_tokens)
    ]
    counts = np.fromiter(map(len, blocks), dtype=np.int64, count=len(blocks))
    flat = np.fromiter(chain.from_iterable(blocks), dtype=np.int64, count=int(counts.sum()))
    request = np.repeat(np.arange(len(blocks)), num_scheduled_tokens)
    positions = np.asarray(flat_positions(num_computed_tokens, num_scheduled_tokens), dtype=np.int64)
    # request i's blocks start at flat[offset[i]] and hold positions from first[i] * block_size on
    offset = np.cumsum(counts) - counts - np.asarray(first, dtype=np.int64)
    return flat[offset[request] + positions // block_size] * block_size + positions % block_size
