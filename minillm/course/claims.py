"""Comparisons a notebook states, recorded as they are measured.

A chapter teaches by comparison ("continuous batching cuts the median TTFT"), but a busy laptop can
turn any measured comparison around. So a notebook never writes such a sentence by hand: it asks
``expect`` whether the comparison came out as the chapter predicts, writes its prose from the
answer, and the answer is recorded. The notebook test (``tests/test_notebooks.py``) runs every
notebook with a busy core beside it and then reads ``recorded()``: a prediction that failed under
load means the measurement is not robust enough to teach from.

    faster = expect("continuous TTFT p50 < static TTFT p50", c_ttft < s_ttft,
                    f"static {s_ttft:.0f} ms, continuous {c_ttft:.0f} ms")
    text = "no longer waits" if faster else "this run was too noisy to show it"
"""

from __future__ import annotations

import json

_RECORD: list[dict] = []


def expect(claim: str, holds: bool, measured: str = "") -> bool:
    """Record whether the chapter's prediction ``claim`` held in this run (``measured``: the numbers
    it was decided on) and return ``holds``, so the prose can follow the outcome."""
    holds = bool(holds)
    _RECORD.append({"claim": claim, "holds": holds, "measured": measured})
    return holds


def recorded() -> list[dict]:
    """Every ``expect`` of this kernel so far, in order (a copy)."""
    return [dict(r) for r in _RECORD]


def dump() -> None:
    """Print the record as one JSON line (how the notebook test reads it out of a kernel)."""
    print("MINILLM_CLAIMS " + json.dumps(recorded()))
