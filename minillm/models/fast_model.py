"""Chapter 9's fast path for the model: the same decoder as ``minillm.models.llama``, with its weights
laid out for speed. The readable model stays what the chapters teach; this one computes the same
function (the same greedy tokens, tested) in fewer, faster calls.

Six steps, each an option so chapter 9 can measure what each one buys (``FAST_PATH_STEPS``):

- ``"fused"``: q, k and v read the same input, and so do the MLP's gate and up projections, so
  their weights are concatenated once, at load, and each group runs as one matmul whose output is
  split (vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear``; nano-vllm does the same).
  Fewer, larger matmuls: each reads its input once, and one call replaces three.
- ``"prepacked"`` (CPU only): every matmul through oneDNN with its weight reordered once into
  oneDNN's blocked layout, so no call repacks the weight (vLLM's CPU backend does this through
  ``create_onednn_mm``; PyTorch exposes the same library as ``torch.ops.mkldnn``). A decode step's
  matmuls have a few rows each, so repacking a weight per call costs as much as the product. The
  packed copies are kept beside the model's own weights (which the readable engines still use): on
  the CPU the fast path holds the weights twice.
- ``"cpu_attention"`` (CPU, float32): the paged engines attend through the ``"cpu"`` backend, whose
  decodes run in a C kernel that reads the KV blocks in place (``minillm.kernels.cpu_attention``)
  instead of gathering them into a copy in every layer, and whose prompts attend in a tiled C kernel
  that skips the masked half of their scores. It is the runner's step, not the model's: the
  attention backend is the runner's choice.
- ``"cpu_ops"`` (CPU, float32): the small ops between the matmuls in C, one pass each
  (``minillm.kernels.cpu_ops``): RMSNorm, the skip connection added inside the next norm (vLLM's
  ``fused_add_rms_norm``: each layer hands on its output and the residual stream unsummed), the
  rotary embedding on q and k in place, SiLU-and-multiply. A few calls a layer instead of some thirty:
  less dispatch at one token, fewer passes over memory at thousands.
- ``"cpu_gemv"`` (CPU, float32): a matmul of at most ``gemv_max_rows()`` tokens (a decode step of a
  few requests, a server's usual step) in a C loop that streams the weights from memory
  (``minillm.kernels.cpu_ops.linear_few_rows``): with few rows a matmul is two flops per weight
  read per row, and on an AVX2 CPU oneDNN's kernel kept pace with the weights' stream worse than this
  loop up to 16 rows (on an AVX-512 one up to 2: ``GEMV_MAX_ROWS``).
- ``"compiled"`` (any device; the GPU's choice): ``cpu_ops``'s four ops written in PyTorch and
  compiled by ``torch.compile`` (``minillm.models.compiled_ops``), a kernel each where eager PyTorch
  launches several. ``cpu_ops`` and ``compiled`` are two ways to the same ops: a model takes one.

``fast_path=True`` takes every step the device can, minus ``compiled`` on a CPU, where the C ops do
its work and the compiled ones bought nothing (``results/bench_cpu_smollm2_compiled.json``; README):
a CPU gets ``fused``, ``prepacked``, ``cpu_attention``, ``cpu_ops``, ``cpu_gemv``; a GPU ``fused`` and
``compiled``.

``FastCausalLM(model, steps)`` (``steps`` from ``MODEL_STEPS``) shares the model's embeddings and
norms and has the model's interface (``config``, ``forward(input_ids, positions, kv_cache)``, ``compute_logits``).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from minillm.attention.causal import causal_attention
from minillm.kernels import cpu_build, cpu_ops
from minillm.models import compiled_ops
from minillm.models.llama import CausalLM, apply_rope

FAST_PATH_STEPS = ("fused", "prepacked", "cpu_attention", "cpu_ops", "cpu_gemv", "compiled")
MODEL_STEPS = ("fused", "prepacked", "cpu_ops", "cpu_gemv", "compiled")  # the steps FastCausalLM takes
PREPACK_DTYPES = (torch.float32, torch.bfloat16)  # what oneDNN's linear takes
PREPACK_BATCH_HINT = 32  # the rows oneDNN lays a packed weight out for (any count runs; vLLM passes 32)
# cpu_gemv's matmuls take steps of up to this many tokens, by the CPU's widest vectors (torch's name
# for them): on an AVX2 CPU the C loop beat oneDNN's prepacked matmul up to 16 rows with the weights
# cold (linear_few_rows.c has the figures); on an AVX-512 one it won at one and two rows and lost from
# three on (python -m minillm.benchmarks.gemv_rows: results/gemv_rows_smollm2_avx512.json).
GEMV_MAX_ROWS = {"AVX2": 16, "AVX512": 2}


def gemv_max_rows() -> int:
    """The most rows ``cpu_gemv`` takes on this CPU (3 on a CPU of neither kind: not measured)."""
    return GEMV_MAX_ROWS.get(torch.backends.cpu.get_cpu_capability(), 3)


def check_fast_path(fast_path) -> None:
    """``fast_path`` is True (every step), False (the readable model), or a list of ``FAST_PATH_STEPS``."""
    if isinstance(fast_path, bool):
        return
    if isinstance(fast_path, (list, tuple)) and all(s in FAST_PATH_STEPS for s in fast_path):
        if "cpu_ops" in fast_path and "compiled" in fast_path:
            raise ValueError("fast_path: 'cpu_ops' and 'compiled' run the same ops two ways; take one of them")
        return
    raise ValueError(f"fast_path must be True, False or a list of steps from {FAST_PATH_STEPS}, got {fast_path!r}")


def fast_path_steps(fast_path, device: torch.device, dtype: torch.dtype) -> tuple[str, ...]:
    """The steps ``fast_path`` asks for that this device and dtype can take (``True``: all of them, but
    ``compiled`` only off the CPU)."""
    on_cpu = torch.device(device).type == "cpu"
    if fast_path is True:
        steps = tuple(s for s in FAST_PATH_STEPS if not (on_cpu and s == "compiled"))
    else:
        steps = tuple(fast_path or ())
    # a C compiler, which builds the C kernels (on first use) and the C++ inductor writes on a CPU
    compiler = on_cpu and cpu_build.unavailable_reason() is None
    can = {
        "fused": True,
        "prepacked": on_cpu and dtype in PREPACK_DTYPES and torch.backends.mkldnn.is_available(),
        "compiled": compiler if on_cpu else importlib.util.find_spec("triton") is not None,  # Triton on a GPU
    }
    # where the C kernels cannot run, the PyTorch code stays
    can["cpu_attention"] = can["cpu_ops"] = can["cpu_gemv"] = compiler and dtype == cpu_build.DTYPE
    return tuple(s for s in steps if can[s])


class Linear:
    """``y = x @ weight.T + bias`` for ``parts``, the (weight, bias) pairs of layers that read the same
    input: one pair, or several stacked by output feature (``fused``), their outputs side by side.
    With ``prepack`` the stacked weight is prepacked for oneDNN; with ``gemv``, a call of at most
    ``gemv_max_rows()`` rows runs the C loop over the parts themselves (the model's own tensors: no copy)."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor | None]], prepack: bool, gemv: bool = False):
        parts = [(w.detach(), None if b is None else b.detach()) for w, b in parts]
        weight = parts[0][0] if len(parts) == 1 else torch.cat([w for w, _ in parts])
        self.bias = None if parts[0][1] is None else torch.cat([b for _, b in parts])
        self.gemv_parts, self.gemv_max_rows = (parts if gemv else None), gemv_max_rows()
        if prepack:
            self.weight = None
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PREPACK_BATCH_HINT)
        else:
            self.weight, self.packed = weight, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, rows = x.shape[:-1], x.reshape(-1, x.shape[-1])
        if self.gemv_parts is not None and rows.shape[0] <= self.gemv_max_rows:
            y = cpu_ops.linear_few_rows(rows, self.gemv_parts)
        elif self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        else:
            y = F.linear(rows, self.weight, self.bias)
        return y.view(*lead, y.shape[-1])


