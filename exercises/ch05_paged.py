# Generated from solutions/ch05_paged.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 49df4b350a179f37
"""Chapter 5: paged attention (vLLM): a KV cache cut into fixed-size blocks, handed out just in time.

Chapters 3 and 4 reserved each request room for its longest possible sequence up front. Here the
KV pool is ``num_blocks`` blocks of ``block_size`` token slots each, and a request holds a *block
table*: the physical block ids of its logical blocks 0, 1, 2, ... in order. A token at position
``p`` of a request lives in logical block ``p // block_size``, at offset ``p % block_size``::

    block_size 4, block table [7, 2]:  positions 0..3 -> block 7 (slots 28..31),
                                       positions 4..7 -> block 2 (slots 8..11)

Three exercises:

* ``MyBlockManager``: the allocator that hands out and takes back blocks (the bookkeeping of
  vLLM's ``KVCacheManager``);
* ``slot_mapping``: where each token of a step writes its keys and values in the flat pool;
* ``MyPreemptingScheduler.preempt``: when blocks run out, which running request gives way, and
  what it gives back, by recompute or by swap.

The classes at the bottom plug them into minillm's paged engine::

    llm = LLM("tiny", engine="paged", block_size=4, num_gpu_blocks=16,
              scheduler_cls=MyBlockManagerScheduler, runner_cls=SlotMappingRunner)
    llm = LLM("tiny", engine="paged", block_size=4, num_gpu_blocks=12, preemption_mode="swap",
              scheduler_cls=MyPreemptingScheduler)

``check("ch05")`` grades each one on its own and inside the engine (on minillm's version of the
others).
"""

from __future__ import annotations

from collections import deque

import torch

from minillm.engines.paged import PagedRunner, PagedScheduler
from minillm.request import Request, RequestStatus


