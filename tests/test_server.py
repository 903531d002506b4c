"""``minillm serve``: the OpenAI-compatible server, driven by the official ``openai`` client.

Every server here binds 127.0.0.1 on a free port, starts in the test and stops by itself. The model
is "tiny" in float64, so the server's tokens can be compared exactly with ``LLM.generate``'s."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm import LLM, SamplingParams
from minillm.engines import build_engine
from minillm.models.tokenizer import ByteTokenizer
from minillm.request import Request, RequestStatus
from minillm.server import serve_in_thread
from minillm.server.detokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny"
ENGINE_OPTIONS = {"max_num_seqs": 4, "block_size": 16, "num_gpu_blocks": 64}  # a 1024-token pool


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, engine="chunked", dtype="float64", **ENGINE_OPTIONS)


def served(llm) -> LLM:
    """Another engine on ``llm``'s weights: a server steps its LLM's engine, so the offline calls that
    the tests compare with run on ``llm``'s own."""
    return LLM(llm, engine="chunked", **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def server(llm):
    with serve_in_thread(served(llm), model_name=MODEL) as server:
        yield server
    assert not [t.name for t in threading.enumerate() if t.name.startswith("minillm-")], "a server thread survived"


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)


def metrics(server) -> dict:
    """``{(name, labels...): value}`` of every sample /metrics exposes (parsed by prometheus_client)."""
    text = httpx.get(server.url + "/metrics").text
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(values: dict, name: str, **labels) -> float:
    labels = {"model_name": MODEL, **labels}
    return values.get((name, *sorted(labels.items())), 0.0)


