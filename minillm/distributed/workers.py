"""The other ranks of a tensor-parallel runner: one process each, driven step by step.

The driver (rank 0) is the process the ``LLM`` lives in: it schedules, builds each step's inputs,
sends them to every worker (one message per worker per step, as nano-vllm and vLLM broadcast the
step), then runs its own shard; the ranks meet in each layer's all-reduces (``torch.distributed``'s
gloo on a CPU), and only the driver computes logits and samples. A worker keeps its shard of the
weights and its KV heads of every block, and nothing else: no requests, no scheduler.

Two channels, as in vLLM: the step goes down a pipe (control), the activations through the
process group (data). When the driver's process ends, however it ends, the pipe closes and each
worker exits; when a worker fails, its peers' all-reduce fails at once ("Connection closed by
peer"), the driver stops every worker and raises the worker's error, and the next step starts them
afresh. The workers are forked from multiprocessing's forkserver (``worker_context``), which, like
``spawn``, imports the script's main module in each worker: a script that builds a tensor-parallel
``LLM`` needs an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import signal
import tempfile
import traceback
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minillm.distributed.tensor_parallel import build_shard, check_divides, shard_state_dict

START_TIMEOUT_S = 120  # a worker imports torch and minillm and receives its shard
GROUP_TIMEOUT = datetime.timedelta(minutes=10)  # an all-reduce waits this long for a silent peer


@dataclass
class StepMessage:
    """What a worker needs for one step: the plan's block moves, the requests the driver freed
    since the last step (their swapped-out copies go too), and the step's flat inputs."""

    preempted_ids: list[str]
    blocks_to_swap_out: dict[str, list[int]]
    blocks_to_swap_in: dict[str, list[int]]
    freed: list[str]
    inputs: object  # the runner's ``StepInputs``, its tensors as numpy arrays (pickled as plain bytes)


def worker_context():
    """multiprocessing's forkserver where the platform has one (``spawn`` elsewhere), with torch and
    this module imported once, in the server: each worker is a fork of that clean process instead of
    a new interpreter importing torch (the tensor-parallel tests: 64.5 -> 43-48 s on a 2-core CPU). Never
    a plain fork of the driver, which would copy its threads (OpenMP's, a server's) mid-work."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", __name__])
    return ctx


def join_group(store_path: str, rank: int, world_size: int):
    """The ranks' process group: gloo over loopback TCP, found through a file they all see."""
    store = dist.FileStore(store_path, world_size)
    return dist.ProcessGroupGloo(store, rank, world_size, GROUP_TIMEOUT)


