"""Measure a simulator profile on this machine and save it as JSON.

    python -m minillm.benchmarks.calibrate_profile cpu-tiny                  # the shipped CPU profile
    python -m minillm.benchmarks.calibrate_profile h200-qwen3-0.6b --device cuda --dtype bfloat16

The profile's model shape comes from the shipped profile of that name (or ``--shape-from``), the
device numbers from timing a random-weight model of that shape (``minillm.sim.calibrate``). By
default the result replaces the shipped JSON in ``minillm/sim/profiles``.
"""

from __future__ import annotations

import argparse

import torch

from minillm.sim import Profile
from minillm.sim.calibrate import calibrate
from minillm.sim.cost_model import PROFILE_DIR

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--shape-from", help="profile whose model shape to use (default: NAME)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", help="JSON path (default: minillm/sim/profiles/NAME.json)")
    args = parser.parse_args()

    shape = Profile.load(args.shape_from or args.name).model
    profile = calibrate(shape, args.name, args.device, DTYPES[args.dtype], repeats=args.repeats)
    for p in profile.calibration_points:
        print(
            f"batch {p['batch']:>3} new {p['new_tokens']:>5} context {p['context']:>5}: "
            f"measured {p['seconds'] * 1e3:8.2f} ms, fitted {p['fitted_seconds'] * 1e3:8.2f} ms"
        )
    print(
        f"bandwidth {profile.memory_bandwidth / 1e9:.1f} GB/s, peak {profile.peak_flops / 1e9:.1f} GFLOP/s, "
        f"forward overhead {profile.forward_overhead * 1e3:.3f} ms, per sequence {profile.seq_overhead * 1e6:.1f} us"
    )
    print(profile.notes)
    profile.save(args.out or PROFILE_DIR / f"{args.name}.json")


if __name__ == "__main__":
    main()
