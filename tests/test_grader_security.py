"""A learner's code must not be able to forge its marks, nor hang the grader.

Each test grades a small fake submission of chapter 4 (``pack``, ``unpack``, ``ragged_attention``:
fast pure functions) with the real grading tests, as ``minillm grade --impl FOLDER`` does. The
forgers record what they reached in a file, so a test can tell "the attack was stopped" from "the
attack never ran". They attack only processes from their own up to the orchestrator (this test's
process), and only the pipes there that a results channel would use, so the rest of the machine
never sees their writes.
"""

import errno
import os
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from minillm.course import grade
from minillm.course.grading import read_tail
from minillm.course.paths import REPO_ROOT
from minillm.course.results import OUTPUT_LIMIT
from minillm.course.sandbox import ANSWERS_REFUSED, LOG_LIMIT, LearnerError, LearnerProcess

SOLUTION = REPO_ROOT / "solutions" / "ch04_selective.py"
# The chapter's grading tests, read from their file: another engineer may add some at any time.
CH04_TESTS = re.findall(
    r"^def (test_\w+)", (REPO_ROOT / "tests" / "grading" / "test_ch04_selective.py").read_text(), re.M
)
PACKING_TESTS = {t for t in CH04_TESTS if "ragged" not in t}  # the tests that call only pack and unpack

# Shared by the forgers (which get ORCHESTRATOR, RECORD and TESTS as constants): the processes from
# the learner's up to the orchestrator, and their pipes.
PROC_TOOLS = '''\
import json, os

def lineage(orchestrator):
    """This process's ancestors, up to and including the orchestrator."""
    pid, found = os.getpid(), []
    while pid not in (0, 1, orchestrator):
        pid = int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
        found.append(pid)
    return found if pid == orchestrator else []

def pipes(pid, record):
    """(fd, flags) of every pipe ``pid`` holds; a PermissionError is recorded (the process is hidden)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        record.append(f"{pid}: fd listing refused")
        return []
    found = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                flags = int(open(f"/proc/{pid}/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
                found.append((int(fd), flags))
        except OSError:
            pass
    return found
'''

FORGER = """
import sys
import torch
import minillm.attention.causal
import minillm.course.pytest_plugin as plugin

record = []

# 1. patch the grader's plugin (this is a copy in this process: the grader's is out of reach)
plugin._status = lambda report: "passed"
plugin._send = lambda event: None
# 2. patch what the tests compare with
torch.equal = lambda a, b: True
torch.allclose = lambda *a, **k: True
minillm.attention.causal.causal_attention = lambda q, k, v, *a, **kw: torch.zeros_like(q)
# 3. write forged results wherever a results channel might be
record += [f"env: {k}" for k in os.environ if k.startswith("MINILLM_GRADE")]
lines = [{"seq": 0, "event": "collected", "tests": [{"nodeid": t, "hints": [], "points": 100} for t in TESTS]}]
lines += [{"seq": 1 + 3 * i + j, "event": "phase", "nodeid": t, "when": when, "status": "passed", "message": "",
           "duration": 0.0, "output": ""}
          for i, t in enumerate(TESTS) for j, when in enumerate(("setup", "call", "teardown"))]
lines.append({"seq": 1 + 3 * len(TESTS), "event": "end"})
forged = [f"{'0' * 64} {json.dumps(line)}\\n".encode() for line in lines]
for pid in lineage(ORCHESTRATOR):
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read()
        record.append(f"{pid}: environ " + ("has the channel" if b"MINILLM_GRADE_CHANNEL" in environ else "read"))
    except OSError:
        record.append(f"{pid}: environ refused")
    for fd, flags in pipes(pid, record):
        # a channel's reading end, as the orchestrator holds it
        if flags & 3 != os.O_RDONLY or not flags & os.O_NONBLOCK:
            continue
        try:
            w = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        for line in forged:  # one write per line: a write of at most 4096 bytes never splits another's line
            try:
                os.write(w, line)
            except BlockingIOError:
                pass
        os.close(w)
        record.append(f"{pid}:{fd} written{' (orchestrator)' if pid == ORCHESTRATOR else ''}")
open(RECORD, "w").write("\\n".join(record))


class AlwaysEqual:
    def __eq__(self, other):
        return True

    __hash__ = None


class LyingTensor(torch.Tensor):
    def __eq__(self, other):
        return True


def pack(seqs):
    return AlwaysEqual(), AlwaysEqual()


def unpack(flat, cu_seqlens):
    return [AlwaysEqual() for _ in range(len(cu_seqlens) - 1)]


def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k):
    return torch.zeros_like(q).as_subclass(LyingTensor)
"""

