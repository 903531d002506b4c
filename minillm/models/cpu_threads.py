"""How many CPU threads torch uses for minillm's models, chosen on purpose.

torch's default is one thread per core, and its OpenMP threads spin while they wait for each other.
On a laptop or a 2-vCPU cloud notebook something else always holds a core (the browser, Jupyter,
another kernel), and then every step waits for a thread that is not running, and a comparison
between two engines measures the neighbours instead of the engines.

``python -m minillm.benchmarks.cpu_threads`` measures it (results in ``minillm/benchmarks/results/
cpu_threads.json``; the tiny model on a 2-core machine): with one core busy, two threads made its
steps 1.9-3.1x slower than one thread did; on the quiet machine two threads sped a 2,048-token
prefill up 1.6x but made decode steps 1.2-1.4x slower.

For SmolLM2-135M (``--model smollm2``, ``results/cpu_threads_smollm2.json``, same machine) two threads
beat one on the quiet machine for every step: decode steps of 1, 4 and 32 requests 1.3x faster,
a 2,048-token prefill 1.6x; with one core busy two threads lose everywhere: decode 1.9-2.5x slower,
the prefill 1.5x.

So minillm sets the thread count when it builds a model on the CPU:

* ``"tiny"``: 1 thread. Its decode steps lose with a second thread, several-fold when a core is
  busy; only its long prefills would gain, and only on a quiet machine.
* any other model: half the logical cores (at least 1, at most 8). The trade, measured above: on a
  quiet machine it gives up to 1.6x (1.3x on decode) against using every core, and in return it does
  not lose 1.5-2.5x when a core is taken, which in a notebook beside a browser is the usual case.
  ``minillm bench``, run on a quiet machine, uses every core for every system it compares.

A server (``minillm serve``) has the machine to itself, so for a real model it takes every core
(``dedicated=True``): on a 2-core VM, ``minillm serve --fast-path`` met the served benchmark's SLOs up to
13.5 and 10.8 req/s with two threads against 8.4 and 7.3 with one (SmolLM2, two rounds each,
interleaved, 2026-12-07: ``python -m minillm.benchmarks.served --server minillm-fast --num-threads N``,
``results/served_threads/``). One thread did give the lower median gap between tokens at 1 req/s
(33-34 ms against 47-57; p95 65-67 against 64-79), but under load the server needs both cores.

``LLM(..., num_threads=N)`` or the environment variable ``MINILLM_NUM_THREADS`` overrides it. The
setting is torch's, so it is per process: the last ``LLM`` built on the CPU sets it for all.
"""

from __future__ import annotations

import os

ENV = "MINILLM_NUM_THREADS"
MAX_DEFAULT_THREADS = 8


def default_num_threads(model, dedicated: bool = False) -> int:
    """The thread count minillm chooses for ``model`` (see the module docstring); ``dedicated``: the
    process has the machine to itself (a server)."""
    if isinstance(model, str) and model == "tiny":
        return 1
    cores = os.cpu_count() or 2
    return cores if dedicated else max(1, min(MAX_DEFAULT_THREADS, cores // 2))


def resolve_num_threads(model, num_threads=None, dedicated: bool = False) -> int:
    """``num_threads`` if given, else ``MINILLM_NUM_THREADS``, else the default for ``model``."""
    source = "num_threads"
    if num_threads is None and os.environ.get(ENV):
        num_threads, source = os.environ[ENV], ENV
        try:
            num_threads = int(num_threads)
        except ValueError:
            raise ValueError(f"{ENV} must be an integer >= 1, got {os.environ[ENV]!r}") from None
    if num_threads is None:
        return default_num_threads(model, dedicated)
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"{source} must be an integer >= 1, got {num_threads!r}")
    return num_threads