def wait_until_idle(server, timeout: float = 5.0) -> dict:
    """The server's stats once no request is unfinished (the engine thread applies aborts between steps)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        if stats["num_unfinished_requests"] == 0 and stats["num_free_blocks"] == stats["num_total_blocks"]:
            return stats
        assert time.monotonic() < deadline, f"requests still unfinished or blocks held: {stats}"
        time.sleep(0.02)


# --- the engine's abort path ----------------------------------------------------------------------
def test_engine_abort_request_frees_slots_and_blocks(llm):
    engine = build_engine(
        "chunked", llm.model, llm.device, llm.eos_token_ids, max_num_seqs=2, block_size=16, num_gpu_blocks=16
    )
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    requests = [Request(str(i), [1 + i] * 20, params, 0.0) for i in range(3)]
    for r in requests:
        engine.add_request(r)
    engine.step()  # 0 and 1 run, 2 waits for a slot
    assert [r.request_id for r in engine.scheduler.running] == ["0", "1"]
    assert engine.abort_request("1") and engine.abort_request("2", "stop")
    assert not engine.abort_request("1") and not engine.abort_request("nobody")
    assert requests[1].status is RequestStatus.FINISHED and requests[1].finish_reason == "abort"
    assert requests[2].finish_reason == "stop" and not engine.scheduler.waiting
    assert "1" not in engine.scheduler.slots and "1" not in engine.scheduler.block_manager.block_tables
    while engine.has_unfinished_requests():
        engine.step()
    assert len(requests[0].output_token_ids) == 20  # the one left finished normally
    assert engine.scheduler.block_manager.num_free_blocks == 16
    pending = Request("later", [1, 2], params, arrival_time=1e9)  # not arrived yet: only in engine.pending
    engine.add_request(pending)
    assert engine.abort_request("later") and not engine.has_unfinished_requests()


def test_engine_abort_request_of_a_swapped_out_request(llm):
    """A request preempted to host memory (swap mode) is aborted from the ``swapped`` queue; its
    host copy is dropped and the others finish."""
    engine = build_engine(
        "paged",
        llm.model,
        llm.device,
        llm.eos_token_ids,
        max_num_seqs=2,
        block_size=4,
        num_gpu_blocks=6,
        preemption_mode="swap",
    )
    for i in range(2):
        engine.add_request(Request(str(i), [3 + i] * 8, SamplingParams(max_tokens=8, ignore_eos=True), 0.0))
    while not engine.scheduler.swapped:
        engine.step()
    victim = engine.scheduler.swapped[0].request_id
    assert victim in engine.runner.host_kv
    assert engine.abort_request(victim)
    assert not engine.scheduler.swapped and victim not in engine.runner.host_kv
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.block_manager.num_free_blocks == 6


@pytest.mark.parametrize("engine_name", ["continuous", "naive"])
def test_engine_abort_request_other_engines(llm, engine_name):
    options = {"max_num_seqs": 2, "num_kv_tokens": 200} if engine_name == "continuous" else {}
    engine = build_engine(engine_name, llm.model, llm.device, llm.eos_token_ids, **options)
    r = Request("a", [5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True), 0.0)
    engine.add_request(r)
    engine.step()
    assert engine.abort_request("a") and not engine.has_unfinished_requests()
    assert engine.runner.kv_tokens() == 0
    if engine_name == "continuous":
        assert engine.scheduler.num_reserved_kv_tokens == 0


# --- stop strings ---------------------------------------------------------------------------------
def test_detokenizer_holds_back_a_possible_stop_string_and_cuts_before_it():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, ["lo w"])
    ids = list(b"hello world")
    sent, stopped_at = [], None
    for i in range(1, len(ids) + 1):
        delta, stopped = detok.update(ids[:i], finished=False)
        sent.append(delta)
        if stopped:
            stopped_at = i
            break
    assert "".join(sent) == "hel" and stopped_at == len("hello w")
    assert sent[:4] == ["h", "e", "", "l"]  # the first "l" could start "lo w": held back until the next "l"


def test_detokenizer_releases_held_text_when_the_stop_string_does_not_follow():
    detok = IncrementalDetokenizer(ByteTokenizer(), ["abc"])
    ids = list(b"xabd")
    deltas = [detok.update(ids[:i], finished=i == len(ids)) for i in range(1, len(ids) + 1)]
    assert [d for d, _ in deltas] == ["x", "", "", "abd"] and not any(s for _, s in deltas)


def test_detokenizer_waits_for_a_whole_multibyte_character():
    detok = IncrementalDetokenizer(ByteTokenizer())
    ids = list("é!".encode())  # é is two bytes
    assert detok.update(ids[:1], False) == ("", False)
    assert detok.update(ids[:2], False) == ("é", False)
    assert detok.update(ids, True) == ("!", False)


# --- the OpenAI API ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_p": 0.9, "seed": 1234}], ids=["greedy", "seeded"]
)
def test_completion_tokens_equal_generate(llm, server, client, sampling):
    prompt = "The KV cache"
    expected = llm.generate([prompt], SamplingParams(max_tokens=12, **sampling))[0]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "extra_body": {"return_token_ids": True}, **sampling}
    whole = client.completions.create(**body)
    chunks = list(client.completions.create(stream=True, **body))
    assert whole.choices[0].token_ids == expected.token_ids
    assert whole.choices[0].text == expected.text and whole.choices[0].finish_reason == expected.finish_reason
    assert [t for c in chunks for t in c.choices[0].token_ids] == expected.token_ids
    assert len(chunks) == len(expected.token_ids)  # one server-sent event per token
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + [expected.finish_reason]
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert whole.usage.completion_tokens == len(expected.token_ids)


def test_stream_ends_with_done_and_usage_chunk(server):
    body = {
        "model": MODEL,
        "prompt": "Hi",
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert len(chunks) == 6 and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_chat_streaming_and_not(chat_llama):
    """A chat model (a tiny Llama with a chat template) answers through its template, streamed and not,
    with content given as a string or as a list of text parts."""
    from tests.test_chat_and_eos import template_ids

    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w5"}]
    expected = chat_llama.generate([template_ids(messages)], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    with serve_in_thread(LLM(chat_llama, engine="chunked", num_gpu_blocks=32), model_name="chat") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
        options = {"model": "chat", "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
        whole = client.chat.completions.create(messages=messages, **options)
        chunks = list(
            client.chat.completions.create(
                messages=messages, stream=True, stream_options={"include_usage": True}, **options
            )
        )
        parts = [
            {"role": "system", "content": [{"type": "text", "text": "w1 "}, {"type": "text", "text": "w2"}]},
            messages[1],
        ]  # content as a list of text parts, as newer clients send it
        same = client.chat.completions.create(messages=parts, **options)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content == expected.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids) == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert same.choices[0].message.content == expected.text


def test_stop_strings_and_stop_token_ids(llm, server, client):
    expected = llm.generate(["Stop here"], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    text = expected.text
    stop = next(text[i : i + 2] for i in range(3, len(text) - 1) if "\ufffd" not in text[i : i + 2])
    r = client.completions.create(
        model=MODEL, prompt="Stop here", max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    stop_id = expected.token_ids[5]
    r = client.completions.create(
        model=MODEL,
        prompt="Stop here",
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [stop_id], "return_token_ids": True},
    )
    assert r.choices[0].token_ids == expected.token_ids[: expected.token_ids.index(stop_id) + 1]
    assert r.choices[0].finish_reason == "stop"
    wait_until_idle(server)  # the stop string's request was aborted in the engine: nothing left behind


def test_models_health_and_trace(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    client.completions.create(model=MODEL, prompt="trace me", max_tokens=3, temperature=0)
    trace = httpx.get(server.url + "/v1/trace", params={"since": 0}).json()
    assert trace["num_gpu_blocks"] == 64 and trace["block_size"] == 16 and trace["steps"]
    assert trace["next"] == trace["steps"][-1]["step"] + 1 == len(server.trace)
    assert {"slots", "decode_ids", "prefill_ids", "num_running", "kv_tokens"} <= set(trace["steps"][0])
    assert httpx.get(server.url + "/v1/trace", params={"since": trace["next"]}).json()["steps"] == []


def test_live_slots_view_from_the_server(server, client):
    """What the notebook draws: the slots timeline of the server's own trace and requests."""
    import matplotlib

    matplotlib.use("Agg")
    from minillm.widgets.slots import cell_grid, draw_slots

    first = len(server.trace)
    barrier = threading.Barrier(3)

    def send(i):
        barrier.wait()
        client.completions.create(
            model=MODEL, prompt=f"slot {i}", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
        )

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    outputs = server.outputs()
    assert all(o.finish_reason == "length" and len(o.token_ids) == 6 for o in outputs[-3:])
    grid = cell_grid(server.trace, outputs)
    assert grid.states.shape[1] == len(server.trace) and grid.num_slot_rows >= 2
    ax = draw_slots(server.trace, outputs)
    assert ax.figure is not None
    rows = httpx.get(server.url + "/v1/trace", params={"since": first}).json()
    assert {r["request_id"] for r in rows["requests"]} >= {o.request_id for o in outputs[-3:]}
    import matplotlib.pyplot as plt

    plt.close("all")