THIEF = '''
import select
import threading


def steal():
    """Read the orchestrator's results pipe away, hoping to remove the lines of failed tests."""
    targets = [os.open(f"/proc/{ORCHESTRATOR}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
               for fd, flags in pipes(ORCHESTRATOR, []) if flags & 3 == os.O_RDONLY and flags & os.O_NONBLOCK]
    stolen = 0
    while True:
        with open(RECORD + ".new", "w") as f:  # then renamed: whenever this process is killed, the record is whole
            f.write(f"{len(targets)} {stolen}")
        os.replace(RECORD + ".new", RECORD)
        for fd in select.select(targets, [], [], 1.0)[0]:  # wakes as soon as the orchestrator would
            try:
                stolen += os.read(fd, 1 << 16).count(b"\\n")
            except BlockingIOError:
                pass


threading.Thread(target=steal, daemon=True).start()
'''

HANG = """
def spin():
    while True:
        try:
            while True:
                pass
        except:  # noqa: E722 (the learner's)
            pass


def pack(seqs):
    spin()


def unpack(flat, cu_seqlens):
    spin()


def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k):
    spin()
"""


def submission(folder: Path, source: str, **constants) -> Path:
    """A folder holding ``ch04_selective.py``: ``constants`` (e.g. ``RECORD="..."``), then ``source``."""
    folder.mkdir(parents=True)
    header = "".join(f"{name} = {value!r}\n" for name, value in constants.items())
    (folder / "ch04_selective.py").write_text(header + source)
    return folder


def test_forged_results_and_forged_comparisons_earn_nothing(tmp_path):
    record = tmp_path / "reached.txt"
    nodeids = [f"tests/grading/test_ch04_selective.py::{t}" for t in CH04_TESTS]
    code = submission(
        tmp_path / "mallory", PROC_TOOLS + FORGER, ORCHESTRATOR=os.getpid(), RECORD=str(record), TESTS=nodeids
    )
    report = grade(["ch04"], impl=str(code), timeout=20)
    (run,) = report.runs
    reached = record.read_text().splitlines()
    assert not [r for r in reached if r.startswith("env:")], reached  # no MINILLM_GRADE* variable reached the learner
    assert any("(orchestrator)" in r for r in reached), f"the forger never reached the results pipe: {reached}"
    assert f"{os.getpid()}: environ read" in reached  # the orchestrator's environment never names the channel
    assert [r.status for r in run.results] == ["failed"] * len(CH04_TESTS), report.table()
    assert report.points == 0 and report.max_points == len(CH04_TESTS) and report.total == len(CH04_TESTS)
    assert any(p.endswith("forged result lines rejected") for p in run.problems), run.problems
    assert not any("went missing" in p for p in run.problems)  # rejected by the results, not by tamper detection
    assert "unsupported type" in run.results[0].message or "AlwaysEqual" in run.results[0].message
    grader = [r for r in reached if not r.startswith(str(os.getpid()))]
    if os.geteuid() != 0:  # the grader hides its /proc entries from its own user; root sees through that
        assert grader and all("refused" in r for r in grader), reached


@pytest.mark.skipif(not SOLUTION.is_file(), reason="a student copy of the course (make-release) has no solutions/")
def test_reading_results_away_never_removes_a_failure(tmp_path):
    """A thief that reads the results pipe can only make lines disappear: the numbered lines show the
    gap, and then no test of the chapter counts. Without a theft, only the honest passes count."""
    record = tmp_path / "stolen.txt"
    honest = SOLUTION.read_text().split("def ragged_attention")[0]  # pack and unpack right, ragged_attention missing
    honest = honest.replace("from __future__ import annotations", "")  # the constants come first
    code = submission(tmp_path / "eve", honest + PROC_TOOLS + THIEF, ORCHESTRATOR=os.getpid(), RECORD=str(record))
    report = grade(["ch04"], impl=str(code), timeout=20)
    (run,) = report.runs
    passed = {r.test for r in run.results if r.passed}
    assert passed <= PACKING_TESTS, report.table()
    targets, stolen = map(int, record.read_text().split())
    assert targets >= 1, "the thief never found the results pipe"
    if stolen:
        assert report.points == 0 and any("went missing" in p for p in run.problems), (stolen, report.table())
    else:
        assert passed == PACKING_TESTS and report.total == len(CH04_TESTS)


