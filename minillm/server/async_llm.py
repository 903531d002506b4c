"""``AsyncLLM`` (vLLM's name): the engine, stepping in a thread of its own, fed by many HTTP
handlers at once.

The engine loop (``minillm.llm_engine``) is synchronous: one ``step()`` after another. A server has
requests arriving at any moment on an asyncio event loop. The two meet here:

    HTTP handlers (event loop thread)            engine thread
    ---------------------------------            -------------
    add_request(request) ──► inbox ──────────►   between two steps: new requests join the
                                                 scheduler's waiting queue (iteration-level
                                                 scheduling, live), aborts are applied
    stream.get() ◄── per-request asyncio.Queue ◄ step(): each new token is handed back with
                     (loop.call_soon_threadsafe)  loop.call_soon_threadsafe, once per step
    abort(request_id) ─► inbox                   (client gone, or a stop string found)

When there is no work the engine thread sleeps on a condition variable instead of spinning; a new
request wakes it. Only the engine thread touches the engine, so the scheduler, runner and trace
need no locks of their own.

A server that is told to stop drains first (``drain``): new requests are refused, the ones under
way get a grace period to finish, and any still running then is ended with an error, so that every
client hears how its request ended.
"""

from __future__ import annotations

import asyncio
import threading

from minillm.llm_engine import TokenEvent, frozen_heap
from minillm.request import Request, RequestStatus

DEFAULT_MAX_TRACE_STEPS = 100_000  # rows kept for /v1/trace; older ones are dropped in bulk
MAX_REQUESTS_KEPT = 10_000  # requests kept for ``requests()`` (the slots view needs their metrics)


class EngineDeadError(RuntimeError):
    """The engine thread stopped (the server shut down, or a step raised): no more tokens will come."""


