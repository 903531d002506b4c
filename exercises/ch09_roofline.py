# Generated from solutions/ch09_roofline.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 3c8c435a5e2762f4
"""Chapter 9, going fast: the roofline of a decode step.

A step cannot be faster than its device allows. The device moves bytes between memory and its cores
at one rate (``memory_bandwidth``, bytes/s) and does arithmetic at another (``peak_flops``, FLOP/s),
so a step that moves B bytes and does F FLOPs takes at least the slower of the two: ``B / bandwidth``
or ``F / peak``. Which one is slower says what to optimise: a *memory-bound* step wastes arithmetic,
a *compute-bound* one is as fast as the chip's arithmetic goes.

A decode step computes one new token for each of ``batch_size`` requests. The notebook measures both
rates on your device, and your two functions say what they imply:

* ``decode_step_floor``: the least time one decode step can take, and what bounds it;
* ``crossover_batch``: the smallest batch at which decode stops being memory-bound, which is where
  batching stops being free.

``check("ch09")`` grades both on made-up models and devices whose answers it knows; the notebook
then puts your prediction beside the step times it measured on your device and beside the H200's.
"""

from __future__ import annotations

import math


def decode_step_floor(
    num_params: int,
    bytes_per_param: int,
    kv_bytes_per_token: int,
    batch_size: int,
    context_len: int,
    peak_flops: float,
    memory_bandwidth: float,
) -> dict:
    """The roofline of one decode step of a model of ``num_params`` parameters, each stored in
    ``bytes_per_param`` bytes, for ``batch_size`` requests that each have ``context_len`` tokens
    already in the KV cache, on a device with ``peak_flops`` FLOP/s and ``memory_bandwidth`` bytes/s.

    What the step does, and all you count:

    * it reads every weight from memory once: the requests of a batch share each read;
    * each request reads the keys and values of its own ``context_len`` cached tokens, which take
      ``kv_bytes_per_token`` bytes per token (all layers, keys and values together);
    * each weight takes part in one multiply and one add for every token the step computes; the
      attention's own arithmetic is small beside it here and is left out.

    Returns ``{"flops": ..., "bytes": ..., "seconds": ..., "bound": ...}``: the step's FLOPs, the
    bytes it moves, the least time it can take on this device, and ``"compute"`` when the arithmetic
    alone takes at least as long as the memory traffic, else ``"memory"``.

    Example: 1,000 parameters of 2 bytes, no KV cache (``kv_bytes_per_token=0``), batch 1, on a
    device of 1,000 FLOP/s and 1,000 bytes/s: 2,000 FLOPs take 2 s, 2,000 bytes take 2 s, so
    ``{"flops": 2000, "bytes": 2000, "seconds": 2.0, "bound": "compute"}``.
    """
    raise NotImplementedError("write decode_step_floor: the least time one decode step can take on a device")


def crossover_batch(
    num_params: int,
    bytes_per_param: int,
    kv_bytes_per_token: int,
    context_len: int,
    peak_flops: float,
    memory_bandwidth: float,
) -> int | None:
    """The smallest ``batch_size`` (an int >= 1) at which ``decode_step_floor`` with these arguments
    says ``"compute"``; ``None`` when no batch size, however large, gets there.

    Solve for it: do not try batch sizes one after another. On a GPU the answer can be in the
    hundreds, on made-up devices in the billions, and the grader gives each call a few seconds.

    Example: 1,000 parameters of 2 bytes and no KV cache, on a device of 100,000 FLOP/s and 1,000
    bytes/s: the weights take 2 s to read at any batch size and each request's token adds 0.02 s of
    arithmetic, so the answer is 100. With ``kv_bytes_per_token=1`` and ``context_len=20``, each
    request also adds 0.02 s of reads, and no batch size is compute-bound: ``None``.
    """
    raise NotImplementedError("write crossover_batch: the smallest batch at which a decode step is compute-bound")
