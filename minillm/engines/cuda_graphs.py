"""CUDA graphs for the paged runner's decode-only steps (chapter 9's fast path).

A decode step launches a few hundred small GPU kernels (every layer's matmuls, norms, rotary
embedding, attention), and for a small model the host's time to launch them one by one is most of
the step: the course's anchors measured transformers' decode step on an H200 at 57-64 ms at every
batch size, about 200 times the time its weights take to read. A CUDA graph records the launches
once and replays them all with one call.

A graph replays the same kernels on the same memory, so three things follow (vLLM does the same):

- **capture sizes**: a graph per batch size in ``CAPTURE_SIZES`` (vLLM's defaults: 1, 2, 4, the
  multiples of 8 below 256, then of 16 up to 512); a step of ``n`` decodes replays the graph of the smallest size
  ``>= n``, its extra rows padding that compute into a scratch block nobody reads;
- **static buffers**: the step's inputs (token ids, positions, slots, block tables, context
  lengths), once on the device, are copied there into tensors allocated once, which the graphs read;
- **decode-only steps**: a prefill or a chunk has a shape of its own each step, so mixed steps, steps
  with swaps and steps past the largest size run eagerly.

Graphs are captured when a size is first needed. On a CPU there are no CUDA graphs: ``EagerGraph``
stands in, running the captured step as it is at every replay on the same static buffers, so the
bucketing and padding run (and are tested) anywhere, with no speed-up.
"""

from __future__ import annotations

import bisect

import torch

from minillm.runner import ModelRunnerOutput

CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def padded_size(num_seqs: int, sizes=CAPTURE_SIZES) -> int | None:
    """The smallest capture size that holds ``num_seqs`` decodes; None past the largest."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


class CapturedGraph:
    """``forward`` captured once as a CUDA graph; ``replay()`` relaunches it and returns its output."""

    def __init__(self, forward, pool):
        stream = torch.cuda.Stream()  # warm up off the default stream, as PyTorch's CUDA-graph notes ask
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = forward()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class EagerGraph:
    """The CPU's stand-in: runs ``forward`` at every replay, on the same static buffers."""

    def __init__(self, forward, pool=None):
        self.forward = forward
        self.num_replays = 0

    def replay(self) -> torch.Tensor:
        self.num_replays += 1
        return self.forward()


class DecodeGraphs:
    """The static buffers and one graph per capture size, for one ``PagedRunner``. The runner's pool
    has one block more than the block manager hands out: the scratch block, where padded rows write."""

    def __init__(self, runner, max_blocks_per_seq: int):
        self.runner = runner
        dev, size = runner.device, CAPTURE_SIZES[-1]
        self.scratch_block = runner.k_caches[0].shape[0] - 1
        self.input_ids = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.positions = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.slot_mapping = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.block_tables = torch.zeros(size, max_blocks_per_seq, dtype=torch.int32, device=dev)  # [size, width]
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=dev)  # [size]
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=dev)  # [size + 1]: one query each
        self.graph_cls = CapturedGraph if dev.type == "cuda" else EagerGraph
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None  # every size shares it
        self.graphs: dict[int, CapturedGraph | EagerGraph] = {}

    def size_for(self, plan) -> int | None:
        """The capture size this step replays, or None when it runs eagerly."""
        if plan.blocks_to_swap_out or plan.blocks_to_swap_in or not plan.scheduled:
            return None
        if any(plan.num_scheduled_tokens[r.request_id] != 1 or not r.is_decode for r in plan.scheduled):
            return None
        return padded_size(len(plan.scheduled))

    def execute(self, plan, size: int) -> ModelRunnerOutput:
        """The step's inputs (the runner's persistent batch) copied on the device into the static
        buffers, rows ``n..size`` padding into the scratch block; then the graph of ``size`` (captured
        now if this is its first step), then sampling from the real rows."""
        requests, r = plan.scheduled, self.runner
        n = len(requests)
        inputs = r.input_batch.prepare(
            requests, plan.num_scheduled_tokens, plan.block_tables, r.slot_mapping, sample=[True] * n
        )
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.slot_mapping[:n].copy_(inputs.slot_mapping)
        self.seq_lens[:n].copy_(inputs.context_lens)
        self.block_tables[:n, : inputs.block_tables.shape[1]].copy_(inputs.block_tables)
        # padding rows: one token at position 0 of the scratch block (their ids are whatever was there)
        self.positions[n:size].zero_()
        self.slot_mapping[n:size].fill_(self.scratch_block * r.block_size)
        self.seq_lens[n:size].fill_(1)
        self.block_tables[n:size, 0].fill_(self.scratch_block)
        graph = self.graphs.get(size)
        if graph is None:
            graph = self.graphs[size] = self.graph_cls(lambda: self.forward(size), self.pool)
        logits = graph.replay()[:n]  # [n, vocab]: the padded rows' logits are dropped
        r._held(plan)
        return ModelRunnerOutput(r._sample(requests, logits), n, num_forward_passes=1)

    def forward(self, size: int) -> torch.Tensor:
        """One decode step of ``size`` rows, reading only the static buffers: what a graph captures."""
        r = self.runner
        attn = r.kv_cache_cls(
            r.k_caches,
            r.v_caches,
            self.slot_mapping[:size],
            self.block_tables[:size],
            self.seq_lens[:size],
            self.query_start_loc[: size + 1],
            r.scale,
            r.attention_backend,
        )
        hidden = r.model(self.input_ids[:size], self.positions[:size], attn)  # [size, hidden]
        return r.model.compute_logits(hidden)  # [size, vocab]