class TensorParallelWorkers:
    """Ranks 1..N-1 as processes, seen from the driver. ``model`` is the whole model; each worker
    gets its own shard. ``make_runner(shard)`` builds a rank's runner (the same paged runner as the
    driver's, with its share of the KV pool)."""

    def __init__(self, model, tensor_parallel_size: int, make_runner):
        check_divides(model.config, tensor_parallel_size)
        if next(model.parameters()).device.type != "cpu":
            raise ValueError(
                "tensor_parallel_size > 1 runs on the CPU (gloo) only for now: NCCL on CUDA has not run yet"
            )
        self.model, self.size, self.make_runner = model, tensor_parallel_size, make_runner
        self.freed: list[str] = []
        self.procs, self.conns = [], []
        self.group = None
        self._stop = None

    @property
    def started(self) -> bool:
        return self.group is not None

    def start(self):
        """Spawn the workers, join the group with them as rank 0, wait until every worker holds its
        shard, and return the driver's own shard (rank 0's)."""
        store_dir = tempfile.mkdtemp(prefix="minillm-tp-")
        store_path = os.path.join(store_dir, "store")  # where the ranks find each other
        ctx = worker_context()
        threads = torch.get_num_threads()
        for rank in range(1, self.size):
            here, there = ctx.Pipe()
            args = (rank, self.size, store_path, there, self.make_runner, threads)
            proc = ctx.Process(target=worker_main, args=args, daemon=True, name=f"minillm-tp-rank{rank}")
            proc.start()
            there.close()
            # the shard goes down the pipe, not with the start: a forkserver takes at most a few
            # hundred file descriptors with a new process, and a real model's shard shares one per tensor
            try:
                here.send(self._shard_message(rank))
            except OSError:  # the worker is gone already: _expect names it below
                pass
            self.procs.append(proc)
            self.conns.append(here)
        self._stop = weakref.finalize(self, stop_processes, self.procs, self.conns)
        self._expect("started")  # a worker that cannot even start fails here, before the group waits for it
        self.group = join_group(store_path, 0, self.size)
        self._expect("ready")
        shutil.rmtree(store_dir, ignore_errors=True)
        m = self.model
        return build_shard(m.config, shard_state_dict(m, 0, self.size), m.eos_token_ids, self.size, self.group)

    def _expect(self, word: str) -> None:
        """Every worker says ``word``, or all of them stop and the first that did not is named."""
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            try:
                said = conn.recv() if conn.poll(START_TIMEOUT_S) else f"nothing in {START_TIMEOUT_S} s"
            except EOFError:
                said = "nothing"
            if said != word:
                self.stop()
                raise RuntimeError(
                    f"tensor-parallel worker {rank} did not start (exit code {proc.exitcode}); it said: {said}\n"
                    'In a script, build a tensor-parallel LLM under an `if __name__ == "__main__":` guard.'
                )

    def _shard_message(self, rank: int) -> tuple:
        m = self.model
        return m.config, shard_state_dict(m, rank, self.size), m.eos_token_ids

    def send(self, plan, inputs) -> None:
        """The step, to every worker, before the driver runs its own shard."""
        message = StepMessage(
            list(plan.preempted_ids),
            dict(plan.blocks_to_swap_out),
            dict(plan.blocks_to_swap_in),
            self.freed,
            as_arrays(inputs),
        )
        self.freed = []
        for conn in self.conns:
            conn.send(message)

    def failure(self) -> str | None:
        """What went wrong on the workers' side: the traceback a worker sent before it exited, or
        which worker exited without a word; None when they are all still there."""
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            try:
                if conn.poll(1.0):
                    return f"tensor-parallel worker {rank} failed:\n{conn.recv()}"
            except (EOFError, OSError):
                pass
            proc.join(timeout=1.0)
            if not proc.is_alive():
                return f"tensor-parallel worker {rank} exited (exit code {proc.exitcode}) during a step"
        return None

    def stop(self) -> None:
        """End every worker; the next ``start`` spawns new ones."""
        if self._stop is not None:
            self._stop()
        self.procs, self.conns, self.group, self.freed = [], [], None, []


def stop_processes(procs, conns) -> None:
    """Close the pipes (a worker waiting for a step exits), then make sure: terminate, then kill."""
    for conn in conns:
        conn.close()
    for proc in procs:
        proc.join(timeout=2)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=2)
        if proc.is_alive():
            proc.kill()
            proc.join()


def worker_main(rank, world_size, store_path, conn, make_runner, num_threads) -> None:
    """A worker's life: receive its shard, join the group, build its runner, then run each step it is
    sent until the pipe closes. Ctrl-C is the driver's to handle: a worker ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(num_threads)
    try:
        conn.send("started")
        cfg, state, eos_token_ids = conn.recv()  # its shard
        group = join_group(store_path, rank, world_size)
        runner = make_runner(build_shard(cfg, state, eos_token_ids, world_size, group))
        conn.send("ready")
        while True:
            message = conn.recv()
            run_step(runner, message)
    except EOFError:  # the driver closed the pipe or is gone: nothing more to do
        pass
    except BaseException:
        try:
            conn.send(traceback.format_exc())
        except OSError:
            pass


@torch.inference_mode()
def run_step(runner, message: StepMessage) -> None:
    """The worker's side of a step: the same block moves and the same forward pass as the driver's,
    on its shard; the hidden states it ends with are the driver's too, and nobody reads them."""
    for rid in message.freed:
        runner.free(rid)
    runner._swap(message)
    inputs = message.inputs
    runner.forward(dataclasses.replace(inputs, **{k: torch.from_numpy(v) for k, v in vars(inputs).items()}))


def as_arrays(inputs):
    """The step's inputs with numpy arrays for tensors: a plain pickle, not a shared-memory handle per tensor."""
    return dataclasses.replace(inputs, **{k: v.cpu().numpy() for k, v in vars(inputs).items()})
