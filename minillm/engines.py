"""The engine registry: each engine name is a (scheduler, runner) pair run by the one engine loop."""

from __future__ import annotations

from minillm.engine import Engine
from minillm.runner import ModelRunner
from minillm.scheduler import NaiveScheduler

# name -> the chapter that builds it
ENGINE_CHAPTERS = {
    "naive": 1,
    "static": 2,
    "continuous": 3,
    "selective": 4,
    "paged": 5,
    "chunked": 6,
}


def _naive(model, device, eos_token_id, **options):
    _no_options("naive", options)
    return Engine(NaiveScheduler(), ModelRunner(model, device), eos_token_id)


BUILDERS = {"naive": _naive}


def _no_options(engine: str, options: dict) -> None:
    if options:
        raise ValueError(f"engine {engine!r} takes no engine options, got {sorted(options)}")


def check_engine_name(name: str) -> None:
    """Unknown names are a ValueError; known names that a later chapter builds are not ready yet."""
    if name not in ENGINE_CHAPTERS:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_CHAPTERS)}")
    if name not in BUILDERS:
        raise NotImplementedError(f"engine {name!r} is built in chapter {ENGINE_CHAPTERS[name]} and is not available yet")


def build_engine(name: str, model, device, eos_token_id, **options) -> Engine:
    check_engine_name(name)
    return BUILDERS[name](model, device, eos_token_id, **options)