def test_metrics_parse_and_move(server, client):
    before = metrics(server)
    client.completions.create(model=MODEL, prompt="count", max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    after = metrics(server)

    def delta(name, **labels):
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("minillm:generation_tokens_total") == 7
    assert delta("minillm:prompt_tokens_total") == 6  # BOS + 5 bytes
    assert delta("minillm:request_success_total", finished_reason="length") == 1
    assert delta("minillm:time_to_first_token_seconds_count") == 1
    assert delta("minillm:inter_token_latency_seconds_count") == 6
    assert delta("minillm:e2e_request_latency_seconds_count") == 1
    assert delta("minillm:request_queue_time_seconds_count") == 1
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert ("minillm:" + gauge, ("model_name", MODEL)) in after
    assert ("minillm:num_preemptions_total", ("model_name", MODEL)) in after


def test_concurrent_streams_interleave(llm, server):
    prompts = [f"client {i} says" for i in range(4)]
    expected = llm.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    first_step = len(server.trace)
    results, barrier = {}, threading.Barrier(len(prompts))

    def run(i):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
        barrier.wait()
        times, ids = [], []
        for chunk in c.completions.create(
            model=MODEL,
            prompt=prompts[i],
            max_tokens=40,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        ):
            times.append(time.perf_counter())
            ids += chunk.choices[0].token_ids
        results[i] = (times, ids)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i][1] for i in range(len(prompts))] == [o.token_ids for o in expected]
    # The streams overlap in time, and the engine ran several of them in one step.
    starts, ends = [r[0][0] for r in results.values()], [r[0][-1] for r in results.values()]
    assert max(starts) < min(ends)
    assert max(len(row.decode_ids) for row in server.trace.steps[first_step:]) >= 2


BAD_BODIES = [
    (b"{not json", None),
    (b"[1, 2]", None),
    ({"prompt": "x"}, "model"),
    ({"model": MODEL}, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": -1}, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": MODEL, "prompt": 5}, "prompt"),
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL, "prompt": [1, 99999]}, "prompt"),
    ({"model": MODEL, "prompt": "x" * 2100}, "prompt"),  # over the model's 2048-token context
    ({"model": MODEL, "prompt": "x", "max_tokens": 5000}, "max_tokens"),  # prompt + max_tokens over the context
    ({"model": MODEL, "prompt": "x", "max_tokens": 1500}, "max_tokens"),  # fits the context, never the 1024-token pool
    ({"model": MODEL, "prompt": "x" * 1100, "max_tokens": 1}, "prompt"),  # the prompt alone overflows the pool
    ({"model": MODEL, "prompt": "x", "n": 2}, "n"),
    ({"model": MODEL, "prompt": "x", "seed": 2**64}, "seed"),  # past torch's seeds: must not reach the engine thread
    ({"model": MODEL, "prompt": "x", "top_k": -1}, "top_k"),
    ({"model": MODEL, "prompt": "x", "logprobs": 2}, "logprobs"),
    ({"model": MODEL, "prompt": "x", "stop": [99999]}, "stop"),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]},
        "messages[0].content[0].type",
    ),
]


