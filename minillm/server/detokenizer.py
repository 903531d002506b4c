"""Token ids in, text out, one token at a time -- and stop strings, which only text can see.

The engine stops a request on token ids (EOS, ``stop_token_ids``, ``max_tokens``). OpenAI's
``stop`` also takes *strings*, and a string may span several tokens or end in the middle of one,
so it is checked here, on the text, as vLLM's detokenizer does. Two things make streaming text
subtle:

* a multi-byte character may arrive split over two tokens: until it is complete, the decoded text
  ends in U+FFFD, and nothing is sent;
* text that could be the start of a stop string is held back until the next tokens show whether
  the stop string follows (then it is never sent: OpenAI leaves the stop string out).
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a request's growing list of output token ids into text deltas and finds stop strings.

    ``update(token_ids, finished)`` returns ``(delta, stopped)``: the new text to send and whether
    a stop string was found (then ``delta`` is the text up to it, and the request must end)."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.sent = ""  # the text sent so far
        self.stopped = False

    def update(self, token_ids: list[int], finished: bool) -> tuple[str, bool]:
        if self.tokenizer is None or self.stopped:
            return "", self.stopped
        # Decoding the whole output each time is O(n^2) over a request, and simple: a tokenizer may
        # change earlier characters when later tokens arrive (spaces, merged bytes); vLLM keeps a
        # sliding window of tokens for speed.
        text = self.tokenizer.decode(token_ids)
        if text.endswith("\ufffd") and not finished:
            text = text[:-1]  # a character only partly generated: wait for the rest
        end = self._find_stop(text)
        if end is not None:
            self.stopped = True
            return self._advance(text[:end]), True
        if not finished:
            text = text[: len(text) - self._partial_stop_len(text)]  # might be a stop string's start
        return self._advance(text), False

    def _advance(self, text: str) -> str:
        # Whatever was sent stays sent: a tokenizer that rewrites earlier text (rare) only changes
        # what follows it.
        delta = text[len(self.sent) :]
        self.sent += delta
        return delta

    def _find_stop(self, text: str) -> int | None:
        """Where the earliest stop string starts in ``text``, if any. Only the part not yet sent
        (plus a stop string's length before it) can hold a new match."""
        start = max(0, len(self.sent) - max((len(s) for s in self.stop), default=0))
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _partial_stop_len(self, text: str) -> int:
        """The length of the longest end of ``text`` that is the beginning of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
