"""Run a learner's code in a process of its own, and get back only plain data.

The grading tests must not run learner code in the process that decides and records the marks:
there, a learner's module could patch the grader, patch the functions the tests compare with, or
return an object that claims to equal anything. So a grading test asks a ``LearnerProcess`` to run
a *probe* — a small module-level function of the test file that calls the learner's code — in a
child process, and receives the probe's result as plain data: ``None``, bools, ints, floats,
strings, lists, tuples, dicts and tensors, serialised with ``torch.save`` and read back with
``weights_only=True`` (which refuses any other type). Every comparison then happens in the test.

    def run_pack(ch04, seqs):                      # runs in the child; ch04 is the learner's module
        return ch04.pack(seqs)

    with LearnerProcess("ch04_selective") as learner:
        flat, cu_seqlens = learner.call(run_pack, seqs)   # plain data, compared here

The child starts in a new session (so killing it kills whatever it started), in an empty
temporary folder, sees no ``MINILLM_GRADE*`` variable, inherits none of the grader's other file
descriptors, and is killed when a call runs past its time limit (``MINILLM_GRADE_TIMEOUT`` seconds,
else ``UNGRADED_TIMEOUT``). Unless it grades the reference answers themselves, it refuses to import
the ``solutions`` package, so a submission graded in the instructors' checkout cannot hand them in
as its own. What the learner's code prints reaches the grader's stdout, at most ``OUTPUT_LIMIT``
characters per call; the grader reads no more than the end of it, and a call may print at most
``LOG_LIMIT`` bytes. A reply longer than ``MAX_RESULT_BYTES`` is refused before it is read.
"""

from __future__ import annotations

import importlib
import importlib.abc
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from minillm.course.delegation import NOT_YOURS, WHOLE_MODULE, find_delegations, names_used
from minillm.course.grading import default_impl, impl_folder, read_tail
from minillm.course.paths import REPO_ROOT
from minillm.course.results import OUTPUT_LIMIT
from minillm.course.runtime_check import Guard, check_definitions, tasks_of

TIMEOUT_ENV = "MINILLM_GRADE_TIMEOUT"
UNGRADED_TIMEOUT = 60.0  # per call when no grader set TIMEOUT_ENV (plain pytest): generous, for a loaded machine
STARTUP_TIMEOUT = 60.0  # importing torch and the learner's module, before any call
DEATH_GRACE = 1.0  # seconds a child that closed its reply pipe gets to exit on its own before it is killed
MAX_RESULT_BYTES = 64 << 20  # the reply's length comes from the learner's process: never buffer more
LOG_LIMIT = 16 << 20  # bytes one call may print: past it, a write fails (EFBIG) instead of filling the disk
ANSWERS_REFUSED = "the reference answers are not importable while your code is graded"
_HEADER = struct.Struct("!Q")


class LearnerError(Exception):
    """The learner's code raised; the message names the exception and where it was raised."""


class Delegated(LearnerError):
    """The probe uses a function or class of the learner's that hands its task to minillm's own:
    seen in the file before the call (``minillm.course.delegation``), or in what ran during it
    (``minillm.course.runtime_check``)."""


class LearnerTimeout(Exception):
    """The learner's code ran past its time limit and its process was killed."""


def call_timeout() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or UNGRADED_TIMEOUT)