@pytest.mark.parametrize("body,param", BAD_BODIES, ids=[str(p) + str(i) for i, (_, p) in enumerate(BAD_BODIES)])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    route = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    if isinstance(body, bytes):
        response = httpx.post(server.url + route, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(server.url + route, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["message"]


def test_the_server_keeps_serving_after_bad_input(server, client):
    for body in (b"{", {"model": MODEL, "prompt": "x", "max_tokens": -3}):
        kwargs = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, bytes)
            else {"json": body}
        )
        assert httpx.post(server.url + "/v1/completions", **kwargs).status_code == 400
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="not-this-one", prompt="x", max_tokens=1)
    assert err.value.code == "model_not_found" and err.value.param == "model"
    missing = httpx.get(server.url + "/v1/no-such-route")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
    r = client.completions.create(
        model=MODEL, prompt="still here", max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 4


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    before = metrics(server)
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        got = [next(lines) for _ in range(6)]  # three events (and their blank lines), then hang up
    assert sum(line.startswith("data: ") for line in got) == 3
    stats = wait_until_idle(server)
    assert stats["num_free_blocks"] == stats["num_total_blocks"] == 64
    after = metrics(server)
    assert (
        sample(after, "minillm:request_success_total", finished_reason="abort")
        - sample(before, "minillm:request_success_total", finished_reason="abort")
        == 1
    )
    assert sample(after, "minillm:generation_tokens_total") - sample(before, "minillm:generation_tokens_total") < 900
    assert sample(after, "minillm:num_requests_running") == 0 and sample(after, "minillm:kv_cache_usage_perc") == 0


def test_disconnect_while_waiting_for_a_whole_answer_aborts(server):
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.3))
    wait_until_idle(server)


def test_bounded_load_loses_and_duplicates_no_tokens(llm, server):
    """40 streamed requests from 8 threads: every token arrives once, in order, equal to generate's."""
    prompts = [f"load {i}" for i in range(40)]
    lengths = [4 + (7 * i) % 13 for i in range(40)]
    expected = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths])
    before = metrics(server)
    got, errors = {}, []

    def worker(k):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        try:
            for i in range(k, 40, 8):
                ids, usage = [], None
                for chunk in c.completions.create(
                    model=MODEL,
                    prompt=prompts[i],
                    max_tokens=lengths[i],
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True, "return_token_ids": True},
                ):
                    if chunk.choices:
                        ids += chunk.choices[0].token_ids
                    else:
                        usage = chunk.usage
                got[i] = (ids, usage.completion_tokens)
        except Exception as err:  # noqa: BLE001 -- reported below, not lost in the thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors and time.monotonic() - start < 60
    for i, out in enumerate(expected):
        assert got[i] == (out.token_ids, lengths[i]), f"request {i}"
    after = metrics(server)
    assert sample(after, "minillm:generation_tokens_total") - sample(before, "minillm:generation_tokens_total") == sum(
        lengths
    )
    wait_until_idle(server)


# --- servers of their own ---------------------------------------------------------------------------
def test_max_waiting_refuses_with_503_and_retry_after():
    llm = LLM(MODEL, engine="chunked", dtype="float64", max_num_seqs=1, block_size=16, num_gpu_blocks=64)
    with serve_in_thread(served(llm), model_name=MODEL, max_waiting=1) as server:
        results, barrier = [], threading.Barrier(6)
        body = {"model": MODEL, "prompt": "queue", "max_tokens": 30, "ignore_eos": True, "temperature": 0}

        def send():
            barrier.wait()
            results.append(httpx.post(server.url + "/v1/completions", json=body, timeout=60))

        threads = [threading.Thread(target=send) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        refused = [r for r in results if r.status_code == 503]
        accepted = [r for r in results if r.status_code == 200]
        assert len(refused) + len(accepted) == 6 and refused and accepted
        assert all(
            r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "server_overloaded" for r in refused
        )
        assert all(r.json()["usage"]["completion_tokens"] == 30 for r in accepted)  # every accepted request completes
        wait_until_idle(server)
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200


def test_api_key(llm):
    with serve_in_thread(served(llm), model_name=MODEL, api_key="sekrit") as server:
        wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model=MODEL, prompt="x", max_tokens=1)
        response = httpx.get(server.url + "/v1/models")
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
        right = openai.OpenAI(base_url=server.url + "/v1", api_key="sekrit", max_retries=0)
        assert right.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(server.url + "/health").status_code == 200  # open, for load balancers
        assert httpx.get(server.url + "/metrics").status_code == 200


