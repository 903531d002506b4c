"""Chapter 4: selective batching (Orca) -- one flat token batch, attention per request.

Continuous batching mixes requests in different phases: one prefills 40 prompt tokens while others
decode one token each. Chapter 3's runner batched only the decodes and gave every new prompt a pass
of its own (weights read again); padding them all into a rectangle would waste most of it. Orca's observation:
only attention needs to know which token belongs to which request. Every other operation (the
linear layers, norms, RoPE, the MLP) treats tokens independently, so the step's tokens are
concatenated into one flat ``[num_tokens]`` batch and run through each weight matrix *once*.
Attention alone splits the batch again, by ``cu_seqlens``, into each request's ragged segment.

    tokens       a0 a1 a2 a3 | b7 | c5      (A prefills 4 prompt tokens, B and C decode one each)
    cu_seqlens   0           4    5    6
    positions    0  1  2  3    7    5

The KV layout is unchanged from chapters 1 and 3: one contiguous cache per request.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from minillm.attention.ragged import RaggedKVCache
from minillm.engines.naive import ModelRunner
from minillm.runner import ModelRunnerOutput
from minillm.scheduler import SchedulerOutput


class SelectiveBatchRunner(ModelRunner):
    """Packs every scheduled request's tokens -- whole prompts and single decode tokens -- into one
    forward pass per step."""

    @torch.inference_mode()
    def execute_model(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        requests = plan.scheduled
        seq_lens = [plan.num_scheduled_tokens[r.request_id] for r in requests]
        cu_seqlens = [0, *accumulate(seq_lens)]
        starts = [r.num_computed_tokens for r in requests]  # each segment's first position
        num_tokens = cu_seqlens[-1]

        input_ids = torch.tensor(  # [num_tokens]
            [t for r, s, n in zip(requests, starts, seq_lens) for t in r.token_ids_slice(s, s + n)], device=self.device
        )
        _, positions = flat_positions(starts, seq_lens, self.device)  # [num_tokens]

        attn = RaggedKVCache([self._cache(r) for r in requests], cu_seqlens)
        hidden = self.model(input_ids, positions, attn)  # [num_tokens, hidden]
        attn.advance()

        # Sample for requests whose known tokens are all computed, from their segment's last token.
        done = [i for i, r in enumerate(requests) if starts[i] + seq_lens[i] == r.num_tokens]
        logits_indices = torch.tensor([cu_seqlens[i + 1] - 1 for i in done], device=self.device, dtype=torch.long)
        logits = self.model.compute_logits(hidden[logits_indices])  # [len(done), vocab]
        tokens = self._sample([requests[i] for i in done], logits)
        return ModelRunnerOutput(tokens, num_tokens, num_forward_passes=1)


def flat_positions(num_computed_tokens: list[int], num_scheduled_tokens: list[int], device=None):
    """Where each token of a flat batch belongs: ``(seq_index, positions)``, both int64 ``[num_tokens]``.
    Request i's ``num_scheduled_tokens[i]`` tokens follow request i - 1's in the batch and sit at
    positions ``num_computed_tokens[i]`` onwards, so token j belongs to request ``seq_index[j]`` and its
    position is its request's start position plus its offset in the request's segment."""
    lens = torch.tensor(num_scheduled_tokens, dtype=torch.long, device=device)  # [num_seqs]
    num_tokens = sum(num_scheduled_tokens)
    seq_index = torch.arange(len(lens), device=device).repeat_interleave(lens, output_size=num_tokens)
    cu_seqlens = [0, *accumulate(num_scheduled_tokens)]
    # each segment's start position minus where the segment starts in the batch: [num_seqs]
    offsets = torch.tensor([s - c for s, c in zip(num_computed_tokens, cu_seqlens)], dtype=torch.long, device=device)
    return seq_index, torch.arange(num_tokens, device=device) + offsets[seq_index]
