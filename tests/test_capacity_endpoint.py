"""The capacity tool against an OpenAI-compatible server (``endpoint_target``, ``minillm capacity
--url``), measured on minillm's own server: the tiny model, started here on a free loopback port,
stopped by itself. Real time on a loaded machine: the SLOs are loose and the assertions about
latencies check their shape and order of magnitude, never a speed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from itertools import pairwise

import numpy as np
import pytest

from minillm import LLM
from minillm.capacity import at_rate, base_workload, endpoint_target, find_capacity, llm_target, measure, parse_slos
from minillm.capacity.endpoint import EndpointError
from minillm.cli import main
from minillm.server import serve_in_thread

pytestmark = pytest.mark.timeout(120)

MODEL, KEY = "tiny", "test-key"
ENGINE_OPTIONS = {"engine": "continuous", "max_num_seqs": 8}
SLOS = ["ttft_p95=5", "itl_p95=1"]  # loose: every rate meets them unless the machine stalls
MIX, NUM_REQUESTS = "cpu chat", 16


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(MODEL, api_key=KEY, **ENGINE_OPTIONS) as server:
        yield server
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("minillm-", "capacity-"))], (
        "a server or client thread survived"
    )


@pytest.fixture(scope="module")
def url(server):
    return server.url + "/v1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_find_capacity_against_the_server_times_every_token_of_every_request(url):
    target = endpoint_target(url, MODEL, api_key=KEY)
    runs = []

    def recording(workload):
        run = target(workload)
        runs.append((workload, run))
        return run

    recording.description = target.description
    result = find_capacity(
        slo=SLOS, target=recording, mix=MIX, num_requests=NUM_REQUESTS, rate_range=(8, 16), rel_tol=1.5
    )
    assert [r.rate for r in result.rates] == [8, 16] and len(runs) == 2, result.table()  # 8 met, so 16 was tried
    assert result.max_rate in (8, 16)  # 16 too unless a loaded machine stalled the run
    assert url in result.target and "rate req/s" in result.table()
    data = json.loads(result.to_json())
    assert {"max_rate", "slo", "rates"} <= set(data)
    for entry in data["rates"]:
        assert {"rate", "met", "ttft_p95", "itl_p95", "output_tokens_per_s", "goodput"} <= set(entry)
    for r in result.rates:  # a client cannot see the server's queue
        assert r.max_waiting is None and r.waiting_over_time is None and r.output_tokens_per_s > 0

    for workload, run in runs:
        assert run.waiting is None and len(run.requests) == len(workload)
        for request, params in zip(run.requests, workload.sampling_params):
            assert request.num_output_tokens == params.max_tokens  # ignore_eos: the full length, every time
            assert 0 < request.ttft <= request.e2e and all(gap >= 0 for gap in request.itl)
            assert request.e2e == pytest.approx(request.ttft + sum(request.itl))
        # Sent at its arrival time: never early, on time as a rule; a busy machine (the server steps in
        # this process, and CI runs other tests beside it) can hold one request back by half a second.
        lags = [request.arrival_time - due for request, due in zip(run.requests, workload.arrival_times)]
        assert min(lags) > -0.05 and np.median(lags) < 0.25 and max(lags) < 2.0, lags
        assert np.all(np.diff([r.arrival_time for r in run.requests]) >= 0)  # sent in the workload's order


def test_the_client_measured_ttft_is_close_to_the_in_process_figure(url):
    """The same workload at one rate, on the same engine: measured from the client over HTTP, and in
    process by ``llm_target``. The client's adds HTTP and the event loop, so it is higher, but of
    the same order."""
    workload, slos = at_rate(base_workload(MIX, NUM_REQUESTS, seed=1), 8), parse_slos(SLOS)
    over_http = measure(endpoint_target(url, MODEL, api_key=KEY)(workload), 8, slos)
    in_process = measure(llm_target(LLM(MODEL, **ENGINE_OPTIONS))(workload), 8, slos)
    http_p50, local_p50 = over_http.latencies["ttft_p50"], in_process.latencies["ttft_p50"]
    print(
        f"TTFT p50 at 8 req/s: {http_p50 * 1e3:.1f} ms over HTTP, {local_p50 * 1e3:.1f} ms in process; "
        f"ITL p50 {over_http.latencies['itl_p50'] * 1e3:.1f} ms vs {in_process.latencies['itl_p50'] * 1e3:.1f} ms"
    )
    assert local_p50 / 10 < http_p50 < local_p50 * 10


def test_max_concurrency_holds_requests_on_the_client(url):
    workload = at_rate(base_workload(MIX, 8, seed=2), 1000)  # all at once
    run = endpoint_target(url, MODEL, api_key=KEY, max_concurrency=1, check=False)(workload)
    assert [r.num_output_tokens for r in run.requests] == [p.max_tokens for p in workload.sampling_params]
    spans = sorted((r.arrival_time + r.ttft, r.finish_time) for r in run.requests)
    assert all(b[0] >= a[1] - 1e-3 for a, b in pairwise(spans))  # one at a time: no two streams overlap


# --- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_url_and_the_servers_message(url):
    with pytest.raises(EndpointError, match=r"answered 401.*--api-key"):
        endpoint_target(url, MODEL)
    with pytest.raises(EndpointError, match=r"answered 404.*does not exist"):
        endpoint_target(url, "no-such-model", api_key=KEY)
    with pytest.raises(EndpointError, match=r"answered 404.*ending in /v1"):
        endpoint_target(url.removesuffix("/v1"), MODEL, api_key=KEY)
    too_long = at_rate(base_workload(MIX, 4, seed=3), 100)
    too_long.prompts[2] = [1] * 5000  # over the tiny model's context: the server refuses it mid-run
    with pytest.raises(EndpointError, match=r"/v1/completions answered 400: prompt"):
        endpoint_target(url, MODEL, api_key=KEY, check=False)(too_long)
    port = free_port()
    with pytest.raises(EndpointError, match=rf"cannot connect to http://127.0.0.1:{port}/v1"):
        endpoint_target(f"http://127.0.0.1:{port}/v1", MODEL)
    with pytest.raises(ValueError, match="http://"):
        endpoint_target("127.0.0.1:8000/v1", MODEL)


# --- the CLI --------------------------------------------------------------------------------------


def test_cli_url_prints_the_table_and_writes_json(url, tmp_path):
    path = tmp_path / "capacity.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "minillm.cli",
            "capacity",
            "--url",
            url,
            "--model",
            MODEL,
            "--api-key",
            KEY,
            "--mix",
            MIX,
            "--num-requests",
            "8",
            "--rate-min",
            "16",
            "--rate-max",
            "32",
            "--rel-tol",
            "1.5",
            *[a for s in SLOS for a in ("--slo", s)],
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rate req/s" in proc.stdout and "max rate meeting every SLO" in proc.stdout and url in proc.stdout
    data = json.loads(path.read_text())
    assert data["rates"][0]["rate"] == 16 and data["engine"] == "endpoint" and url in data["target"]


@pytest.mark.parametrize(
    "args",
    [
        ["--url", "http://127.0.0.1:{port}/v1", "--model", MODEL],  # nothing listening
        ["--url", "http://127.0.0.1:{port}/v1", "--profile", "cpu-tiny"],
        ["--url", "http://127.0.0.1:{port}/v1"],  # no --model
        ["--url", "http://127.0.0.1:{port}/v1", "--model", MODEL, "--max-num-seqs", "4"],
        ["--url", "http://127.0.0.1:{port}/v1", "--model", MODEL, "--engine", "chunked"],
        ["--model", MODEL, "--api-key", "k"],  # --api-key without --url
    ],
)
def test_cli_url_bad_input_is_one_line_and_exit_2(args, capsys):
    port = free_port()
    args = [a.format(port=port) for a in args]
    assert main(["capacity", "--slo", "ttft_p95=1", "--num-requests", "4", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("minillm capacity: error:"), err


# --- the stream's token count, from a scripted server (no HTTP) ------------------------------------


def scripted_stream(chunks, usage):
    """Time one request against a server that streams ``chunks`` (each ``(text, finish_reason)``) and
    then reports ``usage`` completion tokens."""
    import asyncio

    import httpx

    from minillm.capacity.endpoint import Endpoint

    events = [{"choices": [{"index": 0, "text": text, "finish_reason": reason}]} for text, reason in chunks]
    events.append({"choices": [], "usage": {"completion_tokens": usage}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    async def go():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body))
        async with httpx.AsyncClient(transport=transport) as client:
            return await Endpoint("http://x/v1", "m", None, 5.0).stream(client, [1, 2], len(chunks))

    return asyncio.run(go())


def test_a_final_empty_chunk_with_a_finish_reason_is_not_a_token():
    times, usage = scripted_stream([("a", None), ("b", None), ("c", None), ("", "length")], usage=3)  # SGLang's way
    assert usage == 3 and len(times) == 3
    times, _ = scripted_stream([("a", None), ("b", None), ("c", "length")], usage=3)  # vLLM's way
    assert len(times) == 3
    times, _ = scripted_stream([("a", None), ("b", None), ("", "length")], usage=3)  # an empty last token: counts
    assert len(times) == 3