class LearnerProcess:
    """A child process that imports one exercise module and runs probes on it, one call at a time.

    A call that times out or crashes the child costs that call only: the next call starts a new
    child."""

    def __init__(self, module: str, impl: str | None = None, timeout: float | None = None):
        self.module = module
        self.impl = impl or default_impl()
        self.timeout = timeout
        self.output = ""  # what the learner's code printed during the last call (bounded)
        self._proc = None
        self._import_error = None  # (status, message) once importing the module failed: it will again
        self._delegations = None  # the learner module's, found on the first call
        self._ready = False  # the child has imported the learner's module and waits for calls

    def __enter__(self) -> LearnerProcess:
        # Start the child now: it imports torch and the learner's module (seconds) while the grader
        # computes the test's expected values, instead of after them, at the first call.
        self._spawn()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, probe, *args, timeout: float | None = None, **kwargs):
        """Run ``probe(learner_module, *args, **kwargs)`` in the child; return its result as plain data."""
        if self._import_error is not None:
            self._raise(*self._import_error)
        used = names_used(probe)
        self._refuse_delegation(used)
        if self._proc is None:
            self._spawn()
        if not self._ready:
            self._await_import()
        limit = timeout or self.timeout or call_timeout()
        where = (probe.__module__, sys.modules[probe.__module__].__file__, probe.__qualname__)
        self._send((*where, used, args, kwargs))
        reply = self._receive(
            limit,
            f"your code ran for more than {limit:g} s and was stopped "
            "(an endless loop, or a loop whose exit condition never becomes true?)",
        )
        self.output = self._read_output()
        if self.output:
            print(self.output)
        status, value = reply
        if status == "ok":
            return value
        self._raise(status, value)

    def _refuse_delegation(self, used: frozenset[str] | None) -> None:
        """Raise ``Delegated`` when a probe that uses ``used`` of the learner's module (None: all of
        it) reaches minillm's own answer. The module is read, not imported: this runs in the grader."""
        if self._delegations is None:
            path = impl_folder(self.impl) / f"{self.module}.py"
            try:
                source = path.read_text()
                self._delegations = find_delegations(source, self.module)
            except (OSError, SyntaxError, ValueError):  # the child reports a missing or broken file itself
                self._delegations = {}
        if not self._delegations:
            return
        for name, delegation in self._delegations.items():
            if name == WHOLE_MODULE or used is None or name in used:
                raise Delegated(delegation.message(self.module))

    @staticmethod
    def _raise(status: str, message: str):
        errors = {"not_implemented": NotImplementedError, "delegated": Delegated}
        raise errors.get(status, LearnerError)(message)

    def close(self) -> None:
        if self._proc is not None:
            self._kill()

    # --- the child's life ------------------------------------------------------------------------
    def _spawn(self) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self._log = tempfile.TemporaryFile()
        # Not the course's folder, nor on its path: there, `import solutions` would find the answers.
        self._workdir = tempfile.TemporaryDirectory(prefix="minillm-learner-", ignore_cleanup_errors=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINILLM_GRADE")}
        env.setdefault("OMP_NUM_THREADS", "1")
        # Grading runs Triton kernels (chapter 5) on CPU tensors, in Triton's interpreter: it must be on
        # before the child imports triton, on any machine, GPU or not.
        env.setdefault("TRITON_INTERPRET", "1")
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "minillm.course.sandbox",
                str(to_child_r),
                str(from_child_w),
                self.module,
                self.impl,
                str(os.getpid()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(to_child_r, from_child_w),
            cwd=self._workdir.name,
            env=env,
            start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)

    def _await_import(self) -> None:
        """Wait for the child's first reply: the learner's module imported, or why it was not."""
        try:
            status, value = self._receive(
                STARTUP_TIMEOUT, f"importing your {self.module} took more than {STARTUP_TIMEOUT:g} s"
            )
        except (LearnerTimeout, LearnerError) as err:  # it would hang or crash again at every call
            self._import_error = ("error", str(err))
            raise
        if status != "ok":
            self.output = self._read_output()
            self._kill()
            self._import_error = (status, value)
            self._raise(status, value)
        self._ready = True

    def _send(self, message) -> None:
        data = pickle.dumps(message)
        try:
            os.write(self._to_child, _HEADER.pack(len(data)))
            _write_all(self._to_child, data)
        except BrokenPipeError:
            self._died("before the call")

    def _receive(self, limit: float, timeout_message: str):
        deadline = time.monotonic() + limit
        try:
            size = _HEADER.unpack(self._read_exactly(_HEADER.size, deadline))[0]
            if size > MAX_RESULT_BYTES:
                self.output = self._read_output()
                self._kill()
                raise LearnerError(
                    f"your result is too large for the grader ({size:,} bytes, at most {MAX_RESULT_BYTES:,}): "
                    "return only what the test asks for"
                )
            data = self._read_exactly(size, deadline)
        except TimeoutError:
            self.output = self._read_output()
            self._kill()
            raise LearnerTimeout(timeout_message) from None
        except EOFError:
            self._died("during the call")
        try:
            return torch.load(io.BytesIO(data), weights_only=True)  # plain data only: no learner objects
        except Exception as err:
            raise LearnerError(f"the result is not plain data the grader can read ({_first_line(str(err))})") from None

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(self._from_child, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _died(self, when: str):
        """The child closed its reply pipe. It normally exits with it; one that keeps running is
        killed after ``DEATH_GRACE`` seconds, never waited for."""
        try:
            code = self._proc.wait(DEATH_GRACE)
        except subprocess.TimeoutExpired:
            code = None
        self.output = self._read_output()
        self._kill()
        what = (
            f"exited {when} (exit code {code})"
            if code is not None
            else f"closed its pipe to the grader {when} and was stopped"
        )
        raise LearnerError(
            f"the process running your code {what}" + (f"; it printed: {self.output[-300:]}" if self.output else "")
        )

    def _read_output(self) -> str:
        """The end of what the child printed since the last call; then its log starts afresh (the
        child's stdout shares the log's offset, so it writes from the start again)."""
        text = read_tail(self._log, OUTPUT_LIMIT)
        self._log.truncate(0)
        self._log.seek(0)
        return text

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)  # the child and anything it started
        except ProcessLookupError:
            pass
        self._proc.wait()
        for fd in (self._to_child, self._from_child):
            os.close(fd)
        self._log.close()
        self._workdir.cleanup()
        self._proc = None
        self._ready = False


# --- plain data ----------------------------------------------------------------------------------
def plain(obj, depth: int = 0):
    """``obj`` as data the grader can read with ``weights_only=True``: tensors (detached, on the CPU),
    numbers, strings, and lists / tuples / dicts of them. A numpy array becomes a tensor and a numpy
    scalar a Python number, so an answer written with numpy reads like one written with torch.
    Anything else becomes ``{"unsupported type": name, "repr": ...}``,
    which no test accepts, so an object that claims to equal everything compares equal to nothing."""
    if depth > 50:
        return {"unsupported type": "nesting deeper than 50 levels", "repr": ""}
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().clone().contiguous()
        return t if type(t) is torch.Tensor else t.as_subclass(torch.Tensor)
    if type(obj).__module__ == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(obj)).clone()
        if isinstance(obj, np.generic):
            return obj.item()
    if type(obj) in (list, tuple):
        items = [plain(x, depth + 1) for x in obj]
        return items if type(obj) is list else tuple(items)
    if type(obj) is dict:
        return {str(k) if type(k) is not int else k: plain(v, depth + 1) for k, v in obj.items()}
    return {"unsupported type": f"{type(obj).__module__}.{type(obj).__qualname__}", "repr": _safe_repr(obj)}


