"""The paged runner's persistent batch (``minillm.engines.input_batch``): rows kept across steps,
only new table entries sent, rows given back and reused, and every input equal to one built from
scratch."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import SamplingParams
from minillm.engines.input_batch import InputBatch, flat_positions
from minillm.engines.paged import slot_mapping, slot_mapping_array
from minillm.request import Request

BLOCK_SIZE = 4


def request(rid: str, num_prompt: int, num_computed: int = 0) -> Request:
    r = Request(rid, list(range(1, num_prompt + 1)), SamplingParams(max_tokens=8), arrival_time=0.0)
    r.num_computed_tokens = num_computed
    return r


def prepare(batch, requests, num_scheduled, tables, sample):
    def host_slots(tables, starts, seq_lens):
        return slot_mapping(tables, starts, seq_lens, BLOCK_SIZE)

    return batch.prepare(requests, num_scheduled, tables, host_slots, sample)


def test_inputs_equal_ones_built_from_scratch():
    batch = InputBatch(max_blocks_per_seq=6, device="cpu")
    a, b = request("a", 6), request("b", 9, num_computed=5)  # a prefill, and a chunk from position 5
    tables = {"a": [3, 7], "b": [1, 4, 2]}
    inputs = prepare(batch, [a, b], {"a": 6, "b": 4}, tables, sample=[True, False])
    assert inputs.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 6, 7, 8, 9]
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8]
    assert inputs.slot_mapping.tolist() == slot_mapping([[3, 7], [1, 4, 2]], [0, 5], [6, 4], BLOCK_SIZE)
    assert inputs.block_tables.tolist() == [[3, 7, 0], [1, 4, 2]]  # a's row is past its length: never read
    assert inputs.context_lens.dtype == torch.int32 and inputs.context_lens.tolist() == [6, 9]
    assert inputs.query_start_loc.tolist() == [0, 6, 10]
    assert inputs.logits_indices.tolist() == [5]  # only a's last token is sampled: b's chunk is not its last


def test_a_decode_step_sends_only_the_new_block_and_rows_persist():
    batch = InputBatch(max_blocks_per_seq=4, device="cpu")
    a = request("a", 4)
    prepare(batch, [a], {"a": 4}, {"a": [5]}, [True])
    row = batch.row_of["a"]
    a.num_computed_tokens = 4
    a.append_output_token_ids(9)  # its fifth token opens a second block
    sent = []  # each step's part sizes; parts 6-8 are the table updates' rows, columns and blocks
    copy_in = batch._copy_in

    def recording_copy_in(parts):
        sent.append([len(p) for p in parts])
        return copy_in(parts)

    batch._copy_in = recording_copy_in
    inputs = prepare(batch, [a], {"a": 1}, {"a": [5, 8]}, [True])
    assert batch.row_of["a"] == row and batch.block_table[row, :2].tolist() == [5, 8]
    assert sent[0][6:9] == [1, 1, 1]  # one (row, column, block) update: the new block only
    assert inputs.block_tables.tolist() == [[5, 8]] and inputs.slot_mapping.tolist() == [8 * BLOCK_SIZE]
    a.num_computed_tokens = 5
    a.append_output_token_ids(3)
    sent.clear()
    prepare(batch, [a], {"a": 1}, {"a": [5, 8]}, [True])
    assert sent[0][6:9] == [0, 0, 0]  # same table: nothing to send
    assert (batch.num_entries_sent, batch.num_entries_read) == (2, 1 + 2 + 2)


def test_rows_are_given_back_reused_and_grow_past_the_first_eight():
    batch = InputBatch(max_blocks_per_seq=2, device="cpu", num_rows=8)
    requests = [request(f"r{i}", 2) for i in range(11)]
    tables = {r.request_id: [i] for i, r in enumerate(requests)}
    inputs = prepare(batch, requests, {r.request_id: 2 for r in requests}, tables, [True] * 11)
    assert batch.block_table.shape[0] == 16 and inputs.block_tables.tolist() == [[i] for i in range(11)]
    assert sorted(batch.row_of.values()) == list(range(11))
    freed = batch.row_of["r3"]
    batch.remove("r3")
    new = request("new", 2)
    inputs = prepare(batch, [requests[0], new], {"r0": 1, "new": 2}, {"r0": [0], "new": [9]}, [True, True])
    assert batch.row_of["new"] == freed and inputs.block_tables.tolist() == [[0], [9]]


def test_a_table_wider_than_the_rows_is_refused():
    batch = InputBatch(max_blocks_per_seq=2, device="cpu")
    with pytest.raises(ValueError, match="holds 3 blocks, more than max_blocks_per_seq=2"):
        prepare(batch, [request("a", 12)], {"a": 12}, {"a": [1, 2, 3]}, [True])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40), st.integers(1, 8)), min_size=1, max_size=12))
def test_the_numpy_slots_and_positions_equal_the_loops(requests):
    """(start, new tokens, spare blocks) per request: ``slot_mapping_array`` and ``flat_positions``
    give what the per-token loops give, on decode-like steps (one token a request: the loop) and
    chunk-carrying ones (numpy) alike."""
    starts = [start for start, _, _ in requests]
    seq_lens = [n for _, n, _ in requests]
    rng = random.Random(len(requests))
    tables = [rng.sample(range(1000), (s + n - 1) // BLOCK_SIZE + 1 + spare) for s, n, spare in requests]
    loop = [p for s, n in zip(starts, seq_lens) for p in range(s, s + n)]
    assert list(flat_positions(starts, seq_lens)) == loop
    assert list(flat_positions(starts, [1] * len(starts))) == starts
    assert list(slot_mapping_array(tables, starts, seq_lens, BLOCK_SIZE)) == slot_mapping(
        tables, starts, seq_lens, BLOCK_SIZE
    )
