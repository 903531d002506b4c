"""Simulated time: the cost model moves the clock forward instead of the wall clock."""

from __future__ import annotations


class SimClock:
    """The engine's clock in a simulation (same interface as ``minillm.engine.RealClock``).

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
