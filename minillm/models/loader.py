"""Where weights come from: the built-in ``"tiny"`` model (``minillm.models.tiny``), a hub name, a
local path, or a transformers model object already in memory. The last three end the same way: a
transformers state dict moved into minillm's own ``CausalLM``."""

from __future__ import annotations

import os
import queue
import socket
import threading
from urllib.parse import urlsplit
from urllib.request import getproxies

import torch

from minillm.models.download import PACKAGED_MODELS, ensure_cached
from minillm.models.llama import CausalLM, ModelConfig, rope_cos_sin_cache
from minillm.models.tiny import build_tiny, tiny_hf_config, tiny_state_dict
from minillm.models.tokenizer import ByteTokenizer, HFTokenizer

TINY = "tiny"

# The models the course suggests (minillm.course.model_choice.choose_model picks one): on a CPU the
# packaged SmolLM2-135M-Instruct (from the package index, offline after one download), on a GPU a hub
# name. Any other checkpoint of a supported family works too.
SUGGESTED_MODELS = {
    "cpu": "smollm2",
    "gpu": "Qwen/Qwen3-0.6B",
}


def load_hf_model(model, dtype: torch.dtype):
    """Return ``(transformers model, tokenizer or None)`` for any accepted ``model`` argument."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM, PreTrainedModel

    if isinstance(model, PreTrainedModel):
        ModelConfig.from_hf(model.config)  # fail early on an unsupported family
        return model, None
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(
            f"model must be 'tiny', a hub name, a local path or a transformers model, got {type(model).__name__}"
        )
    name = str(model)
    if name == TINY:  # transformers' twin of minillm's "tiny": its architecture, tiny's weights
        with torch.random.fork_rng(devices=[]):  # its own random init, overwritten: leave the global stream be
            hf_model = LlamaForCausalLM(tiny_hf_config())
        hf_model.load_state_dict(tiny_state_dict())
        return hf_model, ByteTokenizer()
    if name in PACKAGED_MODELS:  # e.g. "smollm2": downloaded and converted once, then a local folder
        name = str(ensure_cached(name))
    local = os.path.exists(name)
    if not local:
        _check_repo_id(name)
    offline = not local and _hub_offline()
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=offline)
    except (OSError, ValueError) as err:
        if offline:
            reason = "the Hugging Face hub is not reachable and the model is not in the local cache"
        else:
            reason = (
                f"it could not be loaded as a {'local path' if local else 'hub name'} ({type(err).__name__}: {err})"
            )
        raise ValueError(
            f"model {name!r}: {reason}. Without network access, use the built-in offline model: LLM('tiny')."
        ) from err
    ModelConfig.from_hf(config)  # before downloading gigabytes of an unsupported model
    hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=offline)
    return hf_model, _load_tokenizer(name, offline)


def _check_repo_id(name: str) -> None:
    """A name that is no existing path must be a hub name: a mistyped './models/x' gets its own message."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as err:
        raise ValueError(f"model {name!r} is neither an existing local path nor a hub name like 'org/model'") from err


def _hub_offline(timeout: float = 3.0) -> bool:
    """True when HF_HUB_OFFLINE is set or the hub (or the proxy in front of it) does not answer
    within ``timeout`` seconds; then only the local cache is used. Without this check, an offline
    machine spends half a minute or more in huggingface_hub's retries before failing."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    url = urlsplit(constants.ENDPOINT)
    proxy = getproxies().get(url.scheme)
    target = urlsplit(proxy) if proxy else url
    if not target.hostname:
        return False  # a proxy setting we cannot read: let huggingface_hub try
    port = target.port or (443 if target.scheme == "https" else 80)
    reached = queue.SimpleQueue()

    def connect():
        try:
            socket.create_connection((target.hostname, port), timeout=timeout).close()
            reached.put(True)
        except OSError:
            reached.put(False)

    # In a thread, so that a hanging DNS lookup cannot stall us either.
    threading.Thread(target=connect, daemon=True).start()
    try:
        return not reached.get(timeout=timeout)
    except queue.Empty:
        return True


# Any one of these marks a directory that carries a tokenizer; save_pretrained on a model writes none.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _load_tokenizer(name: str, offline: bool) -> HFTokenizer | None:
    """The checkpoint's tokenizer, or None for a weights-only directory (prompts are then token ids)."""
    from transformers import AutoTokenizer

    if os.path.isdir(name) and not any(os.path.exists(os.path.join(name, f)) for f in TOKENIZER_FILES):
        return None
    return HFTokenizer(AutoTokenizer.from_pretrained(name, local_files_only=offline))


def load_model(model, dtype: torch.dtype, device: torch.device):
    """Build minillm's ``CausalLM`` with the weights of ``model``; returns ``(model, tokenizer)``.

    ``"tiny"`` is built directly, without transformers. Any other model is built on the meta device
    (no memory, no random init) and the transformers tensors are assigned into it, not copied: the
    only new memory is the cast to ``dtype``/``device``, at most one model's size. When the dtype and
    device already match, minillm's parameters share the transformers model's storage.
    """
    if isinstance(model, str) and model == TINY:
        return build_tiny(dtype, device)
    hf_model, tokenizer = load_hf_model(model, dtype)
    cfg = ModelConfig.from_hf(hf_model.config)
    with torch.device("meta"):
        ours = CausalLM(cfg)
    state = {k: v for k, v in hf_model.state_dict().items() if "rotary_emb" not in k}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = ours.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"weights do not match minillm's {cfg.model_type} model: missing {missing}, unexpected {unexpected}"
        )
    if cfg.tie_word_embeddings:
        ours.lm_head.weight = ours.model.embed_tokens.weight  # assign replaced the tied parameter
    with torch.device("cpu"):  # computed in float32 on the CPU, as __init__ does, then cast below
        ours.model.rotary_emb.cos_sin_cache = rope_cos_sin_cache(cfg)
    on_meta = [name for name, t in (*ours.named_parameters(), *ours.named_buffers()) if t.is_meta]
    if on_meta:  # a tensor neither the checkpoint nor the loader filled in
        raise RuntimeError(f"minillm's {cfg.model_type} model has tensors without values after loading: {on_meta}")
    ours.eos_token_ids = checkpoint_eos_token_ids(hf_model)
    return ours.to(device=device, dtype=dtype).eval(), tokenizer


def checkpoint_eos_token_ids(hf_model) -> tuple[int, ...]:
    """The ids that end a sequence according to the checkpoint: its generation config's
    ``eos_token_id``, else its config's. Either may be one id or a list (Llama 3 and Qwen chat
    models list several: end of turn and end of text)."""
    generation_config = getattr(hf_model, "generation_config", None)
    for source in (generation_config, hf_model.config):
        ids = as_token_ids(getattr(source, "eos_token_id", None))
        if ids:
            return ids
    return ()


def as_token_ids(value) -> tuple[int, ...]:
    """``None``, one id or a list of ids, as a tuple of ids."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(t) for t in value)
