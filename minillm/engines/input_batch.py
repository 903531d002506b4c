"""The paged runner's persistent batch (vLLM V1's ``InputBatch``; chapter 9's fast path).

A step's inputs differ little from the last step's: in a decode step every running request adds
one token, and a block to its table only once every ``block_size`` tokens. Rebuilding them all from
Python lists each step costs host time in proportion to the batch times its longest block table,
and for a small model on a GPU the host's time, not the GPU's, sets the step time. So:

- **persistent block tables**: each running request owns a row of a block table that stays on the
  device from step to step. A step sends only the entries added since the last one (a few new
  blocks), and the device gathers this step's rows from the table.
- **no Python loop over tokens**: when a step carries prompt chunks, positions (and the paged
  runner's slots) are computed for every token at once in numpy, with a loop over requests only;
  a prefill step of thousands of tokens then costs the host about what a decode step of as many
  requests costs. A decode step (a token a request) keeps the plain loop, quicker at that size.
- **one copy per step**: everything else a step sends (token ids, positions, slots, lengths, query
  starts, rows, new table entries, the rows to sample) is written into one host buffer and copied
  to the device in one transfer. On a GPU the buffer is pinned (page-locked), so the copy is
  asynchronous: the host goes on to launch the forward pass while it runs.

On a CPU the "copy" is free (the device tensors are views of the host buffer), and so is the saving.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, chain

import numpy as np
import torch


@dataclass
class StepInputs:
    """What the model and the attention backend read in one step, all on the device."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each token's k and v go in the pool
    block_tables: torch.Tensor  # [num_seqs, width] int32: this step's rows, in the step's request order
    context_lens: torch.Tensor  # [num_seqs] int32: cached + new tokens each request attends over
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    logits_indices: torch.Tensor  # [num_sampled] int64: the flat rows whose logits are sampled