class RequestStream:
    """What one HTTP handler reads: its request's ``TokenEvent``s, in order, as the engine makes
    them. The engine thread puts; the handler awaits ``get()`` on its own event loop."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, items: list) -> None:  # runs on the event loop, via call_soon_threadsafe
        for item in items:
            self.queue.put_nowait(item)

    async def get(self) -> TokenEvent:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item


class AsyncLLM:
    """Steps ``llm``'s own engine (and KV pool) in a daemon thread while there is work, until
    ``shutdown`` hands it back; meanwhile ``llm``'s offline calls are refused. ``metrics`` (a
    ``ServerMetrics`` or None) is told about every step and every finished request, from the engine
    thread."""

    def __init__(self, llm, metrics=None, max_trace_steps: int = DEFAULT_MAX_TRACE_STEPS):
        self.llm = llm
        self.engine = llm.start_serving()
        self.metrics = metrics
        self.max_trace_steps = max_trace_steps
        self._cond = threading.Condition()  # guards the inbox and the streams, wakes the engine thread
        self._new: list[Request] = []
        self._aborts: list[tuple[Request, str]] = []
        self._streams: dict[str, RequestStream] = {}  # request id -> stream, while the request is unfinished
        self._requests: dict[str, Request] = {}  # every request accepted (the latest MAX_REQUESTS_KEPT), in order
        self._stopped = False
        self._draining = False  # refusing new requests: the server is shutting down
        self._drain_timer: threading.Timer | None = None
        self._handed_back = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._thread.start()

    # --- called from the HTTP side -------------------------------------------------------------
    def check_request(self, request: Request) -> None:
        """Raise ``ValueError`` for a request this engine could never run (e.g. more KV cache
        tokens than the whole pool), before it is accepted. Reads only the scheduler's fixed limits."""
        self.engine.scheduler.check_request(request)

    def add_request(self, request: Request) -> RequestStream:
        """Hand ``request`` to the engine; it joins the batch at the next step boundary. Call it
        from the event loop that will read the returned stream."""
        if not self.is_running:
            raise EngineDeadError(self.dead_message())
        stream = RequestStream(request, asyncio.get_running_loop())
        with self._cond:
            self._streams[request.request_id] = stream
            self._requests[request.request_id] = request
            if len(self._requests) > MAX_REQUESTS_KEPT:
                del self._requests[next(iter(self._requests))]
            self._new.append(request)
            self._cond.notify()
        return stream

    def abort(self, request_id: str, finish_reason: str = "abort") -> None:
        """Stop a request between steps: its slot and KV cache are freed. Nothing more is delivered
        to its stream. Harmless if it already finished."""
        with self._cond:
            stream = self._streams.pop(request_id, None)
            if stream is None:
                return
            self._aborts.append((stream.request, finish_reason))
            self._cond.notify()

    def num_unfinished(self, status: RequestStatus | None = None) -> int:
        """Accepted requests not finished yet (with ``status``: only those in that state; WAITING
        counts the ones queued, never run or preempted)."""
        with self._cond:
            streams = list(self._streams.values())
        return len(streams) if status is None else sum(s.request.status is status for s in streams)

    def requests(self) -> list[Request]:
        """The requests accepted so far (the latest ``MAX_REQUESTS_KEPT``), finished or not, in
        arrival order: with ``trace``, what the slots view draws."""
        with self._cond:
            return list(self._requests.values())

    @property
    def trace(self):
        """The engine's live trace: one ``StepRecord`` per step since the server started (the
        oldest dropped past ``max_trace_steps``). Times are seconds on the engine's clock."""
        return self.engine.trace

    @property
    def is_running(self) -> bool:
        """Taking requests: the engine thread runs, and the server is not draining (``/health``)."""
        return self._thread.is_alive() and not self._stopped and not self._draining

    def drain(self, grace: float) -> None:
        """Stop taking requests, and give the unfinished ones ``grace`` seconds to finish; then end
        each one still unfinished: its stream gets an ``EngineDeadError`` (a streaming client, an
        error event and ``[DONE]``) and the engine aborts it."""
        with self._cond:
            if self._draining:
                return
            self._draining = True
        self._drain_timer = threading.Timer(grace, self._end_unfinished)
        self._drain_timer.daemon = True
        self._drain_timer.start()

    def _end_unfinished(self) -> None:
        with self._cond:
            self._aborts += [(stream.request, "abort") for stream in self._streams.values()]
            self._cond.notify()
        self._fail_all(EngineDeadError("the server shut down before this request finished"))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; unfinished requests' streams get an ``EngineDeadError``. Once the
        thread has stopped, the engine goes back to ``llm`` with every request aborted: its KV pool
        empty, ready for offline calls or another server."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        self._thread.join(timeout)
        self._fail_all(EngineDeadError("the server is shutting down"))
        if not self._thread.is_alive() and not self._handed_back:  # a step still running keeps the engine
            self._handed_back = True
            self.llm.stop_serving()

    # --- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._wait_for_work():
                with frozen_heap():  # busy: no full garbage collection inside a step (minillm.llm_engine)
                    while self._serve_once():
                        pass
        except BaseException as err:  # noqa: BLE001 -- a bug or a device error: every waiting handler must hear of it
            self.error = err
            self._stopped = True
            self._fail_all(EngineDeadError(self.dead_message()))

    def _has_work(self) -> bool:  # called holding self._cond
        return bool(self._new or self._aborts or self.engine.has_unfinished_requests())

    def _wait_for_work(self) -> bool:
        """Sleep until a request (or shutdown) arrives; False once the server is stopping."""
        with self._cond:
            while not (self._has_work() or self._stopped):
                self._cond.wait()
            return not self._stopped

    def _serve_once(self) -> bool:
        """Take the inbox (new requests, aborts), then run one step. False when idle or stopping."""
        engine = self.engine
        with self._cond:
            if self._stopped:
                return False
            new, self._new = self._new, []
            aborts, self._aborts = self._aborts, []
        for request in new:
            engine.add_request(request)  # arrived already: it joins the waiting queue at the next step
        for request, reason in aborts:
            # False: it finished in the very step its client went away. Its stream was
            # already gone, so ``_step`` did not report it: report it here (once either way).
            engine.abort_request(request.request_id, reason)
            if self.metrics is not None and request.status is RequestStatus.FINISHED:
                self.metrics.on_request_finished(request)
        if self.metrics is not None and (new or aborts):
            self.metrics.update_gauges(engine)  # right even if no step follows
        if engine.has_unfinished_requests():
            self._step()
        with self._cond:
            return self._has_work() and not self._stopped

    def _step(self) -> None:
        engine = self.engine
        num_steps = engine.num_steps
        events = engine.step()
        record = engine.trace[-1] if engine.num_steps > num_steps else None  # None: the engine only waited
        by_stream: dict[RequestStream, list[TokenEvent]] = {}
        delivered: list[tuple[TokenEvent, Request]] = []
        finished: list[Request] = []
        with self._cond:
            for event in events:
                stream = self._streams.get(event.request_id)
                if stream is None:
                    continue  # aborted while this step ran
                by_stream.setdefault(stream, []).append(event)
                delivered.append((event, stream.request))
                if event.finished:
                    del self._streams[event.request_id]
                    finished.append(stream.request)
        for stream, stream_events in by_stream.items():
            try:
                stream.loop.call_soon_threadsafe(stream.put, stream_events)  # one hand-off per request per step
            except RuntimeError:  # that event loop is closed (the HTTP server stopped): nobody is reading
                pass
        if self.metrics is not None:
            self.metrics.on_step(engine, record, delivered)
            for request in finished:
                self.metrics.on_request_finished(request)
        steps = engine.trace.steps
        if len(steps) > self.max_trace_steps:
            del steps[: len(steps) - self.max_trace_steps // 2]  # in bulk: not a list shift per step

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            try:
                stream.loop.call_soon_threadsafe(stream.put, [error])
            except RuntimeError:  # that event loop is closed: nobody is reading
                pass

    def dead_message(self) -> str:
        """Why the engine is not running: the error that stopped it, or a shutdown (``/health``)."""
        if self.error is not None:
            return f"the engine stopped after an error: {type(self.error).__name__}: {self.error}"
        return "the server is shutting down: it takes no new requests"