def test_bad_server_options_fail_before_serving(llm, capsys):
    from minillm.cli import main

    threads = set(threading.enumerate())
    with pytest.raises(ValueError, match="max_waiting"), serve_in_thread(llm, max_waiting=0):
        pass
    with pytest.raises(ValueError, match="go with a model name"), serve_in_thread(llm, engine="paged"):
        pass
    time.sleep(0.1)
    assert set(threading.enumerate()) <= threads  # the engine thread of the refused server stopped
    assert main(["serve", "--engine", "nope"]) == 2 and "unknown engine 'nope'" in capsys.readouterr().err
    assert main(["serve", "--max-waiting", "0"]) == 2
    capsys.readouterr()
    assert main(["serve", "--num-threads", "0"]) == 2
    assert "num_threads must be an integer >= 1, got 0" in capsys.readouterr().err


def test_an_engine_failure_fails_requests_and_health_not_hangs(llm):
    with serve_in_thread(served(llm), model_name=MODEL) as server:

        def broken_step(stream=True):
            raise RuntimeError("device lost")

        server.async_llm.engine.step = broken_step
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3}
        response = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
        assert response.status_code == 500 and "device lost" in response.json()["error"]["message"]
        assert httpx.get(server.url + "/health").status_code == 503
        assert httpx.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=10).status_code == 503


def test_a_server_uses_every_core_for_a_real_model_unless_told(monkeypatch):
    from minillm.models.cpu_threads import resolve_num_threads

    monkeypatch.delenv("MINILLM_NUM_THREADS", raising=False)
    assert resolve_num_threads("smollm2", None, dedicated=True) == os.cpu_count()  # the machine is the server's
    assert resolve_num_threads("tiny", None, dedicated=True) == 1  # tiny's own default: one thread
    assert resolve_num_threads("smollm2", 1, dedicated=True) == 1
    monkeypatch.setenv("MINILLM_NUM_THREADS", "1")
    assert resolve_num_threads("smollm2", None, dedicated=True) == 1  # the variable still overrides


def test_binds_loopback_by_default(server):
    assert server.host == "127.0.0.1"
    assert server.uvicorn.servers[0].sockets[0].getsockname()[0] == "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serve_answers_health_then_terminates():
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
            "2",
            "--num-gpu-blocks",
            "32",
            "--fast-path",  # chapter 9's fast path serves too, and its CUDA graphs (stand-ins here)
            "--cuda-graphs",
            "--num-threads",
            "1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "minillm serve did not answer /health within 60 s"
            time.sleep(0.2)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)  # uvicorn shuts down, then re-raises the signal
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of its process group survived


# --- the engine thread's races ----------------------------------------------------------------------
class CountingMetrics:
    """A stand-in for ``ServerMetrics``: counts the requests reported finished."""

    def __init__(self):
        self.finished: list[str] = []

    def on_request_finished(self, request):
        self.finished.append(request.request_id)

    def on_step(self, engine, record, delivered):
        pass

    def update_gauges(self, engine):
        pass


def test_a_request_finishing_in_the_step_its_client_aborts_is_reported_once(llm):
    """The client hangs up while the step that produces the last token runs: the stream is gone
    before the step hands out its events, and the engine's abort then finds the request finished.
    It must still be reported (request_success_total, the e2e histogram), and only once."""
    from minillm.server.async_llm import AsyncLLM

    metrics = CountingMetrics()
    async_llm = AsyncLLM(llm, metrics=metrics)
    step = async_llm.engine.step

    def step_then_hang_up():
        events = step()
        for event in events:
            if event.finished:
                async_llm.abort(event.request_id)  # as an HTTP handler would, from its own thread
        return events

    async_llm.engine.step = step_then_hang_up

    async def run():
        stream = async_llm.add_request(Request("raced", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), 0.0))
        await asyncio.wait_for(stream.get(), 10)  # the first token
        for _ in range(200):
            if metrics.finished:
                break
            await asyncio.sleep(0.02)

    try:
        asyncio.run(run())
        time.sleep(0.1)
    finally:
        async_llm.shutdown()
    assert metrics.finished == ["raced"]
