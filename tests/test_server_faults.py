"""``minillm serve`` against a hostile or careless client: input that cannot be encoded, fields it
would silently ignore, huge values echoed back, slow clients, a big trace read, sampling settings
at the edge of the floats, and a shutdown in the middle of streams."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from minillm import LLM, SamplingParams
from minillm.server import api_server, serve_in_thread
from minillm.server.launcher import Server
from minillm.server.limits import ServerLimits

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny):
    with serve_in_thread(LLM(tiny, engine="chunked", max_num_seqs=4, num_gpu_blocks=64), model_name=MODEL) as server:
        yield server


def post(server, body, route="/v1/completions", **kwargs) -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=30, **kwargs)


# --- input ----------------------------------------------------------------------------------------
LONE_SURROGATE = [
    ({"model": MODEL, "prompt": "a\ud800b"}, "/v1/completions", "prompt"),
    ({"model": MODEL, "prompt": ["a\udfffb"]}, "/v1/completions", "prompt[0]"),
    ({"model": MODEL, "prompt": "x", "stop": ["\ud800"]}, "/v1/completions", "stop[0]"),
    ({"model": "tiny\ud800", "prompt": "x"}, "/v1/completions", "model"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "a\ud800b"}]},
        "/v1/chat/completions",
        "messages[0].content",
    ),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        "/v1/chat/completions",
        "messages[0].content[0].text",
    ),
]


@pytest.mark.parametrize("body,route,param", LONE_SURROGATE, ids=[p for _, _, p in LONE_SURROGATE])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, body, route, param):
    # json.dumps escapes the surrogate as \ud800, which is valid JSON and decodes to an unencodable str
    response = httpx.post(server.url + route, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"]


UNSUPPORTED = [
    ("functions", [{"name": "f", "parameters": {}}]),
    ("function_call", "auto"),
    ("tool_choice", "auto"),
    ("min_tokens", 4),
    ("repetition_penalty", 1.3),
    ("min_p", 0.1),
    ("guided_json", {"type": "object"}),
    ("guided_choice", ["a", "b"]),
    ("include_stop_str_in_output", True),
    ("bad_words", ["x"]),
]


@pytest.mark.parametrize("field,value", UNSUPPORTED, ids=[f for f, _ in UNSUPPORTED])
def test_fields_that_would_change_the_output_are_refused_not_ignored(server, field, value):
    response = post(server, {"model": MODEL, "prompt": "x", "max_tokens": 2, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text


@pytest.mark.parametrize(
    "field,value",
    [
        ("tool_choice", "none"),
        ("repetition_penalty", 1.0),
        ("min_tokens", 0),
        ("user", "someone"),
        ("metadata", {"a": "b"}),
    ],
)
def test_fields_at_values_that_change_nothing_are_accepted(server, field, value):
    assert post(server, {"model": MODEL, "prompt": "x", "max_tokens": 2, field: value}).status_code == 200


def test_an_error_quotes_a_bounded_prefix_of_a_huge_value(server):
    huge = "x" * 10_000_000
    for body in ({"model": MODEL, "prompt": "x", "max_tokens": huge}, {"model": huge, "prompt": "x"}):
        response = post(server, body)
        assert response.status_code in (400, 404) and len(response.content) < 2_000
        assert "10,000,0" in response.json()["error"]["message"]  # says how long it was


def test_chat_on_a_model_without_a_chat_template_is_a_400(server):
    response = post(server, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages" and "no chat template" in response.json()["error"]["message"]


def test_chat_through_the_models_chat_template(chat_llama):
    from tests.test_chat_and_eos import template_ids

    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w5"}]
    expected = chat_llama.generate([template_ids(messages)], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    with serve_in_thread(LLM(chat_llama, engine="chunked", num_gpu_blocks=32), model_name="chat") as server:
        body = {
            "model": "chat",
            "messages": messages,
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        whole = post(server, body, "/v1/chat/completions").json()
        streamed = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30).text
    assert whole["choices"][0]["token_ids"] == expected.token_ids
    assert whole["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)
    events = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    assert [t for e in events for t in e["choices"][0].get("token_ids", [])] == expected.token_ids
    assert streamed.rstrip().endswith("data: [DONE]")


# --- sampling at the edge of the floats --------------------------------------------------------------
@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 1e-39}, {"temperature": 1e-6}, {"temperature": 1.0, "top_p": 1e-46}],
    ids=["t=1e-39", "t=1e-6", "top_p=1e-46"],
)
def test_vanishing_temperature_or_top_p_is_greedy_not_nan(tiny, server, sampling):
    greedy = tiny.generate(["Edge"], SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    assert tiny.generate(["Edge"], SamplingParams(max_tokens=8, ignore_eos=True, **sampling))[0].token_ids == greedy
    body = {"model": MODEL, "prompt": "Edge", "max_tokens": 8, "ignore_eos": True, "return_token_ids": True, **sampling}
    assert post(server, body).json()["choices"][0]["token_ids"] == greedy


# --- the trace -------------------------------------------------------------------------------------------
def test_the_trace_is_paged_and_bounded(server):
    for i in range(3):
        post(server, {"model": MODEL, "prompt": f"row {i}", "max_tokens": 5})
    everything = httpx.get(server.url + "/v1/trace").json()
    assert len(everything["steps"]) >= 5
    page = httpx.get(server.url + "/v1/trace", params={"since": 0, "limit": 2}).json()
    assert [s["step"] for s in page["steps"]] == [s["step"] for s in everything["steps"][:2]]
    following = httpx.get(server.url + "/v1/trace", params={"since": page["next"], "limit": 2}).json()
    assert following["steps"][0]["step"] == page["next"]
    for limit in (0, 10_001, "all"):
        response = httpx.get(server.url + "/v1/trace", params={"limit": limit})
        assert response.status_code == 400 and response.json()["error"]["param"] == "limit"


def test_a_slow_trace_read_does_not_hold_up_the_other_clients(server, monkeypatch):
    real = api_server.trace_json

    def slow(*args, **kwargs):
        time.sleep(2.0)  # as a very large page would take
        return real(*args, **kwargs)

    monkeypatch.setattr(api_server, "trace_json", slow)
    reader = threading.Thread(target=httpx.get, args=(server.url + "/v1/trace",), kwargs={"timeout": 30})
    reader.start()
    time.sleep(0.3)  # the trace request is being built
    start = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert post(server, {"model": MODEL, "prompt": "still", "max_tokens": 2}).status_code == 200
    elapsed = time.monotonic() - start
    reader.join()
    assert elapsed < 1.5, f"/health and a completion took {elapsed:.1f} s while the trace was being built"


def test_the_trace_needs_the_api_key(tiny):
    with serve_in_thread(LLM(tiny, engine="naive"), model_name=MODEL, api_key="sekrit") as server:
        assert httpx.get(server.url + "/v1/trace").status_code == 401
        assert httpx.get(server.url + "/v1/trace", headers={"Authorization": "Bearer sekrit"}).status_code == 200


# --- slow and many clients ---------------------------------------------------------------------------
@pytest.fixture
def strict_server(tiny):
    limits = ServerLimits(request_read_timeout=1.0, limit_concurrency=4)
    server = Server(
        LLM(tiny, engine="chunked", num_gpu_blocks=64), MODEL, port=0, limits=limits, shutdown_timeout=1.0
    ).start()
    yield server
    server.stop()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (an EOF, or a reset)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_client_that_sends_its_headers_byte_by_byte_is_cut_off(strict_server):
    with socket.create_connection(("127.0.0.1", strict_server.port)) as sock:
        start = time.monotonic()
        for byte in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n":
            try:
                sock.send(bytes([byte]))
            except OSError:
                break  # closed already
            time.sleep(0.05)
            if time.monotonic() - start > 3:
                break
        assert closed_within(sock, 3.0) and time.monotonic() - start < 4.5


def test_a_client_that_never_finishes_its_body_is_cut_off(strict_server):
    with socket.create_connection(("127.0.0.1", strict_server.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model":'
        )
        assert closed_within(sock, 3.0)


def test_a_long_stream_is_not_a_slow_read(strict_server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 600, "ignore_eos": True, "stream": True}
    start = time.monotonic()
    text = httpx.post(strict_server.url + "/v1/completions", json=body, timeout=60).text
    assert text.rstrip().endswith("data: [DONE]") and text.count('"finish_reason": "length"') == 1
    print(f"600 tokens streamed in {time.monotonic() - start:.1f} s")


def test_connections_past_the_limit_get_a_503(strict_server):
    idle = [socket.create_connection(("127.0.0.1", strict_server.port)) for _ in range(4)]
    try:
        time.sleep(0.2)
        response = httpx.get(strict_server.url + "/health", timeout=5)
        assert response.status_code == 503
    finally:
        for sock in idle:
            sock.close()
    time.sleep(1.2)  # the server notices the closed ones
    assert httpx.get(strict_server.url + "/health", timeout=5).status_code == 200


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="request_read_timeout must be a number of seconds > 0"):
        ServerLimits(request_read_timeout=0)
    with pytest.raises(ValueError, match="limit_concurrency must be an integer >= 1"):
        ServerLimits(limit_concurrency=0)


# --- shutdown ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_events(url: str, body: dict, out: list) -> None:
    """Every SSE line of one streamed completion, in ``out`` (a thread's target)."""
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line:
                    out.append(line)
    except httpx.HTTPError as err:
        out.append(f"transport error: {err!r}")


def test_sigterm_drains_the_streams_then_exits_0():
    """SIGTERM: requests under way get ``--shutdown-timeout`` to finish; one that does ends as usual,
    one that does not gets an error event, and both end with [DONE]; then the process exits 0."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minillm.cli",
            "serve",
            "--model",
            MODEL,
            "--engine",
            "chunked",
            "--max-num-seqs",
            "4",
            "--num-gpu-blocks",
            "256",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--shutdown-timeout",
            "1.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "minillm serve did not answer /health within 60 s"
            time.sleep(0.2)
        short, long = [], []
        base = {"model": MODEL, "prompt": "drain", "ignore_eos": True, "stream": True}
        threads = [
            threading.Thread(target=stream_events, args=(url, {**base, "max_tokens": 8}, short)),
            threading.Thread(target=stream_events, args=(url, {**base, "max_tokens": 2000}, long)),
        ]
        for t in threads:
            t.start()
        while not short or len(long) < 5:  # both requests were admitted and are streaming
            assert time.monotonic() < deadline, (short, long)
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert proc.wait(timeout=15) == 0, proc.stdout.read().decode()
        exit_s = time.monotonic() - signalled
        for t in threads:
            t.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()
    assert short[-1] == "data: [DONE]" and '"finish_reason": "length"' in short[-2], short[-3:]
    assert long[-1] == "data: [DONE]" and "shut down before this request finished" in long[-2], long[-3:]
    assert len(long) < 2000 and exit_s < 1.5 + 5, exit_s
