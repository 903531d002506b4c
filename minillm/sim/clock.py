"""Simulated time: the cost model (or each reading) moves the clock forward instead of the wall clock."""

from __future__ import annotations


class SimClock:
    """The engine's clock in a simulation (same interface as ``minillm.llm_engine.RealClock``).

    ``now()`` only changes when the simulator's runner ``advance``-s it by a step's modelled
    duration, or when the engine waits for an arrival: then ``wait_until`` jumps straight to it."""

    def __init__(self):
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def wait_until(self, t: float) -> None:
        self.time = max(self.time, t)

    def advance(self, seconds: float) -> None:
        self.time += seconds


class TickClock(SimClock):
    """A clock for running the real engine deterministically (the grading tests do): each reading
    moves time on by ``tick`` seconds, and waiting jumps straight to the time waited for, so the
    engine makes the same decisions on every run, however fast the machine is."""

    def __init__(self, tick: float = 0.01):
        super().__init__()
        self.tick = tick

    def now(self) -> float:
        self.time += self.tick
        return self.time