def test_a_bare_except_endless_loop_ends_with_a_table_within_the_limits(tmp_path):
    code = submission(tmp_path / "sisyphus", HANG)
    start = time.monotonic()
    # 20 s for the chapter: on a slow 2-core machine with the other xdist worker busy, the grader's
    # and the learner's processes took most of 10 s to start, before the first test's 1 s could run out
    report = grade(["ch04"], impl=str(code), timeout=1, chapter_timeout=20)
    assert time.monotonic() - start < 35
    assert [r.status for r in report.results] == ["timeout"] * len(CH04_TESTS), report.table()
    assert "ran for more than 1 s" in report.results[0].message
    assert "time limit (20 s)" in report.table() and report.points == 0
    assert not [p for p in learner_processes() if str(code) in p], "a learner process outlived its grader"


def test_a_submission_that_imports_the_answers_earns_nothing(tmp_path):
    """Graded in the instructors' checkout, where ``solutions/`` sits beside the grading tests."""
    code = submission(tmp_path / "copycat", "from solutions.ch04_selective import *  # noqa: F403\n")
    report = grade(["ch04"], impl=str(code), timeout=20)
    assert report.points == 0 and report.total == len(CH04_TESTS), report.table()
    assert all(ANSWERS_REFUSED in r.message for r in report.results), report.table()


SANDBOXED = f'''
import os, struct, sys, time

REPLY_FD = int(sys.argv[2])  # the pipe the sandbox sends its replies through


def claim_a_huge_result():
    os.write(REPLY_FD, struct.pack("!Q", 1 << 40))
    time.sleep(60)


def close_the_pipe_and_linger():
    os.close(REPLY_FD)
    time.sleep(60)


def print_too_much():
    """Print twice the limit; return how much was written, and the error that stopped it."""
    written = 0
    try:
        while written < 2 * {LOG_LIMIT}:
            written += os.write(1, b"x" * 65536)
    except OSError as err:
        return written, err.errno
    return written, None


def greet():
    print("hello")
    return 1
'''


def run_function(module, name):
    """A probe: runs in the learner's process."""
    return getattr(module, name)()


@pytest.fixture
def sandboxed(tmp_path):
    (tmp_path / "ch99_sandboxed.py").write_text(SANDBOXED)
    with LearnerProcess("ch99_sandboxed", impl=str(tmp_path)) as learner:
        yield learner


def test_a_result_claiming_a_huge_length_is_refused_unread(sandboxed):
    start = time.monotonic()
    with pytest.raises(LearnerError, match="your result is too large"):
        sandboxed.call(run_function, "claim_a_huge_result", timeout=30)
    assert time.monotonic() - start < 10
    assert sandboxed.call(run_function, "greet") == 1  # in a fresh process


def test_a_learner_that_closes_its_pipe_and_keeps_running_is_stopped(sandboxed):
    start = time.monotonic()
    with pytest.raises(LearnerError, match="closed its pipe to the grader during the call and was stopped"):
        sandboxed.call(run_function, "close_the_pipe_and_linger", timeout=60)
    assert time.monotonic() - start < 10


def test_a_call_prints_at_most_the_log_limit_and_the_next_call_prints_again(sandboxed):
    assert sandboxed.call(run_function, "print_too_much") == (LOG_LIMIT, errno.EFBIG)
    assert sandboxed.output == "[...] " + "x" * OUTPUT_LIMIT
    assert sandboxed.call(run_function, "greet") == 1 and sandboxed.output.endswith("hello\n")


def test_only_the_end_of_a_huge_output_is_read(tmp_path):
    with open(tmp_path / "log", "w+b") as log:
        log.truncate(1 << 30)  # a gigabyte printed (a sparse file: no disk used)
        log.seek(0, os.SEEK_END)
        log.write(b"the end")
        tracemalloc.start()
        text = read_tail(log, OUTPUT_LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert text.startswith("[...] ") and text.endswith("the end") and len(text) == len("[...] ") + OUTPUT_LIMIT
    assert peak < 1 << 20


def learner_processes() -> list[str]:
    """The command lines of running (not zombie) sandbox processes."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if "minillm.course.sandbox" in cmd and state != "Z":
            found.append(cmd)
    return found


@pytest.fixture(autouse=True)
def _linux_only():
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("the forgers look for the results channel through Linux's /proc")
