"""The simulator's cost model: how long one forward pass takes, from what it computes.

A roofline: a pass moves bytes through memory and does FLOPs on the matmul units, and it takes as
long as the slower of the two, plus the time the device sits idle while the host prepares it::

    time = max(bytes / memory_bandwidth, flops / peak_flops) + forward_overhead + seq_overhead * num_seqs

    bytes = weight_bytes                      read once per pass, however many sequences share it
          + kv_bytes_per_token * context      every sequence's cached keys/values read, new ones written
    flops = 2 * num_params * num_tokens       one multiply-add per weight per computed token
          + attention_flops_per_pair * pairs  each computed token against each key it attends to

That one formula is the whole story of batching: a decode pass of one sequence and one of 64
sequences read the same weights, so while weights dominate the bytes, 64 decodes cost about as much
as one. Prefill computes many tokens per weight read, so it hits the FLOP ceiling instead. An engine
step is one forward pass, except where a runner runs each request separately: then the step pays
the weights and the overhead once per request (``minillm.sim.twins``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass
class ForwardCost:
    """One forward pass's modelled work and time. ``bound`` names what sets the time: ``"memory"`` or
    ``"compute"`` (the larger roofline term), or ``"overhead"`` when the host's share is larger still."""

    bytes: float
    flops: float
    time: float
    bound: str


