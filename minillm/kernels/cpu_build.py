"""Chapter 9's C kernels (``csrc/*.c``), compiled on first use into one library and loaded with ctypes.

A C compiler is all they need (``$CC``, else ``cc``; GCC and clang both work): the sources are built
once per machine into ``~/.cache/minillm/kernels/`` (or ``$MINILLM_CACHE/kernels``), under a name that
hashes the sources, the flags and the CPU. Where the compiler has no OpenMP (Apple's clang), they
build without it and run on one thread. Where nothing builds, ``unavailable_reason`` says why and the
engine keeps its PyTorch code. ``cpu_attention`` and ``cpu_ops`` wrap the functions for PyTorch tensors.
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

CSRC = Path(__file__).with_name("csrc")
SOURCES, HEADERS = tuple(sorted(CSRC.glob("*.c"))), tuple(sorted(CSRC.glob("*.h")))
# tried in order, the first that builds wins: OpenMP (every core torch uses), then one thread.
# -fno-trapping-math: the kernels never read the CPU's floating-point exception flags, and without
# it GCC keeps a compare (fast_exp's clamps) as a branch, which stops a loop from vectorising: the
# C SiLU ran 2.5x slower than PyTorch's on an AVX2 CPU until this flag.
FLAG_SETS = (
    ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp"),
    ("-O3", "-march=native", "-fno-trapping-math"),
    ("-O3",),
)
DTYPE = torch.float32  # the kernels' one dtype

P, INT, LONG, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
SIGNATURES = {  # name: (return type, argument types), as the C sources declare them
    "paged_decode_attention": (ctypes.c_int, [P] * 6 + [INT] * 6 + [FLOAT]),
    "paged_prefill_attention": (ctypes.c_int, [P] * 8 + [INT] * 6 + [LONG, FLOAT]),
    "rms_norm": (None, [P, P, P, LONG, INT, FLOAT]),
    "add_rms_norm": (None, [P, P, P, P, LONG, INT, FLOAT]),
    "rotary_embedding": (None, [P, LONG, LONG, INT, INT, P, P]),
    "silu_and_mul": (None, [P, P, LONG, INT]),
    "linear_few_rows": (None, [P, LONG, P, P, P, LONG, LONG, LONG]),
}


def kernel_dir() -> Path:
    """``$MINILLM_CACHE/kernels``, else ``~/.cache/minillm/kernels``: beside the downloaded models
    (``minillm.models.download.cache_root``, which this layer sits below and cannot import)."""
    return Path(os.environ.get("MINILLM_CACHE") or Path.home() / ".cache" / "minillm") / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def _library_path(compiler: str, flags: tuple[str, ...]) -> Path:
    """Where these sources, built with ``flags`` for this CPU, are kept: rebuilt when any of them changes."""
    machine = (platform.machine(), torch.backends.cpu.get_cpu_capability())
    key = "\n".join([*(s.read_text() for s in SOURCES + HEADERS), compiler, *flags, *machine])
    return kernel_dir() / f"minillm_kernels-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def _build(compiler: str, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile the sources to ``target`` (written under a temporary name, then moved, so a process
    never loads a half-written file); the compiler's complaint when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        cmd = [compiler, *flags, "-shared", "-fPIC", *map(str, SOURCES), "-o", str(partial), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        os.replace(partial, target)
    return None


@functools.cache
def load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library, None), or (None, why it is not available). Built at most once per process."""
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
        for name, (restype, argtypes) in SIGNATURES.items():
            getattr(lib, name).restype, getattr(lib, name).argtypes = restype, argtypes
        return lib, None
    return None, f"{compiler} could not build {', '.join(s.name for s in SOURCES)}: " + "; ".join(errors)


def unavailable_reason() -> str | None:
    """None when the kernels are ready (building them now if needed), else why they cannot run here."""
    return load()[1]


def library() -> ctypes.CDLL:
    """The loaded library; a RuntimeError saying why when it is not available."""
    lib, why = load()
    if lib is None:
        raise RuntimeError(f"the C kernels are not available: {why}")
    return lib


def check_usable(device, dtype: torch.dtype, name: str, value: str = "cpu") -> None:
    """Raise a ValueError naming the option ``name`` (set to ``value``) unless the kernels can run on
    ``device`` in ``dtype``: the CPU, float32, and a library that built."""
    if torch.device(device).type != "cpu" or dtype != DTYPE:
        raise ValueError(f"{name}={value!r} runs on the CPU in {DTYPE}, got {dtype} on {device}")
    if (why := unavailable_reason()) is not None:
        raise ValueError(f"{name}={value!r} is not available here: {why}")
