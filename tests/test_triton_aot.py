"""Every Triton kernel in the course compiles for the GPUs learners use (T4, A100, H100/H200), in the
16-bit dtypes the engine runs, and fits each architecture's shared memory: checked here without a
GPU (``minillm.kernels.aot``), which the interpreter-run tests cannot check (they run float32 on the
CPU).

The compilation runs in a child process: a test process that imported Triton under
``TRITON_INTERPRET=1`` (the kernel tests do) holds kernels that only the interpreter can run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import torch
from minillm.kernels import aot

cases = aot.paged_attention_cases()
if sys.argv[1] == "solutions":  # chapter 5's kernel puzzles, as the reference answers write them
    from solutions import ch05_kernel as ch05

    for dtype in (torch.float32, torch.bfloat16):
        sizes = {"GROUP": 2, "BLOCK_SIZE": 16, "HEAD_DIM": 64}
        cases += [
            aot.Case(f"puzzle 1 {dtype}", ch05.one_block_attention_kernel, dtype, sizes, floats=("scale",)),
            aot.Case(f"puzzle 2 {dtype}", ch05.paged_decode_kernel, dtype, sizes,
                     int_pointers=("block_tables_ptr", "seq_lens_ptr"), floats=("scale",)),
        ]
print(json.dumps(aot.compile_all(cases)))
"""


def compile_everything(with_solutions: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_INTERPRET": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, "solutions" if with_solutions else "minillm"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_kernel_compiles_for_t4_a100_and_h100_within_their_shared_memory():
    pytest.importorskip("triton")
    with_solutions = (ROOT / "solutions" / "ch05_kernel.py").is_file()  # a student copy has none
    rows = compile_everything(with_solutions)
    architectures = {"T4", "A100", "H100/H200"}
    names = {r["case"] for r in rows}
    kernels = ["paged_attention", *(["puzzle 1", "puzzle 2"] if with_solutions else [])]
    assert all(any(name.startswith(kernel) for name in names) for kernel in kernels), names
    for case in {r["case"] for r in rows}:
        assert {r["architecture"] for r in rows if r["case"] == case} == architectures, case
    too_big = [
        f"{r['case']} on {r['architecture']}: {r['shared_bytes']:,} of {r['shared_limit']:,} bytes"
        for r in rows
        if not r["fits"]
    ]
    assert not too_big, "shared memory over the architecture's limit: " + "; ".join(too_big)
    assert all(r["shared_bytes"] > 0 and r["num_warps"] >= 1 for r in rows)