class InputBatch:
    """Persistent block-table rows on the device, and one staging buffer on the host.

    ``max_blocks_per_seq`` is the table's width: the most blocks one request can hold."""

    def __init__(self, max_blocks_per_seq: int, device: torch.device, num_rows: int = 8):
        self.device = torch.device(device)
        self.block_table = torch.zeros(num_rows, max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self.row_of: dict[str, int] = {}  # request id -> its row
        self.num_blocks_sent: dict[str, int] = {}  # request id -> table entries already on the device
        self.free_rows = list(range(num_rows - 1, -1, -1))  # popped from the end: lowest row first
        self._staging = torch.empty(0, dtype=torch.int64)
        # on a GPU, one event, recorded again after each step's copy (a new event per step would cost a
        # creation each step)
        self._copied = torch.cuda.Event() if self.device.type == "cuda" else None
        # block-table entries sent to the device, and those the steps read (what rebuilding the
        # tables every step would have sent), since the batch was made
        self.num_entries_sent = self.num_entries_read = 0

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_table.shape[1]

    def remove(self, request_id: str) -> None:
        """A finished or preempted request gives its row back (a readmitted one starts a new row)."""
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.free_rows.append(row)
            self.num_blocks_sent.pop(request_id)

    def prepare(self, requests, num_scheduled_tokens, block_tables, slot_mapping, sample) -> StepInputs:
        """The step's inputs for ``requests`` (in that order), each running ``num_scheduled_tokens``
        tokens from its ``num_computed_tokens``. ``block_tables`` maps request id -> table,
        ``slot_mapping(tables, starts, seq_lens)`` gives the tokens' slots on the host, and
        ``sample[i]`` says whether request i's last token's logits are sampled."""
        starts = [r.num_computed_tokens for r in requests]
        seq_lens = [num_scheduled_tokens[r.request_id] for r in requests]
        tables = [block_tables[r.request_id] for r in requests]
        rows, updates = self._assign_rows(requests, tables)
        cu_seqlens = [0, *accumulate(seq_lens)]
        parts = (
            list(chain.from_iterable(r.token_ids_slice(s, s + n) for r, s, n in zip(requests, starts, seq_lens))),
            flat_positions(starts, seq_lens),
            slot_mapping(tables, starts, seq_lens),
            [s + n for s, n in zip(starts, seq_lens)],
            cu_seqlens,
            rows,
            *updates,
            [end - 1 for end, sampled in zip(cu_seqlens[1:], sample) if sampled],
        )
        (input_ids, positions, slots, context_lens, query_start_loc, rows, upd_rows, upd_cols, upd_vals, logits) = (
            self._copy_in(parts)
        )
        if len(upd_rows):
            self.block_table[upd_rows, upd_cols] = upd_vals.to(torch.int32)
        width = max(map(len, tables))
        self.num_entries_sent += len(upd_rows)
        self.num_entries_read += len(rows) * width
        return StepInputs(
            input_ids,
            positions,
            slots,
            self.block_table[rows, :width],
            context_lens.to(torch.int32),
            query_start_loc.to(torch.int32),
            logits,
        )

    def _assign_rows(self, requests, tables) -> tuple[list[int], tuple[list[int], list[int], list[int]]]:
        """Each request's row (a new one for a request not seen since it was admitted), and the
        table entries the device does not have yet, as (rows, columns, blocks)."""
        rows, upd_rows, upd_cols, upd_vals = [], [], [], []
        for request, table in zip(requests, tables):
            rid = request.request_id
            if rid not in self.row_of:
                if not self.free_rows:
                    self._grow_rows()
                self.row_of[rid] = self.free_rows.pop()
                self.num_blocks_sent[rid] = 0
            if len(table) > self.max_blocks_per_seq:
                raise ValueError(
                    f"request {rid} holds {len(table)} blocks, more than max_blocks_per_seq={self.max_blocks_per_seq}"
                )
            row, sent = self.row_of[rid], self.num_blocks_sent[rid]
            rows.append(row)
            upd_rows += [row] * (len(table) - sent)
            upd_cols += range(sent, len(table))
            upd_vals += table[sent:]
            self.num_blocks_sent[rid] = len(table)
        return rows, (upd_rows, upd_cols, upd_vals)

    def _grow_rows(self) -> None:
        """Twice the rows (rare: the table ends as large as the most requests run at once)."""
        old = self.block_table
        self.block_table = torch.zeros(2 * old.shape[0], old.shape[1], dtype=old.dtype, device=self.device)
        self.block_table[: old.shape[0]] = old
        self.free_rows = list(range(2 * old.shape[0] - 1, old.shape[0] - 1, -1))

    def _copy_in(self, parts) -> list[torch.Tensor]:
        """Write ``parts`` one after another into the staging buffer, copy it to the device in one
        non-blocking transfer, and return each part's slice of the device copy."""
        sizes = [len(p) for p in parts]
        total = sum(sizes)
        if total > len(self._staging):
            self._staging = torch.empty(
                max(total, 2 * len(self._staging)), dtype=torch.int64, pin_memory=self.device.type == "cuda"
            )
        if self._copied is not None:
            self._copied.synchronize()  # the last step's copy has read the buffer (it usually has)
        host = self._staging.numpy()
        offset = 0
        for part, size in zip(parts, sizes):
            host[offset : offset + size] = part
            offset += size
        on_device = self._staging[:total].to(self.device, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return list(torch.split(on_device, sizes))


def carries_chunks(seq_lens) -> bool:
    """Whether a step's requests run many tokens each (prompt chunks), where numpy beats a loop."""
    return sum(seq_lens) > 4 * len(seq_lens)


def flat_positions(starts, seq_lens) -> np.ndarray | list[int]:
    """Request i's positions ``starts[i] .. starts[i] + seq_lens[i] - 1``, every request's one after
    the other. With prompt chunks, in numpy without a loop: flat token j of request i sits at
    ``j - cu[i] + starts[i]`` (``cu[i]``: the tokens before request i)."""
    if not carries_chunks(seq_lens):
        return [p for s, n in zip(starts, seq_lens) for p in range(s, s + n)]
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    cu = np.cumsum(seq_lens) - seq_lens
    return np.arange(seq_lens.sum()) + np.repeat(np.asarray(starts, dtype=np.int64) - cu, seq_lens)
