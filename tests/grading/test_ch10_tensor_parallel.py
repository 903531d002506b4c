"""Grading tests for chapter 10 (``split_mlp``, ``shard_forward``, ``all_reduce`` and ``parallel_mlp``:
the Megatron split of one MLP layer).

The learner's functions run in a child process (``minillm.course.sandbox``): the ``run_*`` probes
rebuild the layer there from its config and weights, call the learner's code and return plain data
(a shard as a dict of its tensors). Every check happens here, in float64, against the layer unsplit
(``minillm.models.llama.MLP``) and against the slices the contract names. Each test looks at one
part: the cut of gate/up, the cut of down_proj, the same channels for one rank in all three, one
rank's SwiGLU, the all-reduce, the ranks' partials put together, down_proj's bias, a size that does
not divide, and the whole round trip. The tests of ``shard_forward`` and ``parallel_mlp`` hand them
shards cut here, without down_proj's bias, so that they grade those functions alone, whatever the
learner's design does with the bias; only the bias test and the round trip go through the learner's
own ``split_mlp``.
"""

import re
from functools import cache

import pytest
import torch
import torch.nn.functional as F

from minillm.course.sandbox import LearnerProcess, type_name
from minillm.models.llama import MLP, ModelConfig

# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "*": (
        "The idea: SwiGLU works on each intermediate channel by itself, so each rank can own some channels: their "
        "rows of gate and up, and the columns of down that read them; the ranks' products then add up to the layer's."
    ),
    "split": (
        "The idea: rank r owns the r-th equal slice of the intermediate channels, and keeps whatever each weight "
        "holds of those channels: rows of gate_proj and up_proj (and their biases), columns of down_proj."
    ),
    "shard_forward": (
        "The idea: a rank runs the layer's own formula, down(silu(gate(x)) * up(x)), with its slices in place of "
        "the whole weights."
    ),
    "all_reduce": "The idea: after an all-reduce every rank holds the same tensor: the sum of what every rank put in.",
    "parallel_mlp": (
        "The idea: every rank computes its partial output from the whole input; the all-reduce adds them up, and "
        "down_proj's bias, which belongs to the whole sum, is added once."
    ),
}
HIDDEN, INTERMEDIATE = 8, 24  # 24 channels: split in 1, 2, 3, 4, 6, 8, 12 or 24 ranks, not in 5, 7 or 16
FIELDS = ("gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias", "down_bias")
TOLERANCE = 1e-10  # float64: a sum taken in another order agrees to ~1e-15


@pytest.fixture(scope="module")
def ch10():
    with LearnerProcess("ch10_tensor_parallel") as learner:
        yield learner


def config(bias: bool) -> ModelConfig:
    """A small Llama's config; only the MLP's numbers matter here."""
    return ModelConfig(
        model_type="llama",
        vocab_size=32,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        qkv_bias=False,
        o_proj_bias=False,
        mlp_bias=bias,
        qk_norm=False,
        tie_word_embeddings=False,
    )


