"""The grading tests build their engines on the CPU in float32, so a learner's marks do not depend on
the machine. ``LLM`` alone would pick CUDA where a GPU is present, and an engine built on the CPU
around a CUDA model fails at its first step: on an H200 (2026-12-04) that failure graded chapter 5's
engine checks wrong. So every ``LLM(...)`` in ``tests/grading`` names ``device="cpu"``. Reads the
sources only."""

from __future__ import annotations

import ast
from pathlib import Path

GRADING = Path(__file__).resolve().parent / "grading"


def llm_calls(path: Path) -> dict[int, bool]:
    """Each ``LLM(...)`` call in ``path``, by line: whether it passes ``device="cpu"``."""
    calls = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LLM":
            device = next((k.value for k in node.keywords if k.arg == "device"), None)
            calls[node.lineno] = isinstance(device, ast.Constant) and device.value == "cpu"
    return calls


def test_every_grading_llm_runs_on_the_cpu():
    found = {p.name: llm_calls(p) for p in sorted(GRADING.glob("test_*.py"))}
    assert sum(len(calls) for calls in found.values()) >= 7  # one per engine-building chapter, at least
    bad = {name: [line for line, cpu in calls.items() if not cpu] for name, calls in found.items()}
    bad = {name: lines for name, lines in bad.items() if lines}
    assert not bad, f"LLM(...) without device='cpu' (on a GPU machine it would build a CUDA model): {bad}"


def test_the_check_tells_a_call_without_a_device(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text('m = LLM("tiny", dtype="float32").model\nn = LLM("tiny", device="cpu")\n')
    assert llm_calls(probe) == {1: False, 2: True}
