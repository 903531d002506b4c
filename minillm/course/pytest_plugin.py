"""The pytest plugin of a grader process: it sends one signed line per test event to the orchestrator.

``minillm grade`` runs pytest with ``-p minillm.course.pytest_plugin``; importing this module reads
the channel's secret (``minillm.course.channel``) before any test file is imported. Lines go out as
tests finish, not at the end, so a run that dies half way still reports every test it reached, and
the collected-but-unfinished tests show where it stopped. The grader never imports learner code:
grading tests run it through ``minillm.course.sandbox``.
"""

from __future__ import annotations

import sys

import pytest

from minillm.course.channel import Sender
from minillm.course.results import OUTPUT_LIMIT

TIMEOUT_PREFIX = "Timeout (>"  # how pytest-timeout's failure message starts

_channel = Sender.from_env()


def pytest_configure(config):
    # Also registered in pyproject.toml; repeated here for test folders outside this repository.
    config.addinivalue_line(
        "markers", "hint(*rungs): what the grader says when this grading test fails: the mistake first, the idea last"
    )
    config.addinivalue_line("markers", "points(n): what a grading test is worth when it passes (default 1)")


def pytest_collectreport(report):
    if report.failed:  # e.g. a syntax error in a test file: no test of it can run
        errors = [line[1:].strip() for line in str(report.longrepr).splitlines() if line.startswith("E ")]
        _send(
            {
                "event": "collect_error",
                "nodeid": report.nodeid,
                "message": _first_line(errors[-1] if errors else str(report.longrepr)),
            }
        )


def pytest_collection_finish(session):
    _send(
        {
            "event": "collected",
            "tests": [
                {"nodeid": item.nodeid, "hints": _hints(item), "points": _points(item)} for item in session.items
            ],
        }
    )


def pytest_runtest_logreport(report):
    output = report.capstdout + report.capstderr
    _send(
        {
            "event": "phase",
            "nodeid": report.nodeid,
            "when": report.when,
            "status": _status(report),
            "message": _message(report),
            "duration": report.duration,
            "output": output[-OUTPUT_LIMIT:],
        }
    )


def pytest_sessionfinish(session):
    """The last line: the orchestrator takes a run that ended without it as one whose last lines
    were read away (the numbering shows only gaps before the last line received)."""
    _send({"event": "end"})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep the exception's type on the report: the status tells a timeout from a failure."""
    report = yield
    report.minillm_error = call.excinfo
    return report


def _status(report) -> str:
    if report.skipped:
        return "skipped"
    if report.passed:
        return "passed"
    exc = getattr(report, "minillm_error", None)
    if exc is not None and exc.errisinstance(NotImplementedError):
        return "not_implemented"
    if exc is not None and _is_delegation(exc):
        return "delegated"
    if exc is not None and (
        _is_learner_timeout(exc)
        or (exc.errisinstance(pytest.fail.Exception) and str(exc.value).startswith(TIMEOUT_PREFIX))
    ):
        return "timeout"
    return "failed"


def _is_delegation(exc) -> bool:
    sandbox = sys.modules.get("minillm.course.sandbox")
    return sandbox is not None and exc.errisinstance(sandbox.Delegated)


def _is_learner_timeout(exc) -> bool:
    """Did the sandbox stop the learner's code? Looked up, not imported: a run without the sandbox
    need not import torch."""
    sandbox = sys.modules.get("minillm.course.sandbox")
    return sandbox is not None and exc.errisinstance(sandbox.LearnerTimeout)


def _message(report) -> str:
    exc = getattr(report, "minillm_error", None)
    if exc is None:
        return ""
    error = exc.value
    if report.skipped:
        return str(getattr(error, "msg", error))
    text = str(error)  # for a SyntaxError this names the file and line; for an assert, pytest's explanation
    return _first_line(f"{type(error).__name__}: {text}" if text else type(error).__name__)


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _hints(item) -> list[str]:
    """The test's hint ladder: its ``hint`` marker's rungs (the first names the mistake the test
    catches), then the idea its file's ``IDEAS`` gives it: the longest key in the test's name, else
    the ``"*"`` one."""
    marker = item.get_closest_marker("hint")
    rungs = list(marker.args) if marker else []
    ideas = getattr(getattr(item, "module", None), "IDEAS", {})
    keys = sorted((k for k in ideas if k != "*" and k in item.name), key=len)
    idea = ideas[keys[-1]] if keys else ideas.get("*")
    return rungs + [idea] if idea else rungs


def _points(item) -> float:
    marker = item.get_closest_marker("points")
    return float(marker.args[0]) if marker and marker.args else 1.0


def _send(event: dict) -> None:
    if _channel is not None:
        _channel.send(event)
