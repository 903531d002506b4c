"""minillm's model and loading path against the oracle, Hugging Face transformers.

Every supported family is built as a tiny random transformers model; minillm must reproduce its
logits (with and without a KV cache), its greedy tokens, and load it from disk the same way.
Nothing here touches the network: hub behaviour is tested with the hub made unreachable.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, GemmaConfig, GPT2Config, LlamaConfig, MistralConfig

from minillm import LLM, SamplingParams
from minillm.attention.contiguous import ContiguousKVCache
from minillm.models.llama import CausalLM, ModelConfig, rope_inv_freq
from minillm.models.loader import _hub_offline, load_model
from minillm.models.tokenizer import ByteTokenizer
from tests.hf_models import FAMILIES, SMALL, VOCAB, make_hf_model, word_tokenizer

CPU = torch.device("cpu")
TOL = 1e-4  # float32; relative error = max|ours - hf| / max|hf|


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def random_ids(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# --- 1. logits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf(family, dtype):
    hf = make_hf_model(family, dtype)
    ours, tokenizer = load_model(hf, dtype, CPU)
    assert tokenizer is None
    ids = random_ids(3, 40)  # a [B, T] batch of equal-length sequences
    with torch.no_grad():
        ref = hf(ids).logits
        logits = ours.compute_logits(ours(ids, torch.arange(40).expand(3, 40)))
    assert logits.shape == ref.shape and logits.dtype == dtype
    assert rel_err(logits, ref) < (TOL if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_decode_matches_full_recompute(family):
    hf = make_hf_model(family)
    ours, _ = load_model(hf, torch.float32, CPU)
    ids = random_ids(28)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # every position, computed at once
        cache = ContiguousKVCache(ours.config, max_len=28, dtype=torch.float32, device=CPU)
        prefill = ours.compute_logits(ours(ids[:20], torch.arange(20), cache))
        cache.advance(20)
        decoded = [prefill]
        for pos in range(20, 28):  # then one token at a time, reading the rest from the cache
            decoded.append(ours.compute_logits(ours(ids[pos : pos + 1], torch.tensor([pos]), cache)))
            cache.advance(1)
    assert cache.num_tokens == 28
    assert rel_err(torch.cat(decoded), ref) < TOL


def test_llama3_rope_frequencies_match_hf():
    """The llama3 parity tests only mean something if the scaling changes the frequencies."""
    hf = make_hf_model("llama3")
    cfg = ModelConfig.from_hf(hf.config)
    assert torch.equal(rope_inv_freq(cfg), hf.model.rotary_emb.inv_freq)
    assert not torch.allclose(rope_inv_freq(cfg), rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None)))


def test_rope_stays_exact_in_bfloat16():
    """cos/sin are computed in float32 before the cast: a bfloat16 rotation speed would put
    position 4,000 off by radians (HF keeps inv_freq in float32 for the same reason)."""
    cfg = ModelConfig.from_hf(LlamaConfig(**dict(SMALL, max_position_embeddings=8192)))
    positions = torch.arange(4000, 4100)
    cos32, sin32 = CausalLM(cfg).model.rotary_emb(positions)
    cos16, sin16 = CausalLM(cfg).to(torch.bfloat16).model.rotary_emb(positions)
    assert cos16.dtype == torch.bfloat16
    assert (cos16.float() - cos32).abs().max() < 1e-2  # bfloat16 rounding of a value in [-1, 1]
    assert (sin16.float() - sin32).abs().max() < 1e-2


def test_sliding_window_caps_the_context():
    """minillm attends over everything, so it only accepts sequences inside Mistral's window."""
    cfg = ModelConfig.from_hf(MistralConfig(**dict(SMALL, sliding_window=64)))
    assert cfg.max_position_embeddings == 64


# --- 2. greedy tokens through the public API ---------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_hf_generate(family):
    hf = make_hf_model(family)
    prompts = random_ids(2, 12, seed=2)
    with torch.no_grad():
        ref = hf.generate(
            prompts,
            do_sample=False,
            max_new_tokens=32,
            min_new_tokens=32,
            eos_token_id=None,
            pad_token_id=0,
            attention_mask=torch.ones_like(prompts),
        )[:, 12:]
    llm = LLM(hf, engine="naive", dtype="float32", device="cpu")
    outputs = llm.generate(prompts.tolist(), SamplingParams(max_tokens=32, ignore_eos=True))
    assert [o.token_ids for o in outputs] == ref.tolist()


# --- 3. loading from a directory ---------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "smollm2"])
def test_directory_with_tokenizer_generates_like_the_model_in_memory(family, tmp_path):
    hf = make_hf_model(family)
    hf.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    prompt = [5, 17, 3, 99, 42, 8]
    expected = LLM(hf, dtype="float32", device="cpu").generate([prompt], params)[0].token_ids

    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    assert llm.eos_token_id == VOCAB - 1
    by_text = llm.generate(["w5 w17 w3 w99 w42 w8"], params)[0]
    assert by_text.prompt_token_ids == prompt
    assert by_text.token_ids == expected
    assert by_text.text == " ".join(f"w{t}" for t in expected if t < VOCAB - 2)


def test_directory_without_tokenizer_takes_token_ids(tmp_path):
    hf = make_hf_model("llama")
    hf.save_pretrained(tmp_path)  # config and weights only
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    expected = LLM(hf, dtype="float32", device="cpu").generate([[1, 2, 3]], params)[0].token_ids
    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    assert llm.tokenizer is None
    assert llm.generate([[1, 2, 3]], params)[0].token_ids == expected
    with pytest.raises(ValueError, match="token ids"):
        llm.generate(["some text"], params)


