"""The results channel from a grader process to the orchestrator that started it.

Results must not travel through anything a learner's code can write to undetected: a file named in
the environment, or a pipe it finds through ``/proc``. So the orchestrator makes a random secret and
hands it to the grader through a pipe of its own, which the grader reads once, when its pytest plugin
is imported (before any test runs), and closes. The grader then writes one line per event to a
second pipe, each line carrying a sequence number and an HMAC of its content under that secret::

    <hmac hex> {"seq": 0, "event": "collected", ...}

The orchestrator keeps only lines whose HMAC is right and counts the rest as forged. A numbered line
that never arrives (a process read it away) shows up as a gap in the sequence.
Both pipes are passed by file descriptor number, in ``MINILLM_GRADE_CHANNEL``, not on stdin: pytest's
output capture replaces fd 0.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import secrets
import sys

CHANNEL_ENV = "MINILLM_GRADE_CHANNEL"
MAX_LINE = 1 << 20  # a longer "line" is not ours: drop it rather than hold it in memory


def sign(secret: bytes, payload: str) -> str:
    return hmac.new(secret, payload.encode(), hashlib.sha256).hexdigest()


class Receiver:
    """The orchestrator's end: creates both pipes, then checks and decodes the grader's lines."""

    def __init__(self):
        self.secret = secrets.token_bytes(32)
        secret_r, secret_w = os.pipe()
        os.write(secret_w, self.secret)  # 32 bytes fit in any pipe buffer: no need to wait for the reader
        os.close(secret_w)
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        self.child_fds = (secret_r, self._write_fd)
        self.env = {CHANNEL_ENV: f"{secret_r},{self._write_fd}"}
        self.events: list[dict] = []
        self.forged = 0
        self._buffer = b""
        self._seen: set[int] = set()

    def child_started(self) -> None:
        """Close the grader's ends here, so the results pipe reports end-of-file when the grader exits."""
        for fd in self.child_fds:
            os.close(fd)

    def read_available(self) -> bool:
        """Read what the pipe holds now; False once every writer has closed it."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        lines = (self._buffer + data).split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > MAX_LINE:
            self._buffer, self.forged = b"", self.forged + 1
        for line in lines:
            self._accept(line)

    def _accept(self, line: bytes) -> None:
        mac, _, payload = line.decode("utf-8", "replace").partition(" ")
        try:
            ok = hmac.compare_digest(mac, sign(self.secret, payload))
            event = json.loads(payload) if ok else None
        except (ValueError, TypeError):  # not ASCII hex, or not JSON
            ok = False
        if not ok or not isinstance(event, dict) or event.get("seq") in self._seen:
            self.forged += 1  # a replayed line counts as forged too
            return
        self._seen.add(event["seq"])
        self.events.append(event)

    def missing(self) -> int:
        """How many numbered lines before the last one received never arrived."""
        return max(self._seen) + 1 - len(self._seen) if self._seen else 0

    def close(self) -> None:
        os.close(self.fd)


class Sender:
    """The grader's end: reads the secret once, then writes signed, numbered lines."""

    def __init__(self, secret: bytes, fd: int):
        self._secret, self._fd, self._seq = secret, fd, 0

    @classmethod
    def from_env(cls) -> Sender | None:
        """The channel named in the environment, or None when pytest was not started by the grader."""
        value = os.environ.pop(CHANNEL_ENV, None)  # gone from the environment of anything started later
        if not value:
            return None
        secret_fd, results_fd = map(int, value.split(","))
        secret = b""
        while chunk := os.read(secret_fd, 64):
            secret += chunk
        os.close(secret_fd)
        os.set_inheritable(results_fd, False)
        hide_process()
        return cls(secret, results_fd)

    def send(self, event: dict) -> None:
        payload = json.dumps({"seq": self._seq, **event}, ensure_ascii=True)
        self._seq += 1
        data = f"{sign(self._secret, payload)} {payload}\n".encode()
        while data:
            data = data[os.write(self._fd, data) :]


def hide_process() -> None:
    """Make this process non-dumpable (Linux): other processes of the same user, such as the learner's,
    can then no longer open its ``/proc/<pid>/fd``, ``environ`` or ``mem``. A defence in depth: the
    HMAC already rejects lines written by anyone who lacks the secret."""
    if sys.platform.startswith("linux"):
        PR_SET_DUMPABLE = 4
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass
