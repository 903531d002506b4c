"""Chapter 9's CPU decode-attention kernel (``csrc/paged_decode_attention.c``), compiled on first use.

On a CPU, the PyTorch backend spends most of a decode step's attention copying: each layer gathers
every decoding request's blocks into one padded tensor, then attends over the copy. The C kernel
reads each key and value once, in place, through the block table. A C compiler is all it needs
(``$CC``, else ``cc``; GCC and clang both work): the source is built once per machine into
``~/.cache/minillm/kernels/`` (or ``$MINILLM_CACHE/kernels``), under a name that hashes the source,
the flags and the CPU, and loaded with ctypes. Where the compiler has no OpenMP (Apple's clang), the
kernel builds without it and runs on one thread. Where nothing builds, ``unavailable_reason`` says why
and the engine keeps the PyTorch backend.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "paged_decode_attention.c"
# tried in order, the first that builds wins: OpenMP (every core torch uses), then one thread
FLAG_SETS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-march=native"),
    ("-O3",),
)
DTYPE = torch.float32  # the kernel's one dtype


def kernel_dir() -> Path:
    """``$MINILLM_CACHE/kernels``, else ``~/.cache/minillm/kernels``: beside the downloaded models
    (``minillm.models.download.cache_root``, which this layer sits below and cannot import)."""
    return Path(os.environ.get("MINILLM_CACHE") or Path.home() / ".cache" / "minillm") / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def _library_path(compiler: str, flags: tuple[str, ...]) -> Path:
    """Where this source, built with ``flags`` for this CPU, is kept: rebuilt when any of them changes."""
    key = "\n".join([SOURCE.read_text(), compiler, *flags, platform.machine(), torch.backends.cpu.get_cpu_capability()])
    return kernel_dir() / f"paged_decode_attention-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def _build(compiler: str, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile the source to ``target`` (written under a temporary name, then moved, so a process
    never loads a half-written file); the compiler's complaint when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        cmd = [compiler, *flags, "-shared", "-fPIC", str(SOURCE), "-o", str(partial), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        os.replace(partial, target)
    return None


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded kernel, None), or (None, why it is not available). Built at most once per process."""
    compiler = _compiler()
    if compiler is None:
        return None, f"no C compiler found (looked for {os.environ.get('CC') or 'cc'!r}; set $CC to one)"
    errors = []
    for flags in FLAG_SETS:
        path = _library_path(compiler, flags)
        if not path.exists():
            error = _build(compiler, flags, path)
            if error is not None:
                errors.append(f"{' '.join(flags)}: {error.splitlines()[-1]}")  # its last line says what failed
                continue
        lib = ctypes.CDLL(str(path))
        fn = lib.paged_decode_attention
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float]
        return lib, None
    return None, f"{compiler} could not build {SOURCE.name}: " + "; ".join(errors)


def unavailable_reason() -> str | None:
    """None when the kernel is ready (building it now if needed), else why it cannot run here."""
    return _load()[1]


def check_usable(device, dtype: torch.dtype, name: str) -> None:
    """Raise a ValueError naming the option ``name`` (set to ``"cpu"``) unless the kernel can run on
    ``device`` in ``dtype``: the CPU, float32, and a kernel that built."""
    if torch.device(device).type != "cpu" or dtype != DTYPE:
        raise ValueError(f"{name}='cpu' runs on the CPU in {DTYPE}, got {dtype} on {device}")
    if (why := unavailable_reason()) is not None:
        raise ValueError(f"{name}='cpu' is not available here: {why}")


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """One query per sequence over its paged context: ``q`` ``[num_seqs, num_heads, head_dim]``, the pools
    ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``block_tables`` ``[num_seqs, max_blocks]`` and
    ``seq_lens`` ``[num_seqs]`` (context including this step's token). float32 CPU tensors, shapes checked
    by the caller (``paged_attention``); returns ``[num_seqs, num_heads, head_dim]``."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"the CPU attention kernel is not available: {why}")
    # the C loop reads raw memory row by row: contiguous tensors, int32 indices (no copy when already so)
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens = block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    failed = lib.paged_decode_attention(
        out.data_ptr(),
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        seq_lens.data_ptr(),
        num_seqs,
        num_heads,
        k_cache.shape[2],
        head_dim,
        k_cache.shape[1],
        block_tables.shape[1],
        scale,
    )
    if failed:
        raise MemoryError("the CPU attention kernel could not allocate its scores buffer")
    return out
