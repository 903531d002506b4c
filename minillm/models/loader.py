"""Where weights come from: the built-in ``"tiny"`` model, a hub name, a local path, or a
transformers model object already in memory. All four end the same way: a transformers state dict
moved into minillm's own ``CausalLM``."""

from __future__ import annotations

import os
import queue
import socket
import tempfile
import threading
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import getproxies

import torch

from minillm.models.download import PACKAGED_MODELS, cache_root, ensure_cached
from minillm.models.llama import CausalLM, ModelConfig, rope_cos_sin_cache
from minillm.models.tokenizer import ByteTokenizer, HFTokenizer

TINY = "tiny"
TINY_VERSION = 1  # raise when tiny_hf_config changes: saved weights of another shape are not reused
# Set by the grader for its own process: the marks never rest on a file that learner code could have
# written. (The learner's process may use it: a tampered file only makes its answers differ.)
FRESH_TINY_ENV = "MINILLM_GRADE_FRESH_TINY"

# The models the course suggests (minillm.course.model_choice.choose_model picks one): on a CPU the
# packaged SmolLM2-135M-Instruct (from the package index, offline after one download), on a GPU a hub
# name. Any other checkpoint of a supported family works too.
SUGGESTED_MODELS = {
    "cpu": "smollm2",
    "gpu": "Qwen/Qwen3-0.6B",
}


def tiny_hf_config():
    """A small Llama: 4 layers, hidden 256, grouped-query attention, byte-level vocabulary."""
    from transformers import LlamaConfig

    tok = ByteTokenizer()
    return LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )


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
    if name == TINY:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same random weights on every machine
            return LlamaForCausalLM(tiny_hf_config()), ByteTokenizer()
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


def tiny_weights_path() -> Path:
    """Where ``"tiny"``'s weights are kept once built: named by the torch and transformers versions
    that drew them, so a new version's initialisation is never mixed up with an old one's."""
    versions = "-".join(f"{pkg}{metadata.version(pkg)}" for pkg in ("torch", "transformers"))
    return cache_root() / f"tiny-v{TINY_VERSION}-{versions}.pt"


def load_tiny(dtype: torch.dtype, device: torch.device):
    """``"tiny"`` from its saved weights when a run before saved them: importing transformers costs
    seconds in every new process (each notebook kernel, each grader), building from the saved
    tensors a fraction of one. The first run builds it through transformers and saves it."""
    path = tiny_weights_path()
    try:
        saved = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError):  # not saved yet (or a partial file): build and save
        model, tokenizer = load_model(TINY, torch.float32, torch.device("cpu"), use_saved=False)  # as drawn
        saved = {"config": asdict(model.config), "state": model.state_dict(), "eos": list(model.eos_token_ids)}
        _save_atomically(saved, path)
        return model.to(device=device, dtype=dtype), tokenizer
    with torch.device("meta"):
        ours = CausalLM(ModelConfig(**saved["config"]))
    ours.load_state_dict(saved["state"], assign=True)
    with torch.device("cpu"):
        ours.model.rotary_emb.cos_sin_cache = rope_cos_sin_cache(ours.config)
    ours.eos_token_ids = tuple(saved["eos"])
    return ours.to(device=device, dtype=dtype).eval(), ByteTokenizer()


def _save_atomically(saved: dict, path: Path) -> None:
    """Write to a temporary file, then rename: a reader never sees half a file. A folder that cannot
    be written only means the next run builds ``"tiny"`` again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-tiny-", delete=False) as f:
            torch.save(saved, f)
        os.replace(f.name, path)
    except OSError:
        pass


def load_model(model, dtype: torch.dtype, device: torch.device, use_saved: bool = True):
    """Build minillm's ``CausalLM`` with the weights of ``model``; returns ``(model, tokenizer)``.

    The model is built on the meta device (no memory, no random init) and the transformers tensors
    are assigned into it, not copied: the only new memory is the cast to ``dtype``/``device``, at
    most one model's size. When the dtype and device already match, minillm's parameters share the
    transformers model's storage.
    """
    if use_saved and isinstance(model, str) and model == TINY and not os.environ.get(FRESH_TINY_ENV):
        return load_tiny(dtype, device)
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
