"""The H200 anchor measurements the course cites (see README.md in this folder)."""

from __future__ import annotations

import json
from pathlib import Path

ANCHOR_DIR = Path(__file__).parent


def load(name: str) -> list[dict]:
    """The records of one anchor file, e.g. ``load("hf_anchor_h200")``."""
    return json.loads((ANCHOR_DIR / f"{name}.json").read_text())


def record(name: str, key: str) -> dict:
    """The record called ``key`` in anchor file ``name``, e.g. ``record("hf_anchor_h200", "copy_bandwidth")``."""
    return next(r for r in load(name) if r.get("name") == key)