@dataclass(frozen=True)
class Profile:
    """One model on one device, as the cost model sees it. Loadable from and savable to JSON, so a
    calibration measured once (``minillm.sim.calibrate``) is reused without re-measuring."""

    name: str
    memory_bandwidth: float  # bytes per second
    peak_flops: float  # FLOPs per second
    weight_bytes: float  # all weights, read once per forward pass
    num_params: float
    kv_bytes_per_token: float  # keys and values of one token over all layers
    attention_flops_per_pair: float  # one query token attending to one key: 4 * layers * heads * head_dim
    forward_overhead: float  # seconds per forward pass: kernel launches, Python, the host-device sync
    seq_overhead: float  # seconds per sequence in the pass: building its inputs, sampling its token
    model: dict = field(default_factory=dict)  # the modelled model's transformers config (its shape)
    notes: str = ""  # where each number comes from: measured or assumed
    calibration_points: list = field(default_factory=list)  # the measured passes a fit came from, and its times
    # tensor parallelism (``tensor_parallel``): the numbers above are one rank's, and every pass adds
    # its all-reduces, which no other work overlaps here (as in an eager engine)
    tensor_parallel_size: int = 1
    allreduce_bytes_per_token: float = 0.0  # what one rank sends per computed token, all layers' all-reduces
    link_bandwidth: float = 0.0  # bytes per second, one direction, between two ranks
    allreduce_latency: float = 0.0  # seconds per pass: every all-reduce's fixed cost

    def communication_time(self, num_tokens: int) -> float:
        """The pass's all-reduces: a fixed cost each, plus the bytes every rank sends over its link."""
        if self.tensor_parallel_size == 1:
            return 0.0
        return self.allreduce_latency + self.allreduce_bytes_per_token * num_tokens / self.link_bandwidth

    def forward_cost(self, num_seqs: int, num_tokens: int, context_tokens: int, attention_pairs: int) -> ForwardCost:
        """Cost of a forward pass that computes ``num_tokens`` tokens for ``num_seqs`` sequences whose
        contexts (cached plus new tokens) add up to ``context_tokens``; ``attention_pairs`` counts
        (query token, key) pairs the attention computes."""
        bytes_ = self.weight_bytes + self.kv_bytes_per_token * context_tokens
        flops = 2 * self.num_params * num_tokens + self.attention_flops_per_pair * attention_pairs
        memory_time, compute_time = bytes_ / self.memory_bandwidth, flops / self.peak_flops
        roof = max(memory_time, compute_time)
        overhead = self.forward_overhead + self.seq_overhead * num_seqs
        # a tie is "compute", as chapter 9's exercise rules: the arithmetic takes at least as long as the bytes
        bound = "overhead" if overhead > roof else ("compute" if compute_time >= memory_time else "memory")
        return ForwardCost(bytes_, flops, roof + overhead + self.communication_time(num_tokens), bound)

    def forward_time(self, num_seqs: int, num_tokens: int, context_tokens: int, attention_pairs: int) -> float:
        """``forward_cost(...).time`` alone, the same formula: the simulator asks for it at every
        step and needs neither the ``ForwardCost`` object nor its ``bound``."""
        bytes_ = self.weight_bytes + self.kv_bytes_per_token * context_tokens
        flops = 2 * self.num_params * num_tokens + self.attention_flops_per_pair * attention_pairs
        roof = max(bytes_ / self.memory_bandwidth, flops / self.peak_flops)
        return roof + (self.forward_overhead + self.seq_overhead * num_seqs) + self.communication_time(num_tokens)

    @classmethod
    def load(cls, name_or_path: str | Path) -> Profile:
        """A profile by name (``"h200-qwen3-0.6b"``, ``"cpu-tiny"``: the JSON files shipped in
        ``minillm/sim/profiles``) or by path to a JSON file."""
        path = Path(name_or_path)
        if path.suffix != ".json":
            path = PROFILE_DIR / f"{name_or_path}.json"
            if not path.exists():
                raise ValueError(
                    f"unknown profile {str(name_or_path)!r}; shipped profiles: {', '.join(available_profiles())}"
                )
        return cls(**json.loads(path.read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def attention_pairs(num_cached: int, num_new: int) -> int:
    """(query, key) pairs when ``num_new`` tokens attend causally after ``num_cached`` cached ones:
    new token i sees the cache and new tokens 0..i."""
    return num_new * num_cached + num_new * (num_new + 1) // 2


# One H200's NVLink, one direction: 900 GB/s is both directions together [h200-nvlink].
NVLINK_BYTES_PER_S = 450e9
# A PCIe 5.0 x16 link, one direction: 128 GB/s is both directions together [pcie5-bandwidth].
PCIE5_BYTES_PER_S = 64e9
# ASSUMED, not measured: the fixed cost of one small all-reduce between GPUs of one server (kernel
# launch and synchronisation), the order NCCL reaches on NVLink; replace it with a measured figure.
ALLREDUCE_LATENCY_S = 10e-6


def tensor_parallel(
    profile: Profile,
    tensor_parallel_size: int,
    link_bytes_per_s: float = NVLINK_BYTES_PER_S,
    allreduce_latency_s: float = ALLREDUCE_LATENCY_S,
) -> Profile:
    """``profile``'s model split over ``tensor_parallel_size`` GPUs, as one rank sees it: 1/N of the
    weights to read, of the FLOPs and of every token's KV bytes, the same per-pass host overhead
    (each rank launches every layer's kernels), and two all-reduces per layer of each computed
    token's hidden state [megatron-lm]. A ring all-reduce of B bytes has every rank send 2(N-1)/N x B,
    over a link of ``link_bytes_per_s`` one way (by default NVLink's 450 GB/s [h200-nvlink])."""
    n = tensor_parallel_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {n!r}")
    if not link_bytes_per_s > 0:
        raise ValueError(f"link_bytes_per_s must be > 0, got {link_bytes_per_s!r}")
    if profile.tensor_parallel_size != 1:
        raise ValueError(f"profile {profile.name!r} is already split over {profile.tensor_parallel_size} GPUs")
    shape = profile.model
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if shape[name] % n:
            raise ValueError(f"tensor_parallel_size={n} must divide the model's {name} ({shape[name]})")
    if n == 1:
        return profile
    dtype_bytes = profile.weight_bytes / profile.num_params
    allreduces = 2 * shape["num_hidden_layers"]  # after o_proj and after down_proj, in every layer
    return dataclasses.replace(
        profile,
        name=f"{profile.name}-tp{n}",
        weight_bytes=profile.weight_bytes / n,
        num_params=profile.num_params / n,
        kv_bytes_per_token=profile.kv_bytes_per_token / n,
        attention_flops_per_pair=profile.attention_flops_per_pair / n,
        tensor_parallel_size=n,
        allreduce_bytes_per_token=allreduces * shape["hidden_size"] * dtype_bytes * 2 * (n - 1) / n,
        link_bandwidth=link_bytes_per_s,
        allreduce_latency=allreduces * allreduce_latency_s,
        notes=f"{profile.notes} Split over {n} GPUs (minillm.sim.cost_model.tensor_parallel): links of "
        f"{link_bytes_per_s / 1e9:g} GB/s one way, {allreduce_latency_s * 1e6:g} us per all-reduce (assumed).",
    )
