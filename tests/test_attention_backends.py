"""The attention package: every backend meets the contract the model calls, and the chapter modules
still hand out the very same classes (notebooks and exercises import them from there)."""

from __future__ import annotations

import torch

from minillm.attention import (
    AttentionBackend,
    ContiguousKVCache,
    DecodeBatchKVCache,
    PaddedKVCache,
    RaggedKVCache,
)
from minillm.models.llama import ModelConfig

CPU = torch.device("cpu")


def _config() -> ModelConfig:
    return ModelConfig(
        model_type="llama",
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        qkv_bias=False,
        o_proj_bias=False,
        mlp_bias=False,
        qk_norm=False,
        tie_word_embeddings=True,
    )


def test_every_backend_satisfies_the_protocol():
    cfg = _config()
    caches = [ContiguousKVCache(cfg, 8, torch.float32, CPU) for _ in range(2)]
    backends = [
        caches[0],
        PaddedKVCache(cfg, torch.tensor([0, 2]), 8, torch.float32, CPU),
        DecodeBatchKVCache(caches),
        RaggedKVCache(caches, [0, 3, 4]),
    ]
    for backend in backends:
        assert isinstance(backend, AttentionBackend), type(backend).__name__
    assert not isinstance(object(), AttentionBackend)


def test_old_import_paths_give_the_same_classes():
    from minillm.attention.contiguous import ContiguousKVCache as from_ch1
    from minillm.engines.continuous import DecodeBatchKVCache as from_ch3
    from minillm.engines.selective import RaggedKVCache as from_ch4
    from minillm.engines.static import PaddedKVCache as from_ch2

    assert from_ch1 is ContiguousKVCache
    assert from_ch2 is PaddedKVCache
    assert from_ch3 is DecodeBatchKVCache
    assert from_ch4 is RaggedKVCache
    for cls, module in [
        (ContiguousKVCache, "contiguous"),
        (PaddedKVCache, "padded"),
        (DecodeBatchKVCache, "decode_batch"),
        (RaggedKVCache, "ragged"),
    ]:
        assert cls.__module__ == f"minillm.attention.{module}"  # one definition, in the package
