"""The simulator: the real schedulers and engine loop, timed by a cost model instead of a model.

    from minillm.sim import simulate
    result = simulate("continuous", workload, profile="h200-qwen3-0.6b", max_num_seqs=64)

- ``clock``       the simulated clock the engine runs on
- ``cost_model``  the roofline time of one forward pass; ``Profile`` holds one model on one device
- ``twins``       simulated twins of the real model runners (same batch layout, no compute)
- ``simulate``    builds the real engine with the twin and the clock, and runs a workload
- ``fast_forward`` the engine loop, plus running stretches of identical decode steps at once
- ``calibrate``   measures a profile on this machine from the real model's forward passes
"""

from minillm.sim.cost_model import ForwardCost, Profile, available_profiles
from minillm.sim.simulate import SimResult, simulate

__all__ = ["simulate", "SimResult", "Profile", "ForwardCost", "available_profiles"]