@cache
def layer(bias: bool, seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A random float64 MLP layer, as its config and weights (a probe rebuilds it from them). The biases
    are of the weights' size, so a bias added twice, or not at all, is plain to see."""
    g = torch.Generator().manual_seed(seed)
    names = MLP(config(bias)).state_dict()
    state = {n: torch.randn(t.shape, generator=g, dtype=torch.float64) * 0.5 for n, t in names.items()}
    return config(bias), state


def build_mlp(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> MLP:
    """The layer, in float64, from ``layer``'s config and weights (copied in: the layer owns its tensors)."""
    mlp = MLP(cfg).to(torch.float64)
    mlp.load_state_dict(state)
    return mlp


def inputs(num_tokens: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(num_tokens, HIDDEN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- probes: these run in the learner's process ------------------------------------------------
def run_split(ch10, cfg, state, tp_size):
    """The learner's shards as dicts of their fields, or what ``split_mlp`` returned when not a list."""
    shards = ch10.split_mlp(build_mlp(cfg, state), tp_size)
    if not isinstance(shards, list | tuple):
        return shards
    return [{f: getattr(s, f, None) for f in FIELDS} if isinstance(s, ch10.MLPShard) else s for s in shards]


def run_split_error(ch10, cfg, state, tp_size):
    """The message of the ValueError ``split_mlp`` raised, or None when it raised none."""
    try:
        ch10.split_mlp(build_mlp(cfg, state), tp_size)
    except ValueError as err:
        return str(err)
    return None


def run_shard_forward(ch10, shards, x):
    return [ch10.shard_forward(ch10.MLPShard(**fields), x) for fields in shards]


def run_all_reduce(ch10, partials):
    return ch10.all_reduce(partials)


def run_parallel(ch10, shards, x):
    return ch10.parallel_mlp([ch10.MLPShard(**fields) for fields in shards], x)


def run_split_then_parallel(ch10, cfg, state, tp_size, x):
    return ch10.parallel_mlp(ch10.split_mlp(build_mlp(cfg, state), tp_size), x)


# --- checks: these run here --------------------------------------------------------------------
def split(ch10, bias: bool, n: int) -> list[dict]:
    """The learner's ``split_mlp(mlp, n)`` of ``layer(bias)``, checked to be ``n`` shards."""
    got = ch10.call(run_split, *layer(bias), n)
    assert isinstance(got, list | tuple) and len(got) == n, (
        f"split_mlp(mlp, tp_size={n}) returned {type_name(got)}"
        f"{f' of {len(got)}' if isinstance(got, list | tuple) else ''}: expected a list of {n} MLPShard, rank 0's first"
    )
    for rank, shard in enumerate(got):
        assert isinstance(shard, dict) and "unsupported type" not in shard, (
            f"split_mlp(mlp, tp_size={n}): rank {rank}'s shard is {type_name(shard)}, not an MLPShard"
        )
    return got


def block_of(t, full: torch.Tensor, dim: int, n: int) -> int | None:
    """Which of the ``n`` equal slices of ``full`` along ``dim`` the tensor ``t`` is, if any."""
    if not isinstance(t, torch.Tensor) or t.dtype != full.dtype:
        return None
    for b, piece in enumerate(full.chunk(n, dim)):
        if t.shape == piece.shape and torch.equal(t, piece):
            return b
    return None


def channels(block: int | None, n: int) -> str:
    step = INTERMEDIATE // n
    return "not one slice of the channels" if block is None else f"channels [{block * step}, {(block + 1) * step})"


def reference_shards(state: dict[str, torch.Tensor], n: int) -> list[dict]:
    """The layer cut as the contract says, rank 0's first, with down_proj's bias on no shard: a test
    that hands these to the learner's code grades it whatever the learner's design does with that bias."""

    def pieces(name: str, dim: int) -> list:
        return [p.clone() for p in state[name].chunk(n, dim)] if name in state else [None] * n

    cut = {
        "gate_weight": pieces("gate_proj.weight", 0),
        "up_weight": pieces("up_proj.weight", 0),
        "down_weight": pieces("down_proj.weight", 1),
        "gate_bias": pieces("gate_proj.bias", 0),
        "up_bias": pieces("up_proj.bias", 0),
    }
    return [{field: cut[field][rank] for field in cut} | {"down_bias": None} for rank in range(n)]


def swiglu(shard: dict, x: torch.Tensor, silu_of: str = "gate") -> torch.Tensor:
    """One rank's partial output; ``silu_of`` picks where silu goes ("gate" is right)."""
    gate = F.linear(x, shard["gate_weight"], shard["gate_bias"])
    up = F.linear(x, shard["up_weight"], shard["up_bias"])
    h = {
        "gate": F.silu(gate) * up,
        "the product": F.silu(gate * up),
        "up": gate * F.silu(up),
        "nothing": gate * up,
    }[silu_of]
    return F.linear(h, shard["down_weight"])


def close(got, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and got.dtype == want.dtype
        and torch.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    )


def assert_close(got, want: torch.Tensor, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: got {type_name(got)}, not a tensor"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}, the layer's"
    assert close(got, want), f"{what}: off by up to {(got - want).abs().max().item():.3g}"


@pytest.mark.hint(
    "gate_proj and up_proj are column-parallel: each rank keeps a slice of their OUTPUT features, rows of the "
    "[out_features, in_features] weight (and the same slice of their biases), with every input feature "
    "(hidden_size) on every rank."
)
def test_split_cuts_gate_and_up_by_their_output_features(ch10):
    _, state = layer(bias=True)
    for n in (2, 3, 4):
        for rank, shard in enumerate(split(ch10, True, n)):
            for proj in ("gate", "up"):
                weight, full = shard[f"{proj}_weight"], state[f"{proj}_proj.weight"]
                where = f"tp_size={n}: rank {rank}'s {proj}_weight"
                assert isinstance(weight, torch.Tensor), f"{where} is {type_name(weight)}, not a tensor"
                want = (INTERMEDIATE // n, HIDDEN)
                assert tuple(weight.shape) == want, (
                    f"{where} has shape {tuple(weight.shape)}, expected {want}, [intermediate_size / tp_size, "
                    "hidden_size]"
                    + (
                        ": it keeps every output feature and cuts the input features"
                        if weight.shape[:1] == (INTERMEDIATE,)
                        else ""
                    )
                )
                assert weight.dtype == full.dtype, f"{where} is {weight.dtype}: keep the layer's dtype, {full.dtype}"
                block = block_of(weight, full, 0, n)
                assert block is not None, (
                    f"{where} is not one of the {n} equal slices of {proj}_proj.weight's rows (its output features)"
                )
                bias, full_bias = shard[f"{proj}_bias"], state[f"{proj}_proj.bias"]
                bias_block = block_of(bias, full_bias, 0, n)
                assert bias_block == block, (
                    f"{where} holds {channels(block, n)}, but its {proj}_bias is "
                    + ("None" if bias is None else f"{channels(bias_block, n)} of {proj}_proj.bias")
                    + f": a rank keeps the bias of the output features it keeps, {channels(block, n)}"
                )


@pytest.mark.hint(
    "down_proj is row-parallel: each rank keeps the INPUT features of its [hidden_size, intermediate_size] "
    "weight (columns) that read the rank's channels, with every output feature (hidden_size) on every rank."
)
def test_split_cuts_down_proj_by_its_input_features(ch10):
    _, state = layer(bias=True)
    full = state["down_proj.weight"]
    for n in (2, 3, 4):
        for rank, shard in enumerate(split(ch10, True, n)):
            weight, where = shard["down_weight"], f"tp_size={n}: rank {rank}'s down_weight"
            assert isinstance(weight, torch.Tensor), f"{where} is {type_name(weight)}, not a tensor"
            want = (HIDDEN, INTERMEDIATE // n)
            assert tuple(weight.shape) == want, (
                f"{where} has shape {tuple(weight.shape)}, expected {want}, [hidden_size, intermediate_size / "
                "tp_size]"
                + (
                    ": it keeps every input feature and cuts the output features"
                    if weight.shape[-1:] == (INTERMEDIATE,)
                    else ""
                )
            )
            assert weight.dtype == full.dtype, f"{where} is {weight.dtype}: keep the layer's dtype, {full.dtype}"
            assert block_of(weight, full, 1, n) is not None, (
                f"{where} is not one of the {n} equal slices of down_proj.weight's columns (its input features)"
            )


@pytest.mark.hint(
    "One rank, one set of channels: rank r's rows of gate_proj and of up_proj and its columns of down_proj must "
    "all be the same channels, rank r's own, the r-th slice in rank order (silu(gate) * up pairs channel c of "
    "gate with channel c of up, and down_proj's column c reads it)."
)
def test_split_gives_each_rank_the_same_channels_in_every_weight(ch10):
    _, state = layer(bias=True)
    for n in (2, 3, 4):
        for rank, shard in enumerate(split(ch10, True, n)):
            blocks = {
                "gate_proj rows": block_of(shard["gate_weight"], state["gate_proj.weight"], 0, n),
                "up_proj rows": block_of(shard["up_weight"], state["up_proj.weight"], 0, n),
                "down_proj columns": block_of(shard["down_weight"], state["down_proj.weight"], 1, n),
            }
            assert all(b == rank for b in blocks.values()), (
                f"tp_size={n}: rank {rank} holds "
                + ", ".join(f"{what} of {channels(b, n)}" for what, b in blocks.items())
                + f": all three must be rank {rank}'s own, {channels(rank, n)}"
            )


@pytest.mark.hint(
    "A rank computes the layer's formula on its own channels: down(silu(gate(x)) * up(x)) with its slices, "
    "silu on the gate's output alone (biases included), before the product with up's."
)
def test_shard_forward_is_swiglu_on_the_ranks_channels(ch10):
    _, state = layer(bias=True)
    x = inputs(5)
    for n in (1, 2, 4):
        shards = reference_shards(state, n)
        got = ch10.call(run_shard_forward, shards, x)
        for rank, (mine, shard) in enumerate(zip(got, shards)):
            what = f"tp_size={n}: shard_forward of rank {rank}'s shard"
            wrong = [w for w in ("the product", "up", "nothing") if close(mine, swiglu(shard, x, silu_of=w))]
            assert not wrong, f"{what} applies silu to {wrong[0]}, not to the gate's output alone"
            assert_close(mine, swiglu(shard, x), what)


@pytest.mark.hint(
    "all_reduce gives every rank the elementwise SUM of all the ranks' partials: not one rank's partial, not "
    "their mean."
)
def test_all_reduce_sums_the_partials(ch10):
    g = torch.Generator().manual_seed(5)
    for n in (1, 2, 3, 4):
        partials = [torch.randn(5, HIDDEN, generator=g, dtype=torch.float64) for _ in range(n)]
        want = torch.stack(partials).sum(0)  # before the call: the learner's code may add into the partials
        got = ch10.call(run_all_reduce, [p.clone() for p in partials])
        what = f"all_reduce of {n} partials"
        if n > 1:
            assert not close(got, want / n), f"{what}: their mean, not their sum"
            assert not any(close(got, p) for p in partials), f"{what}: one rank's partial, not their sum"
        assert_close(got, want, what)


@pytest.mark.hint(
    "parallel_mlp needs every rank's partial: each rank computes its own from the whole x (shard_forward), "
    "and all_reduce adds them up. One rank's partial is only part of the layer's output."
)
def test_parallel_mlp_all_reduces_every_ranks_partial(ch10):
    cfg, state = layer(bias=False)
    x = inputs(5)
    with torch.no_grad():
        want = build_mlp(cfg, state)(x)
    for n in (1, 2, 4):
        shards = reference_shards(state, n)
        got = ch10.call(run_parallel, shards, x)
        what = f"parallel_mlp of a layer without biases in {n} shards (cut as split_mlp's contract says)"
        if n > 1:
            assert not any(close(got, swiglu(s, x)) for s in shards), f"{what}: one rank's partial, not their sum"
        assert_close(got, want, what)


@pytest.mark.points(2)
@pytest.mark.hint(
    "down_proj's bias belongs to the whole sum, so it reaches the output once: not in every rank's partial "
    "(the all-reduce would add it tp_size times), and not left out. Keep it on one shard, or add it after "
    "the all-reduce."
)
def test_parallel_mlp_adds_down_projs_bias_once(ch10):
    cfg, state = layer(bias=True)
    x = inputs(6, seed=2)
    with torch.no_grad():
        want = build_mlp(cfg, state)(x)
    bias = state["down_proj.bias"]
    for n in (1, 2, 3, 4):
        got = ch10.call(run_split_then_parallel, cfg, state, n, x)
        what = f"parallel_mlp(split_mlp(mlp, {n}), x) of a layer with biases"
        for times in range(2, n + 1):
            assert not close(got, want + (times - 1) * bias), f"{what}: down_proj's bias was added {times} times"
        assert not close(got, want - bias), f"{what}: down_proj's bias is missing"
        assert_close(got, want, what)


@pytest.mark.hint(
    "When tp_size does not divide intermediate_size, the ranks cannot get equal slices: raise ValueError, with a "
    "message that names tp_size and the intermediate size."
)
def test_split_refuses_a_tp_size_that_does_not_divide(ch10):
    for n in (5, 7, 16):
        message = ch10.call(run_split_error, *layer(bias=False), n)
        assert message is not None, (
            f"split_mlp(mlp, tp_size={n}) of a layer of intermediate_size {INTERMEDIATE} raised no ValueError"
        )
        assert re.search(rf"\b{n}\b", message) and re.search(rf"\b{INTERMEDIATE}\b", message), (
            f"split_mlp(mlp, tp_size={n}): the ValueError's message {message!r} must name tp_size ({n}) and the "
            f"intermediate size ({INTERMEDIATE})"
        )


@pytest.mark.hint(
    "parallel_mlp(split_mlp(mlp, n), x) must equal mlp(x) for every n that divides intermediate_size (1 and "
    "intermediate_size itself too), on a layer with biases and on one without (its biases are None)."
)
def test_split_then_parallel_equals_the_layer(ch10):
    for bias in (False, True):
        cfg, state = layer(bias, seed=3)
        mlp = build_mlp(cfg, state)
        for num_tokens in (1, 7):
            x = inputs(num_tokens, seed=4)
            with torch.no_grad():
                want = mlp(x)
            for n in (1, 2, 3, 8, INTERMEDIATE):
                got = ch10.call(run_split_then_parallel, cfg, state, n, x)
                where = "with" if bias else "without"
                assert_close(
                    got, want, f"parallel_mlp(split_mlp(mlp, {n}), x), x of {num_tokens} token(s), {where} biases"
                )
