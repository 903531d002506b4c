"""CUDA graphs for the paged runner's mixed steps: the forward captured in pieces, broken at attention.

A decode-only step has one shape per batch size, so it is captured whole (``cuda_graphs.py``). A
step with a prompt or a chunk in it does not: how its tokens split into requests, and so what
attention computes, changes every step. But everything else in the model (embeddings, norms,
projections, rotary embedding, MLP) treats each token row on its own, and depends only on how many
rows there are. So a mixed step of ``n`` tokens is padded up to a capture size, and the forward is
captured in ``num_layers + 1`` pieces, the cuts at the attention calls: at a replay, the pieces run
from their graphs and each layer's attention runs eagerly between them, on the step's real rows
only (vLLM's piecewise CUDA graphs likewise leave attention out of what they capture
[vllm-docs-cuda-graphs]).

The model is not rewritten for this: it attends through whatever ``kv_cache`` it is handed, and
here that is ``AttentionBreak``, which copies ``q``, ``k`` and ``v`` into static buffers, lets the
step's attention run (or, while capturing, ends one piece and starts the next), and hands back a
static output buffer. One set of buffers serves every layer: layer ``i``'s attention is done with
them before layer ``i + 1``'s piece writes them again.

The sizes are ``CAPTURE_SIZES`` in tokens, up to the first that holds the step's token budget
(``max_num_batched_tokens``); a step past the largest runs eagerly. The pieces share the decode
graphs' memory pool (they never run at once). On a CPU the pieces cannot be captured: the stand-in
runs the same forward through the same buffers at every step, so the padding and the buffers'
round trip run (and are tested) anywhere, with no speed-up.
"""

from __future__ import annotations

import torch

from minillm.engines.cuda_graphs import capture_sizes, padded_size


class AttentionBreak:
    """The ``kv_cache`` a piecewise forward attends through: ``q``, ``k``, ``v`` into the static
    buffers, then ``between(layer_idx)`` (the step's attention into ``out``, or the cut between two
    captured pieces), then ``out`` back to the layer."""

    def __init__(self, graphs: PiecewiseGraphs, between):
        self.graphs, self.between = graphs, between

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        g, size = self.graphs, q.shape[0]
        g.q[:size].copy_(q)
        g.k[:size].copy_(k)
        g.v[:size].copy_(v)
        self.between(layer_idx)
        return g.out[:size]


class CapturedPieces:
    """One capture size's forward as ``num_layers + 1`` CUDA graphs, cut at each attention call."""

    def __init__(self, graphs: PiecewiseGraphs, size: int):
        self.pieces: list[torch.cuda.CUDAGraph] = []
        stream = graphs.stream  # warm up and capture off the default stream, as PyTorch's notes ask
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graphs.model_forward(size, AttentionBreak(graphs, lambda layer_idx: None))  # warm-up
            torch.cuda.synchronize()
            self.pieces.append(torch.cuda.CUDAGraph())
            self.pieces[-1].capture_begin(pool=graphs.pool)
            self.hidden = graphs.model_forward(size, AttentionBreak(graphs, lambda layer_idx: self._cut(graphs.pool)))
            self.pieces[-1].capture_end()
        torch.cuda.current_stream().wait_stream(stream)

    def _cut(self, pool) -> None:
        """End the piece being captured at an attention call; begin the next one."""
        self.pieces[-1].capture_end()
        self.pieces.append(torch.cuda.CUDAGraph())
        self.pieces[-1].capture_begin(pool=pool)

    def replay(self, attend_real_rows) -> torch.Tensor:
        """The pieces in order, ``attend_real_rows(layer_idx)`` after each but the last."""
        for layer_idx, piece in enumerate(self.pieces):
            piece.replay()
            if layer_idx < len(self.pieces) - 1:
                attend_real_rows(layer_idx)
        return self.hidden


class EagerPieces:
    """The CPU's stand-in: the forward through the same buffers at every replay."""

    def __init__(self, graphs: PiecewiseGraphs, size: int):
        self.graphs, self.size = graphs, size
        self.num_replays = 0

    def replay(self, attend_real_rows) -> torch.Tensor:
        self.num_replays += 1
        return self.graphs.model_forward(self.size, AttentionBreak(self.graphs, attend_real_rows))


class PiecewiseGraphs:
    """The static buffers and one ``CapturedPieces`` per capture size, for one ``PagedRunner``,
    captured when it is built, the largest first, in ``pool`` on ``stream`` (which the decode graphs
    share; None on a CPU)."""

    def __init__(self, runner, max_num_batched_tokens: int | None, pool, stream):
        self.runner, self.pool, self.stream = runner, pool, stream
        self.sizes = capture_sizes(max_num_batched_tokens)
        cfg, dev, dtype, size = runner.model.config, runner.device, runner.dtype, self.sizes[-1]
        self.input_ids = torch.zeros(size, dtype=torch.long, device=dev)  # [size]
        self.positions = torch.zeros(size, dtype=torch.long, device=dev)  # [size]: padding rows at 0
        heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q = torch.zeros(size, heads, head_dim, dtype=dtype, device=dev)
        self.k = torch.zeros(size, kv_heads, head_dim, dtype=dtype, device=dev)
        self.v = torch.zeros(size, kv_heads, head_dim, dtype=dtype, device=dev)
        self.out = torch.zeros(size, heads, head_dim, dtype=dtype, device=dev)
        pieces_cls = CapturedPieces if dev.type == "cuda" else EagerPieces
        self.graphs = {n: pieces_cls(self, n) for n in reversed(self.sizes)}

    def size_for(self, num_tokens: int) -> int | None:
        """The capture size a step of ``num_tokens`` tokens replays, or None when it runs eagerly."""
        return padded_size(num_tokens, self.sizes)

    def model_forward(self, size: int, kv_cache: AttentionBreak) -> torch.Tensor:
        """The model over ``size`` rows of the static buffers: what the pieces capture."""
        return self.runner.model(self.input_ids[:size], self.positions[:size], kv_cache)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn, size: int) -> torch.Tensor:
        """The step's tokens into the static buffers, rows past them padding; the pieces of ``size``
        replayed, ``attn`` (the step's attention backend) between them on the real rows only; the
        real rows' hidden states ``[n, hidden]``."""
        n = len(input_ids)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.positions[n:size].zero_()

        def attend_real_rows(layer_idx: int) -> None:
            self.out[:n].copy_(attn.attend(layer_idx, self.q[:n], self.k[:n], self.v[:n]))

        return self.graphs[size].replay(attend_real_rows)[:n]
