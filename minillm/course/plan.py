"""Each chapter's model and dtype on this machine: one rule for every chapter.

``chapter_plan("06")`` returns a ``ChapterPlan``; a chapter's first cell prints its ``line()``, so
the learner reads which model runs and why. The rule, in order:

1. ``$MINILLM_MODEL`` (or an ``override``) wins, on any device.
2. Small mode (``MINILLM_SMALL=1``, the automated runs, on a CPU or a GPU) runs ``"tiny"``.
3. On a CUDA GPU, ``choose_model``'s pick for a GPU (the GPU suggestion, else SmolLM2, else
   ``"tiny"``): a real model, because a GPU's step at the tiny model's size is launch overhead alone.
4. On a CPU, ``choose_model``'s pick (SmolLM2) where the chapter's runs take minutes with it, and
   ``"tiny"`` where they would take many more (``CPU_MODELS`` says which chapter and why).

A chapter in ``CPU_ON_EVERY_DEVICE`` plans for the CPU even where a GPU is present (the rules above
then run as on a CPU), and says why.

The dtype is what ``LLM`` picks for the device (``resolve_dtype``): float32 on a CPU, bfloat16 on a
GPU of compute capability 8.0 or more, float16 below (Colab's T4 is 7.5). ``Device`` describes the
machine, so a test can plan for a GPU it does not have.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from minillm.course.model_choice import MODEL_ENV, choose_model, display_name, is_small
from minillm.models.loader import TINY

CHOSEN = "chosen"  # CPU_MODELS' word for choose_model's pick

# Which model each chapter runs on a CPU in full mode, and why: SmolLM2 where the chapter's timed runs
# take minutes with it, the tiny model where they would take far longer (its timings are real; only its
# text is noise).
CPU_MODELS = {
    "00": (CHOSEN, "a first generation and a load: seconds with SmolLM2"),
    "01": (CHOSEN, "single forward passes, timed a few times: a minute with SmolLM2"),
    "02": (CHOSEN, "one batched step per size, timed a few times: minutes with SmolLM2"),
    "03": (TINY, "its engines run hundreds of steps, each engine several times: long minutes with SmolLM2"),
    "04": (TINY, "its engines run hundreds of steps, each engine several times: long minutes with SmolLM2"),
    "05": (TINY, "the paged engine runs again and again (roomy pool, tight pool, recompute, swap), timed in repeats"),
    "05b": (TINY, "Triton's interpreter runs the kernels, one Python call per program: minutes a layer with SmolLM2"),
    "06": (TINY, "the budget sweep times every budget in interleaved repeats: many minutes with SmolLM2"),
    "07": (TINY, "every workload is timed with the cache off and on, in repeats: many minutes with SmolLM2"),
    "08": (TINY, "its server streams a burst of requests through a 32-token budget: seconds with the tiny model"),
    "08b": (TINY, "each server's policy runs the same requests on a tight pool: seconds with the tiny model"),
    "09": (TINY, "decode steps timed at batches up to 64 in repeats; `minillm bench` times SmolLM2 on its own"),
    "10": (TINY, "its processes split a model in two (2 does not divide SmolLM2's 9 heads); the rest is simulated"),
}

# Chapters whose measured runs stay on the CPU where a GPU is present too, and why (their GPU figures
# are simulated).
CPU_ON_EVERY_DEVICE = {
    "10": "its processes meet in gloo all-reduces, and minillm's tensor parallelism has no CUDA path yet",
}


@dataclass(frozen=True)
class Device:
    """What the plan needs to know about the machine."""

    kind: str  # "cuda" or "cpu"
    name: str
    capability: tuple[int, int] | None = None  # a GPU's compute capability

    @classmethod
    def here(cls) -> Device:
        import torch

        if torch.cuda.is_available():
            return cls("cuda", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
        return cls("cpu", "CPU")

    @property
    def dtype(self) -> str:
        """``LLM``'s default dtype here (``minillm.llm.resolve_dtype``)."""
        if self.kind != "cuda":
            return "float32"
        return "bfloat16" if self.capability and self.capability >= (8, 0) else "float16"


@dataclass(frozen=True)
class ChapterPlan:
    chapter: str
    model: str
    why: str
    device: Device

    @property
    def dtype(self) -> str:
        return self.device.dtype

    def line(self) -> str:
        """The one line a chapter prints about its model."""
        where = f"GPU ({self.device.name})" if self.device.kind == "cuda" else "CPU"
        return f"chapter {self.chapter} runs {display_name(self.model)} on this {where} in {self.dtype}: {self.why}"


def chapter_plan(
    chapter: str, device: Device | None = None, override: str | None = None, download: bool = True, log=print
) -> ChapterPlan:
    """The plan of ``chapter`` (``"00"`` .. ``"10"``, ``"05b"``, ``"08b"``) here; see the module docstring."""
    if chapter not in CPU_MODELS:
        raise ValueError(f"chapter must be one of {', '.join(CPU_MODELS)}, got {chapter!r}")
    device = device or Device.here()
    if chapter in CPU_ON_EVERY_DEVICE and device.kind != "cpu":
        plan = chapter_plan(chapter, Device("cpu", "CPU"), override, download, log)
        return ChapterPlan(
            chapter,
            plan.model,
            f"{plan.why}; on the CPU beside this {device.name}: {CPU_ON_EVERY_DEVICE[chapter]}",
            plan.device,
        )
    if override or os.environ.get(MODEL_ENV) or is_small():
        model, why = choose_model(override, download=download, log=log)
        return ChapterPlan(chapter, model, why, device)
    if device.kind == "cuda":
        model, why = choose_model(on_gpu=True, download=download, log=log)
        return ChapterPlan(chapter, model, f"a GPU runs a real model ({why})", device)
    model, why = CPU_MODELS[chapter]
    if model == CHOSEN:
        model, chosen_why = choose_model(on_gpu=False, download=download, log=log)
        why = f"{why} ({chosen_why})"
    else:
        why = f"the tiny model on a CPU: {why}"
    return ChapterPlan(chapter, model, why, device)