class FastLayer:
    """One decoder layer: the model's norms, its projections as ``Linear``s (fused or not)."""

    def __init__(self, layer, fused: bool, prepack: bool, gemv: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.layer_idx, self.num_heads, self.num_kv_heads, self.head_dim = (
            attn.layer_idx,
            attn.num_heads,
            attn.num_kv_heads,
            attn.head_dim,
        )
        q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        self.qkv_sizes, self.intermediate = (q, kv, kv), mlp.gate_proj.out_features

        def linears(*modules):  # one Linear for all of them when fused, else one each
            groups = [modules] if fused else [(m,) for m in modules]
            return [Linear([(m.weight, m.bias) for m in group], prepack, gemv) for group in groups]

        self.qkv, self.gate_up = linears(attn.q_proj, attn.k_proj, attn.v_proj), linears(mlp.gate_proj, mlp.up_proj)
        (self.o_proj,), (self.down_proj,) = linears(attn.o_proj), linears(mlp.down_proj)

    def __call__(self, x, cos, sin, kv_cache):
        """The readable layer's order: ``x`` in, ``x`` plus attention plus MLP out."""
        h = self.input_layernorm(x)
        qkv = [p(h) for p in self.qkv]
        q, k, v = qkv[0].split(self.qkv_sizes, dim=-1) if len(qkv) == 1 else qkv
        lead = x.shape[:-1]
        q = q.reshape(*lead, self.num_heads, self.head_dim)
        k = k.reshape(*lead, self.num_kv_heads, self.head_dim)
        v = v.reshape(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = causal_attention(q, k, v) if kv_cache is None else kv_cache.attend(self.layer_idx, q, k, v)
        x = x + self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))
        h = self.post_attention_layernorm(x)
        gate_up = [p(h) for p in self.gate_up]
        gate, up = gate_up[0].split(self.intermediate, dim=-1) if len(gate_up) == 1 else gate_up
        return x + self.down_proj(F.silu(gate) * up)

    def forward_fused_ops(self, ops, hidden, residual, positions, cos_sin_cache, kv_cache):
        """The order of ``ops`` (``cpu_ops``, or the ``compiled`` ones): returns (this layer's MLP
        output, the residual stream before it); the next layer adds the two inside its first norm.
        ``residual`` is None in the first layer, where ``hidden`` is the embeddings (and becomes the
        stream, updated in place from then on)."""
        attn_norm, mlp_norm = self.input_layernorm, self.post_attention_layernorm
        if residual is None:
            residual, h = hidden, ops.rms_norm(hidden, attn_norm.weight, attn_norm.eps)
        else:
            h = ops.add_rms_norm(hidden, residual, attn_norm.weight, attn_norm.eps)
        lead, heads, kv_heads, head_dim = h.shape[:-1], self.num_heads, self.num_kv_heads, self.head_dim
        positions = positions.reshape(-1)  # the rotation takes one position per token row
        qkv = [p(h) for p in self.qkv]
        rotate_together = len(qkv) == 1 and self.q_norm is None  # q then k in each row of one output
        if rotate_together:
            q_and_k = qkv[0][..., : (heads + kv_heads) * head_dim].view(-1, heads + kv_heads, head_dim)
            ops.rotary_embedding_(q_and_k, positions, cos_sin_cache)
        q, k, v = qkv[0].split(self.qkv_sizes, dim=-1) if len(qkv) == 1 else qkv
        q, k, v = (t.view(*lead, n, head_dim) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
        if not rotate_together:
            if self.q_norm is not None:
                q, k = (ops.rms_norm(t, norm.weight, norm.eps) for t, norm in ((q, self.q_norm), (k, self.k_norm)))
            for t, n in ((q, heads), (k, kv_heads)):
                ops.rotary_embedding_(t.view(-1, n, head_dim), positions, cos_sin_cache)
        out = causal_attention(q, k, v) if kv_cache is None else kv_cache.attend(self.layer_idx, q, k, v)
        attn_out = self.o_proj(out.reshape(*lead, heads * head_dim))
        h = ops.add_rms_norm(attn_out, residual, mlp_norm.weight, mlp_norm.eps)
        gate_up = [p(h) for p in self.gate_up]
        act = ops.silu_and_mul(gate_up[0]) if len(gate_up) == 1 else F.silu(gate_up[0]) * gate_up[1]
        return self.down_proj(act), residual


class FastCausalLM:
    """``model`` with the fast path's ``steps`` (see the module docstring); the model's interface."""

    def __init__(self, model: CausalLM, steps: tuple[str, ...]):
        self.config, self.eos_token_ids, self.steps = model.config, model.eos_token_ids, steps
        fused, prepack, gemv = "fused" in steps, "prepacked" in steps, "cpu_gemv" in steps
        # the ops between the matmuls, fused: C functions, compiled ones, or None (the layer's own code)
        self.ops = cpu_ops if "cpu_ops" in steps else compiled_ops.ops() if "compiled" in steps else None
        decoder = model.model
        self.embed_tokens, self.norm, self.rotary_emb = decoder.embed_tokens, decoder.norm, decoder.rotary_emb
        with torch.no_grad():
            self.layers = [FastLayer(layer, fused, prepack, gemv) for layer in decoder.layers]
            self.lm_head = Linear([(model.lm_head.weight, None)], prepack, gemv)
        if "compiled" in steps:
            self._compile_ops()

    @torch.inference_mode()  # as the runner's steps run: the compiled code is for that mode
    def _compile_ops(self) -> None:
        """Compile the ``compiled`` step's ops now, for one token and for more (a forward of each, with
        no KV cache), so that no step of a run stalls on the compiler."""
        device = self.embed_tokens.weight.device
        for num_tokens in (1, 2):
            positions = torch.arange(num_tokens, device=device)
            self.forward(torch.zeros_like(positions), positions)

    def __call__(self, input_ids, positions, kv_cache=None):
        return self.forward(input_ids, positions, kv_cache)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache=None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.ops is not None:
            return self._forward_fused_ops(x, positions, kv_cache)
        cos, sin = self.rotary_emb(positions)
        for layer in self.layers:
            x = layer(x, cos, sin, kv_cache)
        return self.norm(x)

    def _forward_fused_ops(self, x, positions, kv_cache):
        hidden, residual, cos_sin_cache = x, None, self.rotary_emb.cos_sin_cache
        for layer in self.layers:
            hidden, residual = layer.forward_fused_ops(self.ops, hidden, residual, positions, cos_sin_cache, kv_cache)
        return self.ops.add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden_states)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))
