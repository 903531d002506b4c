"""How many CPU threads torch uses for minillm's models, chosen on purpose.

torch's default is one thread per core, and its OpenMP threads spin while they wait for each other.
On a laptop or a 2-vCPU cloud notebook something else always holds a core (the browser, Jupyter,
another kernel), and then every step waits for a thread that is not running: steps go from a
fraction of a millisecond to tens of milliseconds, and a comparison between two engines measures
the neighbours instead of the engines. ``python -m minillm.benchmarks.cpu_threads`` measures it:
on a 2-core machine with one core busy, the tiny model's decode steps ran several times slower with
two threads than with one, and even quiet, two threads bought nothing for decode.

So minillm sets the thread count when it builds a model on the CPU:

* ``"tiny"``: 1 thread. Its matrices are too small for threads to pay for their synchronisation.
* any other model: half the logical cores (at least 1, at most 8), leaving room for whatever else
  runs, since a real model's prefill does use a few threads.

``LLM(..., num_threads=N)`` or the environment variable ``MINILLM_NUM_THREADS`` overrides it. The
setting is torch's, so it is per process: the last ``LLM`` built on the CPU sets it for all.
"""

from __future__ import annotations

import os

import torch

ENV = "MINILLM_NUM_THREADS"
MAX_DEFAULT_THREADS = 8


def default_num_threads(model) -> int:
    """The thread count minillm chooses for ``model`` (see the module docstring)."""
    if isinstance(model, str) and model == "tiny":
        return 1
    return max(1, min(MAX_DEFAULT_THREADS, (os.cpu_count() or 2) // 2))


def resolve_num_threads(model, num_threads=None) -> int:
    """``num_threads`` if given, else ``MINILLM_NUM_THREADS``, else the default for ``model``."""
    source = "num_threads"
    if num_threads is None and os.environ.get(ENV):
        num_threads, source = os.environ[ENV], ENV
        try:
            num_threads = int(num_threads)
        except ValueError:
            raise ValueError(f"{ENV} must be an integer >= 1, got {os.environ[ENV]!r}") from None
    if num_threads is None:
        return default_num_threads(model)
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"{source} must be an integer >= 1, got {num_threads!r}")
    return num_threads