def type_name(value) -> str:
    """What a plain value is, for a test's message: ``"list"``, ``"Tensor"``, or the learner's type."""
    if isinstance(value, dict) and "unsupported type" in value:
        return value["unsupported type"]
    return type(value).__name__


def _safe_repr(obj) -> str:
    try:
        return repr(obj)[:200]
    except Exception:
        return "<repr failed>"


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:300]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- the child -----------------------------------------------------------------------------------
def _reply(fd: int, status: str, value) -> None:
    buf = io.BytesIO()
    try:
        torch.save((status, value), buf)
    except Exception as err:  # e.g. a value plain() let through that torch.save cannot write
        buf = io.BytesIO()
        torch.save(("error", f"the result could not be sent to the grader: {_first_line(str(err))}"), buf)
    data = buf.getvalue()
    os.write(fd, _HEADER.pack(len(data)))
    _write_all(fd, data)


def _error_message(err: BaseException, module_file: str | None) -> str:
    """``TypeError: ... (exercises/ch04_selective.py, line 12)``: the learner's own frame, if any."""
    where = ""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if module_file and os.path.abspath(f.filename) == module_file]
    if mine:
        f = mine[-1]
        where = f" ({os.path.relpath(f.filename, REPO_ROOT)}, line {f.lineno}: {f.line})"
    text = _first_line(str(err))
    return f"{type(err).__name__}{': ' + text if text else ''}{where}"