# --- 4. unsupported models ---------------------------------------------------------------------

TINY_OTHER = {
    "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64),
    "gemma": lambda: GemmaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    ),
}


@pytest.mark.parametrize("model_type", TINY_OTHER)
def test_unsupported_architecture_names_its_model_type(model_type, tmp_path):
    config = TINY_OTHER[model_type]()
    with pytest.raises(ValueError, match=f"model_type '{model_type}' is not supported"):
        LLM(AutoModelForCausalLM.from_config(config), device="cpu")
    config.save_pretrained(tmp_path)  # a config alone: the check must come before any weights load
    with pytest.raises(ValueError, match=f"model_type '{model_type}' is not supported"):
        LLM(str(tmp_path), device="cpu")


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64},
    ],
)
def test_unsupported_rope_type_is_named(rope):
    with pytest.raises(ValueError, match=f"rope_type '{rope['rope_type']}'.*not supported"):
        ModelConfig.from_hf(LlamaConfig(**SMALL, rope_parameters=rope))


# --- 5. hub names without a hub, and missing paths ---------------------------------------------

HUB_NAME = "HuggingFaceTB/SmolLM2-135M"


@pytest.fixture
def empty_hub_cache(monkeypatch, tmp_path):
    """A hub cache with nothing in it, so a model cached on this machine cannot make a test pass."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return constants


def assert_fails_fast_with_tiny_hint(seconds: float = 5.0):
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"LLM\('tiny'\)") as err:
        LLM(HUB_NAME, device="cpu")
    assert HUB_NAME in str(err.value)
    assert time.monotonic() - start < seconds


def test_hub_name_with_hf_hub_offline(empty_hub_cache, monkeypatch):
    monkeypatch.setattr(empty_hub_cache, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    assert_fails_fast_with_tiny_hint()


def test_hub_name_with_the_hub_unreachable(empty_hub_cache, monkeypatch):
    """No HF_HUB_OFFLINE: the loader itself must notice within seconds (huggingface_hub alone
    retries for about 30 s) that nothing answers; here the endpoint is a closed local port."""
    monkeypatch.setattr(empty_hub_cache, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(empty_hub_cache, "ENDPOINT", "http://127.0.0.1:9")
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert_fails_fast_with_tiny_hint()


def test_hub_probe_gives_up_on_a_hanging_connection(monkeypatch):
    """A network that drops packets (or a DNS server that never answers) counts as offline."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def hang(*args, **kwargs):
        time.sleep(10)
        raise TimeoutError

    monkeypatch.setattr("minillm.models.loader.socket.create_connection", hang)
    start = time.monotonic()
    assert _hub_offline(timeout=0.3)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("path", ["./no/such/model", "/no/such/model", "no/such/model"])
def test_missing_local_path_is_named(path):
    with pytest.raises(ValueError, match=f"{path!r} is neither an existing local path nor a hub name"):
        LLM(path, device="cpu")


# --- 6. the built-in offline model -------------------------------------------------------------


def test_tiny_is_deterministic_and_needs_no_files():
    a, b = LLM("tiny", device="cpu"), LLM("tiny", device="cpu")
    state_a, state_b = a.model.state_dict(), b.model.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert isinstance(a.tokenizer, ByteTokenizer)
    assert a.config.vocab_size == ByteTokenizer.vocab_size


def test_tiny_text_round_trips_through_the_byte_tokenizer():
    llm = LLM("tiny", device="cpu")
    text = "The KV cache — naïve, 日本語 ✓"
    ids = llm.encode(text)
    assert ids[0] == ByteTokenizer.bos_token_id and len(ids) == 1 + len(text.encode("utf-8"))
    assert llm.tokenizer.decode(ids) == text
    out = llm.generate([text], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8
    assert out.text == llm.tokenizer.decode(out.token_ids)


def test_tiny_is_the_llama_transformers_draws_for_its_config_under_seed_0():
    """minillm builds "tiny" itself (``minillm.models.tiny``), yet it is, bit for bit, the model
    transformers draws for the same config: the twin that comparisons with transformers load holds
    the same weights either way, and the course's tiny did not change when it stopped going
    through transformers. Fails if a transformers release draws its initial weights differently."""
    from transformers import LlamaForCausalLM

    from minillm.models.loader import checkpoint_eos_token_ids, load_hf_model
    from minillm.models.tiny import tiny_config, tiny_hf_config, tiny_state_dict

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        drawn = LlamaForCausalLM(tiny_hf_config())
    ours = tiny_state_dict()
    assert drawn.state_dict().keys() == ours.keys()
    unequal = [k for k, t in drawn.state_dict().items() if not torch.equal(t, ours[k])]
    assert not unequal, f"transformers draws other weights for {unequal[:3]}...: tiny is now minillm's own"
    assert ModelConfig.from_hf(tiny_hf_config()) == tiny_config()
    llm = LLM("tiny", device="cpu")
    assert llm.model.eos_token_ids == checkpoint_eos_token_ids(drawn) == (llm.tokenizer.eos_token_id,)
    twin, _ = load_hf_model("tiny", torch.float32)
    assert all(torch.equal(t, ours[k]) for k, t in twin.state_dict().items())


def test_tiny_is_built_without_importing_transformers():
    """Importing transformers' Llama costs seconds in every new process: a notebook kernel, and each
    chapter's grader, which builds its own "tiny" at every run."""
    code = (
        "import sys; from minillm import LLM, SamplingParams; "
        "LLM('tiny').generate('hi', SamplingParams(max_tokens=2)); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
