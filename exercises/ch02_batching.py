# Generated from solutions/ch02_batching.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: d797782dc4f44209
"""Chapter 2: static and dynamic batching.

Two exercises, the two decisions a static batcher makes:

* ``left_pad``: how a batch of prompts of different lengths becomes one ``[B, T]`` rectangle that
  the model runs in a single forward pass.
* ``form_batch``: when the next batch starts, and with how many requests (Triton's dynamic batcher:
  wait for a full batch, but never longer than ``max_queue_delay``).

The two classes at the bottom plug your functions into minillm's static engine, so you can watch
your own batches run::

    llm = LLM("tiny", engine="static", max_num_seqs=4, max_queue_delay=0.05,
              runner_cls=LeftPadRunner, scheduler_cls=FormBatchScheduler)

``check("ch02")`` grades both functions, on their own and inside the engine.
"""

from __future__ import annotations

import torch

from minillm.engines.static import PaddedBatchRunner, StaticBatchScheduler


def left_pad(batch_token_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay out a batch of prompts as three ``[B, T]`` tensors, ``T`` the length of the longest prompt.

    Each prompt is *right-aligned*: padding goes on the left, so every prompt ends in the last
    column. Then every row's next token also lands in the same column, and each decode step after
    the prefill is a single ``[B, 1]`` column for the whole batch.

    Return ``(input_ids, positions, mask)``, all on the CPU:

    * ``input_ids`` (integers): the prompt tokens, with ``pad_id`` in front of the shorter ones;
    * ``positions`` (integers): each token's position in its own prompt, counting from 0 at the
      row's first real token, so a prompt gets the same positions as it would alone; pads get 0;
    * ``mask`` (``torch.bool``): True on real tokens, False on pads. The engine hides the pads'
      keys from attention with it, so that padding cannot change any real token's result.

    Example, ``left_pad([[5, 6, 7], [8], [9, 10]], pad_id=0)``::

        input_ids  [[5, 6, 7],      positions  [[0, 1, 2],      mask  [[T, T, T],
                    [0, 0, 8],                  [0, 0, 0],             [F, F, T],
                    [0, 9, 10]]                 [0, 0, 1]]             [F, T, T]]
    """
    raise NotImplementedError("write left_pad: a left-padded batch, its positions and its attention mask")


def form_batch(
    waiting_arrival_times: list[float], now: float, max_num_seqs: int, max_queue_delay: float | None
) -> tuple[int, float | None]:
    """Decide, while no batch is running, whether the next batch starts now and how big it is.

    ``waiting_arrival_times`` are the arrival times of the waiting requests, oldest first; ``now``
    is the current time (seconds, the same clock). A batch takes the oldest waiting requests, at
    most ``max_num_seqs`` of them. Return a pair:

    * ``(n, None)`` to start a batch of ``n`` requests now;
    * ``(0, t)`` to start nothing yet and be asked again at time ``t`` (sooner if a request arrives);
    * ``(0, None)`` when nobody is waiting.

    The rule of a dynamic batcher:

    * a full batch (``max_num_seqs`` or more waiting) starts at once;
    * with ``max_queue_delay=None`` (a plain static batcher) whatever is waiting starts at once;
    * otherwise a partial batch starts once the oldest waiting request has waited
      ``max_queue_delay`` seconds (at exactly that time, too), and until then the batcher waits for
      that deadline, hoping that more requests arrive and fill the batch.

    Example: with ``max_num_seqs=4`` and ``max_queue_delay=0.5``, requests waiting since 1.0 and
    1.2 give ``(0, 1.5)`` at ``now=1.3`` and ``(2, None)`` at ``now=1.5``.
    """
    raise NotImplementedError("write form_batch: how many waiting requests start now, or when to look again")


class LeftPadRunner(PaddedBatchRunner):
    """The static engine's runner, laying out each new batch with your ``left_pad``:
    ``LLM("tiny", engine="static", runner_cls=LeftPadRunner)``."""

    def left_pad(self, batch_token_ids, pad_id):
        return tuple(torch.as_tensor(x) for x in left_pad(batch_token_ids, pad_id))  # lists and arrays work too


class FormBatchScheduler(StaticBatchScheduler):
    """The static engine's scheduler, starting each batch when your ``form_batch`` says:
    ``LLM("tiny", engine="static", max_queue_delay=0.05, scheduler_cls=FormBatchScheduler)``."""

    def form_batch(self, waiting_arrival_times, now):
        return form_batch(waiting_arrival_times, now, self.max_num_seqs, self.max_queue_delay)
