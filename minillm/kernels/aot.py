"""Compile the Triton kernels ahead of time for GPUs this machine does not have.

Triton compiles for any target it knows, on any machine: ``triton.compile`` with a ``GPUTarget``
lowers a kernel to PTX and assembles it with the ``ptxas`` its wheel ships. That catches, without a
GPU, what the interpreter (``TRITON_INTERPRET=1``, float32 on the CPU) cannot: a kernel that does not
compile for an architecture or a 16-bit dtype, or one whose tiles need more shared memory than the
architecture has.

    python -m minillm.kernels.aot           # minillm's paged attention, every case, a table

Each case is a kernel, its argument types and its compile-time sizes, as the launcher would pick
them for a model's heads (``triton_paged_attention.tile_config``). Run where Triton is imported
without ``TRITON_INTERPRET`` (under the interpreter ``@triton.jit`` makes no compilable kernel).
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minillm.kernels.triton_paged_attention import _paged_attention_kernel, precision, tile_config

# name -> (compute capability, most shared memory one block may use, bytes): the CUDA C Programming
# Guide's "Technical Specifications per Compute Capability" (opt-in maximum per thread block)
ARCHITECTURES = {"T4": (75, 64 * 1024), "A100": (80, 163 * 1024), "H100/H200": (90, 227 * 1024)}

# query heads, KV heads, head dim of the models the course runs on a GPU (GQA groups 2, 3 and 4)
MODEL_HEADS = {"Qwen3-0.6B": (16, 8, 128), "SmolLM2-135M": (9, 3, 64), "Llama-3-8B": (32, 8, 128)}

TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class Case:
    """One compilation: ``kernel`` with its pointer arguments of ``dtype`` (``int_pointers``: int32
    ones), its float scalars ``floats``, every other runtime argument an int32, and ``constexprs``."""

    name: str
    kernel: object  # a @triton.jit function
    dtype: torch.dtype
    constexprs: dict
    int_pointers: tuple = ()
    floats: tuple = ()

    def signature(self) -> dict:
        out = {}
        for arg in inspect.signature(self.kernel.fn).parameters:
            if arg in self.constexprs:
                out[arg] = "constexpr"
            elif arg.endswith("_ptr"):
                out[arg] = "*i32" if arg in self.int_pointers else "*" + TRITON_TYPES[self.dtype]
            else:
                out[arg] = "fp32" if arg in self.floats else "i32"
        return out


def paged_attention_cases() -> list[Case]:
    """minillm's paged-attention kernel as the engine launches it, decode-only and mixed steps (their
    tiles differ): for every model in ``MODEL_HEADS`` in bfloat16 with the default blocks of 16, and
    for Qwen3-0.6B also in float16 and with blocks of 32 (a larger key tile)."""
    configs = [(model, torch.bfloat16, 16) for model in MODEL_HEADS]
    configs += [("Qwen3-0.6B", torch.float16, 16), ("Qwen3-0.6B", torch.bfloat16, 32)]
    cases = []
    for model, dtype, block_size in configs:
        heads, kv_heads, head_dim = MODEL_HEADS[model]
        for decode_only in (True, False):
            sizes = tile_config(heads, kv_heads, head_dim, block_size, decode_only)
            step = "decode" if decode_only else "mixed"
            cases.append(
                Case(
                    f"paged_attention {model} {TRITON_TYPES[dtype]} block {block_size} {step}",
                    _paged_attention_kernel,
                    dtype,
                    {**sizes, "PRECISION": precision(dtype)},
                    int_pointers=("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"),
                    floats=("scale_log2",),
                )
            )
    return cases


def compile_case(case: Case, architecture: str) -> dict:
    """Compile ``case`` for ``architecture``: the shared memory it needs against the limit."""
    capability, limit = ARCHITECTURES[architecture]
    start = time.perf_counter()
    compiled = triton.compile(
        ASTSource(fn=case.kernel, signature=case.signature(), constexprs=case.constexprs),
        target=GPUTarget("cuda", capability, 32),
    )
    shared = compiled.metadata.shared
    return {
        "case": case.name,
        "architecture": architecture,
        "capability": capability,
        "shared_bytes": shared,
        "shared_limit": limit,
        "fits": shared <= limit,
        "num_warps": compiled.metadata.num_warps,
        "seconds": round(time.perf_counter() - start, 2),
    }


def compile_all(cases: list[Case], architectures=tuple(ARCHITECTURES)) -> list[dict]:
    return [compile_case(case, arch) for case in cases for arch in architectures]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = compile_all(paged_attention_cases())
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(
                f"{r['case']:<52} {r['architecture']:<10} {r['shared_bytes']:>7,} of {r['shared_limit']:>7,} B "
                f"{'ok' if r['fits'] else 'TOO MUCH':<8} {r['seconds']:5.1f} s"
            )
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
