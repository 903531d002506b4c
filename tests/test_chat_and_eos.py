"""``llm.chat`` (prompts in the model's chat template) and where EOS comes from (tokenizer,
generation config or config; one id or several). Tiny random Llamas built in code: no network."""

from __future__ import annotations

import pytest

from minillm import LLM, SamplingParams
from tests.hf_models import VOCAB, chat_tokenizer, make_hf_model, word_tokenizer

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def template_ids(conversation) -> list[int]:
    return chat_tokenizer().apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )


SYSTEM_USER = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w5"}]
USER = [{"role": "user", "content": "w7"}]


def test_chat_prompt_is_the_chat_template(chat_llama):
    out = chat_llama.chat(SYSTEM_USER, GREEDY)
    assert len(out) == 1
    ids = template_ids(SYSTEM_USER)
    assert ids[-1] == VOCAB - 3  # sanity: the template did run and ended with <|assistant|>
    assert out[0].prompt_token_ids == ids
    assert out[0].token_ids == chat_llama.generate([ids], GREEDY)[0].token_ids


def test_chat_batch_returns_outputs_in_order(chat_llama):
    outs = chat_llama.chat([SYSTEM_USER, USER], GREEDY)
    assert [o.request_id for o in outs] == ["0", "1"]
    assert [o.prompt_token_ids for o in outs] == [template_ids(SYSTEM_USER), template_ids(USER)]
    assert outs[1].token_ids == chat_llama.chat(USER, GREEDY)[0].token_ids


@pytest.mark.parametrize(
    "messages, error",
    [
        ([], "messages is empty"),
        ("w1 w2", "messages must be a list"),
        ([SYSTEM_USER, []], r"messages\[1\] is an empty conversation"),
        ([{"role": "user"}], r"messages\[0\] has no 'content'"),
        ([USER, [{"role": "user", "content": "w1"}, {"content": "w2"}]], r"messages\[1\]\[1\] has no 'role'"),
        ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] must be a string"),
        ([USER, "w1"], r"messages\[1\] must be a list of messages"),
    ],
)
def test_chat_rejects_bad_messages_and_keeps_the_last_outputs(chat_llama, messages, error):
    before = chat_llama.chat(USER, GREEDY)
    with pytest.raises(ValueError, match=error):
        chat_llama.chat(messages, GREEDY)
    assert chat_llama.last_outputs is before


def test_chat_needs_a_chat_template(tmp_path):
    with pytest.raises(ValueError, match="byte-level tokenizer.*no chat template.*llm.generate"):
        LLM("tiny", device="cpu").chat(USER)
    hf = make_hf_model("llama")
    with pytest.raises(ValueError, match="has no tokenizer.*llm.generate"):
        LLM(hf, dtype="float32", device="cpu").chat(USER)
    hf.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)  # a tokenizer, but no chat template
    with pytest.raises(ValueError, match="without a chat template"):
        LLM(str(tmp_path), dtype="float32", device="cpu").chat(USER)


# --- EOS -----------------------------------------------------------------------------------------

PROMPT = [5, 17, 3, 99, 42, 8]


def free_run(hf) -> list[int]:
    """The greedy tokens with no EOS at all; picks of its tokens become EOS in the tests below."""
    return (
        LLM(hf, dtype="float32", device="cpu")
        .generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0]
        .token_ids
    )


def run(hf, ignore_eos=False):
    return LLM(hf, dtype="float32", device="cpu").generate(
        [PROMPT], SamplingParams(max_tokens=12, ignore_eos=ignore_eos)
    )[0]


def stop_at(free: list[int], token: int) -> list[int]:
    return free[: free.index(token) + 1]


@pytest.fixture(scope="module")
def free_tokens():
    free = free_run(make_hf_model("llama"))
    distinct = list(dict.fromkeys(free))
    assert len(distinct) >= 3, f"the random model repeats itself too much for these tests: {free}"
    return free, distinct


def test_in_memory_model_stops_at_config_eos(free_tokens):
    free, distinct = free_tokens
    hf = make_hf_model("llama")
    hf.config.eos_token_id = distinct[1]  # the generation config still has none: the config is the fallback
    assert hf.generation_config.eos_token_id is None
    out = run(hf)
    assert out.finish_reason == "stop" and out.token_ids == stop_at(free, distinct[1])
    assert run(hf, ignore_eos=True).token_ids == free


def test_generation_config_list_stops_on_any_of_its_ids(free_tokens):
    free, distinct = free_tokens
    unused = next(t for t in range(VOCAB) if t not in free)
    hf = make_hf_model("llama")
    hf.config.eos_token_id = distinct[0]  # the generation config comes first: this one is not used
    hf.generation_config.eos_token_id = [distinct[2], distinct[1]]
    llm = LLM(hf, dtype="float32", device="cpu")
    assert llm.eos_token_ids == (distinct[2], distinct[1]) and llm.eos_token_id == distinct[2]
    params = SamplingParams(max_tokens=12)
    assert llm.generate([PROMPT], params)[0].token_ids == stop_at(free, distinct[1])  # the second id, met first
    hf.generation_config.eos_token_id = [unused, distinct[2]]
    assert run(hf).token_ids == stop_at(free, distinct[2])
    ignored = llm.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert ignored.token_ids == free and ignored.finish_reason == "length"


def test_tokenizer_eos_comes_first_and_the_checkpoints_join_it(tmp_path):
    hf = make_hf_model("llama")
    hf.generation_config.eos_token_id = [7, VOCAB - 1]
    hf.save_pretrained(tmp_path)
    chat_tokenizer().save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu")
    assert llm.eos_token_id == VOCAB - 1 and llm.eos_token_ids == (VOCAB - 1, 7)
