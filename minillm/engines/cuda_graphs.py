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
- **decode-only steps**: a prefill or a chunk has a shape of its own each step, so mixed steps (see
  ``piecewise_graphs.py``), steps with swaps and steps past the largest size do not replay these.

The graphs are captured when the engine is built, not when a size is first needed (a step that
waits for its capture stalls every request in it): each size up to the first that holds
``max_num_seqs`` decodes (a decode-only step never has more), the largest first, so that the smaller
graphs reuse the memory the largest one took from the pool they share (vLLM's order
[vllm-source-gpu-model-runner]). The runner records what the captures cost
(``graph_capture_seconds``, ``graph_memory_bytes``); a KV pool sized by ``gpu_memory_utilization``
leaves room for them (``minillm.kv.memory_budget``). Mixed steps have graphs of their own, in pieces
(``piecewise_graphs.py``), in the same memory pool.

On a CPU there are no CUDA graphs: ``EagerGraph`` stands in, running the captured step as it is at
every replay on the same static buffers, so the bucketing and padding run (and are tested)
anywhere, with no speed-up.
"""

from __future__ import annotations

import bisect
from functools import partial

import torch

from minillm.runner import ModelRunnerOutput

CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def padded_size(num_seqs: int, sizes=CAPTURE_SIZES) -> int | None:
    """The smallest capture size that holds ``num_seqs`` decodes; None past the largest."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def capture_sizes(max_num_seqs: int | None) -> tuple[int, ...]:
    """The sizes to capture for a scheduler that runs at most ``max_num_seqs`` requests at once
    (None: no bound): every capture size up to the first that holds them all."""
    largest = None if max_num_seqs is None else padded_size(max_num_seqs)
    return CAPTURE_SIZES if largest is None else CAPTURE_SIZES[: CAPTURE_SIZES.index(largest) + 1]


class CapturedGraph:
    """``forward`` captured once as a CUDA graph; ``replay()`` relaunches it and returns its output.
    It warms up and is captured on ``stream``, not the default stream, as PyTorch's notes ask."""

    def __init__(self, forward, pool, stream):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            self.output = forward()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class EagerGraph:
    """The CPU's stand-in: runs ``forward`` at every replay, on the same static buffers."""

    def __init__(self, forward):
        self.forward = forward
        self.num_replays = 0

    def replay(self) -> torch.Tensor:
        self.num_replays += 1
        return self.forward()


class DecodeGraphs:
    """The static buffers and one graph per capture size, for one ``PagedRunner``, captured when it is
    built, the largest first, in ``pool`` on ``stream`` (None on a CPU). The runner's KV pool has one
    block more than the block manager hands out: the scratch block, where padded rows write."""

    def __init__(self, runner, max_blocks_per_seq: int, max_num_seqs: int | None, pool, stream):
        self.runner = runner
        self.sizes = capture_sizes(max_num_seqs)
        dev, size = runner.device, self.sizes[-1]
        self.scratch_block = runner.k_caches[0].shape[0] - 1
        self.input_ids = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.positions = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.slot_mapping = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.block_tables = torch.zeros(size, max_blocks_per_seq, dtype=torch.int32, device=dev)  # [size, width]
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=dev)  # [size]
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=dev)  # [size + 1]: one query each
        self._pad(0, size)  # the captures write only the scratch block

        def graph(forward):
            return CapturedGraph(forward, pool, stream) if dev.type == "cuda" else EagerGraph(forward)

        self.graphs = {n: graph(partial(self.forward, n)) for n in reversed(self.sizes)}

    def size_for(self, plan) -> int | None:
        """The capture size this step replays, or None when it runs eagerly."""
        if plan.blocks_to_swap_out or plan.blocks_to_swap_in or not plan.scheduled:
            return None
        if any(plan.num_scheduled_tokens[r.request_id] != 1 or not r.is_decode for r in plan.scheduled):
            return None
        return padded_size(len(plan.scheduled), self.sizes)

    def execute(self, plan, size: int) -> ModelRunnerOutput:
        """The step's inputs (the runner's persistent batch) copied on the device into the static
        buffers, rows ``n..size`` padding into the scratch block; then the graph of ``size``, then
        the real rows' logits and sampling (outside the graph: a graph's output stays allocated for
        good, and every size's ``[size, vocab]`` logits would add up to gigabytes for a large vocabulary)."""
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
        self._pad(n, size)
        hidden = self.graphs[size].replay()[:n]  # [n, hidden]: the padded rows are dropped
        r._held(plan)
        tokens = r._sample(requests, r.model.compute_logits(hidden))
        return ModelRunnerOutput(tokens, size, num_forward_passes=1)  # the padding rows were computed too

    def _pad(self, start: int, stop: int) -> None:
        """Rows ``start..stop`` as padding: one token at position 0 of the scratch block (their ids
        are whatever was there)."""
        self.positions[start:stop].zero_()
        self.slot_mapping[start:stop].fill_(self.scratch_block * self.runner.block_size)
        self.seq_lens[start:stop].fill_(1)
        self.block_tables[start:stop, 0].fill_(self.scratch_block)

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
        return r.model(self.input_ids[:size], self.positions[:size], attn)  # [size, hidden]


def free_memory(device: torch.device) -> int:
    """The device's free bytes, once its queued work is done (0 on a CPU)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]