def _limit_output() -> None:
    """At most ``LOG_LIMIT`` bytes in any file, the log that is this process's stdout included (the
    grader empties it after each call): past it a write fails with EFBIG, which the learner's code
    sees as an OSError, instead of killing this process or filling the disk. A hard limit: the
    learner's code cannot raise it."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (LOG_LIMIT, LOG_LIMIT))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except (ImportError, AttributeError, ValueError, OSError):  # not on this platform, or already lower
        pass


class _AnswersRefused(importlib.abc.MetaPathFinder):
    """Refuses the ``solutions`` package and its modules, whatever ``sys.path`` holds. A learner's
    code can still read those files by their path: grade a class from a copy without them."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "solutions":
            raise ModuleNotFoundError(ANSWERS_REFUSED, name=name)
        return None


def _grades_the_answers(impl: str) -> bool:
    """Is ``impl`` the reference answers themselves (plain pytest, ``--impl solutions``)?"""
    return impl == "solutions" or Path(impl).resolve() == (REPO_ROOT / "solutions").resolve()


def _die_with_parent(parent: int) -> None:
    """Linux: be killed when the grader dies (a grader stopped at a chapter's time limit must not
    leave a learner's endless loop running in its own session)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the grader died before the line above took effect
        os._exit(1)


def _child(read_fd: int, write_fd: int, module: str, impl: str) -> None:
    from minillm.course import load_impl

    if not _grades_the_answers(impl):
        sys.meta_path.insert(0, _AnswersRefused())
    try:
        learner = load_impl(module, impl)
    except BaseException as err:  # a syntax error or a crash at import: the grader reports it
        _reply(
            write_fd,
            "not_implemented" if isinstance(err, NotImplementedError) else "error",
            f"importing your {module} failed: {_error_message(err, None)}",
        )
        return
    module_file = os.path.abspath(learner.__file__)
    guard = Guard(module, _grades_the_answers(impl))
    _reply(write_fd, "ok", None)
    reader = os.fdopen(read_fd, "rb")
    while True:
        header = reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the grader closed the pipe: done
        message = pickle.loads(reader.read(_HEADER.unpack(header)[0]))
        probe_module, probe_file, probe_name, used, args, kwargs = message
        if probe_module not in sys.modules:  # pytest imports a test file by its folder on sys.path
            sys.path.insert(0, os.path.dirname(probe_file))
        probe = importlib.import_module(probe_module)
        for part in probe_name.split("."):
            probe = getattr(probe, part)
        tasks = tasks_of(module, used)
        refused = check_definitions(learner, tasks)
        if refused is not None:
            _reply(write_fd, *refused)
            continue
        try:
            with guard.probing(tasks, learner):
                result = probe(learner, *args, **kwargs)
            reply = ("ok", plain(result))
        except NotImplementedError as err:
            reply = ("not_implemented", _first_line(str(err)) or "not implemented yet")
        except BaseException as err:  # SystemExit and KeyboardInterrupt from learner code are its errors too
            reply = ("error", _error_message(err, module_file))
        if guard.found is not None:
            reply = ("delegated", f"{guard.found}: {NOT_YOURS}")
        _reply(write_fd, *reply)
        try:
            sys.stdout.flush()
        except OSError:  # past LOG_LIMIT: the rest of this call's output is lost
            pass


if __name__ == "__main__":
    _die_with_parent(int(sys.argv[5]))
    _limit_output()
    _child(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