class MyBlockManager:
    """The block allocator of a paged KV cache: a free list and one block table per request.

    ``__init__`` (given) sets up the state; you write ``num_free_blocks``, ``allocate_slots`` and
    ``free``. The contract, which the paged scheduler relies on:

    * Just in time: a request with ``t`` tokens in the cache needs ``ceil(t / block_size)`` blocks
      (``num_blocks_for(t)``), no more. ``allocate_slots(request, num_new_tokens)`` makes sure
      ``request`` holds enough blocks for ``request.num_computed_tokens + num_new_tokens`` tokens:
      it appends the missing blocks (taken from the free blocks) to the end of its block table and
      returns True. A request that already holds enough gets nothing new (True). An exact fit is
      fine: a request may take the very last free block. A request's first allocation creates its
      table in ``self.block_tables``.
    * All or nothing: when fewer blocks are free than the request is missing, allocate nothing at
      all (no block leaves the free list, the table is unchanged) and return False; the scheduler
      then preempts someone and asks again.
    * ``free(request)`` gives back every block the request holds, so that later allocations can
      use them, removes its table from ``self.block_tables`` and returns the freed table (the
      block ids, in logical order: a swap copies them out). Freeing a request that holds no blocks
      (one freed already, or never allocated) is a double free: raise ``ValueError``, changing
      nothing.
    * A block is held by at most one request at a time, and is either free or held, never both:
      ``num_free_blocks + the lengths of all tables == num_blocks`` at all times.

    Which free block a request gets is yours to choose (minillm's takes the one freed longest
    ago). ``request.request_id`` (a string) names the request; ``request.num_computed_tokens`` is
    how many of its tokens are already in the cache.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # every block starts free
        self.block_tables: dict[str, list[int]] = {}  # request id -> the blocks it holds, in logical order

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return -(-num_tokens // self.block_size)

    def get_block_table(self, request_id: str) -> list[int]:
        """The blocks ``request_id`` holds, in logical order (empty if none)."""
        return self.block_tables.get(request_id, [])

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """How many blocks are free now."""
        raise NotImplementedError("write num_free_blocks")

    def allocate_slots(self, request, num_new_tokens: int) -> bool:
        """Give ``request`` the blocks it is missing for ``num_computed_tokens + num_new_tokens``
        tokens; False, allocating nothing, when too few are free (see the class docstring)."""
        raise NotImplementedError("write allocate_slots: a step's blocks, all or none")

    def free(self, request) -> list[int]:
        """Give back every block ``request`` holds and return its table; ``ValueError`` on a double free."""
        raise NotImplementedError("write free")


def slot_mapping(
    block_tables: list[list[int]], num_computed_tokens: list[int], num_scheduled_tokens: list[int], block_size: int
) -> list[int]:
    """The slot in the flat KV pool of every token this step computes, in the step's flat order.

    Request i of the step computes ``num_scheduled_tokens[i]`` tokens, at positions
    ``num_computed_tokens[i]``, ``num_computed_tokens[i] + 1``, ... (its first tokens are in the
    cache already); ``block_tables[i]`` is its block table. The step's tokens are request 0's, then
    request 1's, and so on (the flat batch of chapter 4). The pool is one flat row of
    ``num_blocks * block_size`` slots: physical block ``b`` is slots ``b * block_size`` to
    ``b * block_size + block_size - 1``, and a request's logical block ``k`` (its positions
    ``k * block_size`` onwards) is the physical block ``block_tables[i][k]``.

    Return one integer per token (a list of ints, or a 1-D integer tensor).

    Example, ``block_size=4``: a request with table ``[7, 2]`` that has 3 tokens cached and computes
    2 (positions 3 and 4), beside one with table ``[5]`` that prefills 2 tokens::

        slot_mapping([[7, 2], [5]], [3, 0], [2, 2], 4) == [31, 8, 20, 21]
    """
    raise NotImplementedError("write slot_mapping: each new token's slot in the flat pool")


class MyPreemptingScheduler(PagedScheduler):
    """The paged scheduler (minillm's allocator and policy) with your ``preempt``."""

    def preempt(self, preempted: list[str], swap_out: dict[str, list[int]]) -> Request:
        """Free memory for the running requests that need it: preempt one running request, and
        return it. The scheduler calls this while a request's next blocks do not fit, until they do.

        * Which one: the lowest priority, the request admitted last (``self.running`` lists the
          running requests oldest admitted first). It may be the very request that needs blocks.
        * Afterwards it is not running: not in ``self.running``, no batch slot (the scheduler's
          ``release_slot``), no blocks (``self.block_manager``'s ``free``), status
          ``RequestStatus.WAITING``; its id is the last of ``preempted``, and
          ``self.num_preemptions`` counts it.
        * ``self.preemption_mode == "recompute"``: its keys and values are dropped. It resumes
          before any new request, first in ``self.waiting``, with no token computed
          (``num_computed_tokens`` 0): its prompt and the tokens it generated are prefilled again.
          Its generated tokens stay.
        * ``"swap"``: its keys and values are copied to host memory. It is first in
          ``self.swapped``, its ``num_computed_tokens`` unchanged, ``swap_out[its id]`` is the list of
          blocks that hold its computed tokens (``self.computed_blocks(request)``, which reads its
          block table), for the runner to copy out, and ``self.num_swapped_out`` counts it.
        * Two preemptions in one step: the victim admitted earlier ends up first in its queue.

        Example: running ``[A, B, C]`` (A admitted first), waiting ``[D]``, recompute: ``preempt``
        returns C; running is ``[A, B]`` and waiting ``[C, D]``; called again, it returns B and
        waiting is ``[B, C, D]``.
        """
        raise NotImplementedError("write preempt: which running request gives way, and what it gives back")


class MyBlockManagerScheduler(PagedScheduler):
    """The paged engine's scheduler on your allocator:
    ``LLM("tiny", engine="paged", scheduler_cls=MyBlockManagerScheduler)``."""

    block_manager_cls = MyBlockManager


class SlotMappingRunner(PagedRunner):
    """The paged engine's runner, placing each token's keys and values with your ``slot_mapping``:
    ``LLM("tiny", engine="paged", runner_cls=SlotMappingRunner)``."""

    def slot_mapping(self, block_tables, num_computed_tokens, num_scheduled_tokens):
        return torch.as_tensor(slot_mapping(block_tables, num_computed_tokens, num_scheduled_tokens, self.block_size))
