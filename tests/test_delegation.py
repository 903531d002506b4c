"""The grader refuses an answer that hands its task to minillm's own (``minillm.course.delegation``):
each chapter's delegation attempts are found and charged to what they dodge, legitimate uses of
what an exercise gives are not, and in a grading run a delegated function's tests earn nothing while
the learner's own functions still pass."""

import shutil

import pytest
import torch

from minillm.course import grade
from minillm.course.delegation import ALLOWED, WHOLE_MODULE, find_delegations, names_used
from minillm.course.kernel_puzzles import launch_one_block
from minillm.course.paths import REPO_ROOT
from minillm.course.sandbox import Delegated, LearnerProcess

# Grading probes below run in a learner process, which imports this file by its path: no `tests.` imports.
pytestmark = pytest.mark.skipif(
    not (REPO_ROOT / "solutions").is_dir(), reason="a student copy of the course (make-release) has no solutions/"
)


def solution(module: str) -> str:
    return (REPO_ROOT / "solutions" / f"{module}.py").read_text()


# (exercise module, code appended to the reference answer, the names charged with a delegation)
ATTEMPTS = [
    (
        "ch01_naive",
        "from minillm import LLM\n\ndef decode_loop(model, prompt_token_ids, max_tokens, eos_token_id=None):\n"
        "    return LLM(model).generate([prompt_token_ids])[0].token_ids\n",
        {"decode_loop", "LLM"},
    ),
    (
        "ch01_naive",
        "from minillm.metrics import RequestMetrics\n\ndef latency_metrics(arrival_time, token_times):\n"
        "    m = RequestMetrics(arrival_time=arrival_time)\n    return {'ttft': m.ttft}\n",
        {"latency_metrics", "RequestMetrics"},
    ),
    ("ch02_batching", "from minillm.engines.static import left_pad\n", {"left_pad", "LeftPadRunner"}),
    (
        "ch02_batching",
        "def form_batch(waiting_arrival_times, now, max_num_seqs, max_queue_delay):\n"
        "    return StaticBatchScheduler.form_batch(None, waiting_arrival_times, now)\n",
        {"form_batch", "FormBatchScheduler"},
    ),
    (
        "ch03_scheduling",
        "from minillm.engines.continuous import ContinuousBatchScheduler\n"
        "IterationLevelScheduler.schedule = ContinuousBatchScheduler.schedule\n",
        {"ContinuousBatchScheduler", "IterationLevelScheduler"},
    ),
    (
        "ch03_scheduling",
        "import minillm.scheduler as sched\n\nclass IterationLevelScheduler(ReservingScheduler):\n"
        "    def schedule(self, now):\n        return sched.plan_running(self, now)\n",
        {"IterationLevelScheduler"},
    ),
    (
        "ch04_selective",
        "from minillm.attention.causal import causal_attention as ragged_attention\n",
        {"ragged_attention"},
    ),
    (
        "ch05_paged",
        "from minillm.kv.block_manager import BlockManager as MyBlockManager\n",
        {"MyBlockManager", "MyBlockManagerScheduler"},
    ),
    (
        "ch05_paged",
        "import minillm.engines.paged as paged\n\ndef slot_mapping(block_tables, starts, lens, block_size):\n"
        "    return paged.slot_mapping(block_tables, starts, lens, block_size)\n",
        {"slot_mapping", "SlotMappingRunner"},
    ),
    (
        "ch05_paged",
        "class SlotMappingRunner(PagedRunner):\n    def slot_mapping(self, *args):\n"
        "        return super().slot_mapping(*args)\n",
        {"SlotMappingRunner"},
    ),
    (
        "ch05_paged",
        "import importlib\n\ndef slot_mapping(*args):\n"
        "    return importlib.import_module('minillm.engines.paged').slot_mapping(*args)\n",
        {"slot_mapping", "SlotMappingRunner"},
    ),
    (
        "ch05_paged",
        "class MyPreemptingScheduler(PagedScheduler):\n    def preempt(self, preempted, swap_out):\n"
        "        return super().preempt(preempted, swap_out)\n",
        {"MyPreemptingScheduler"},
    ),
    (
        "ch05_kernel",
        "from minillm.kernels.triton_paged_attention import triton_paged_attention\n",
        {"triton_paged_attention"},
    ),
    (
        "ch06_chunked",
        "from minillm.engines.chunked import ChunkedPrefillScheduler\n"
        "MyChunkedScheduler.schedule = ChunkedPrefillScheduler.schedule\n",
        {"ChunkedPrefillScheduler", "MyChunkedScheduler"},
    ),
    (
        "ch06_budget",
        "from minillm.capacity import budget\n\ndef choose_token_budget(profile, workload, itl_target, *args):\n"
        "    return budget.choose_token_budget(profile, workload, itl_target, *args)\n",
        {"choose_token_budget"},
    ),
    (
        "ch06_budget",
        "from minillm.capacity.budget import worst_itl_gap\n\ndef choose_token_budget(profile, workload, target, *a):\n"
        "    budget = 64\n    while worst_itl_gap(profile, workload, max_num_batched_tokens=budget * 2) <= target:\n"
        "        budget *= 2\n    return {'max_num_batched_tokens': budget}\n",
        {"choose_token_budget", "worst_itl_gap"},  # half of minillm's answer is still minillm's
    ),
    (
        "ch07_prefix_caching",
        "from minillm.kv.prefix_cache import PrefixCachingBlockManager as MyPrefixCachingBlockManager\n",
        {"MyPrefixCachingBlockManager", "MyPrefixCachingScheduler"},
    ),
    (
        "ch07_prefix_caching",
        "import minillm.kv.prefix_cache as pc\n\ndef hash_block(parent_hash, token_ids):\n"
        "    return pc.hash_block(parent_hash, token_ids)\n",
        {"hash_block", "MyPrefixCachingBlockManager", "MyPrefixCachingScheduler"},  # the allocator names blocks with it
    ),
    (
        "ch07_prefix_caching",
        "from minillm.kv.prefix_cache import PrefixCachingBlockManager\n\n"
        "class MyPrefixCachingBlockManager(PrefixCachingBlockManager):\n"
        "    def take_free_block(self):\n        return super().take_free_block()\n",
        {"PrefixCachingBlockManager", "MyPrefixCachingBlockManager", "MyPrefixCachingScheduler"},
    ),
    (
        "ch07_prefix_caching",
        "MyPrefixCachingScheduler.prefix_caching_block_manager_cls = "
        "ChunkedPrefillScheduler.prefix_caching_block_manager_cls\n",
        {"MyPrefixCachingScheduler"},
    ),
    ("ch08_capacity", "from minillm.capacity.measure import measured_slice\n", {"measured_slice"}),
    (
        "ch08_capacity",
        "from minillm.capacity.measure import mean_waiting\n\ndef queue_grew(waiting, start, end, n):\n"
        "    return mean_waiting(waiting, start, end) > 3, 0.0, 0.0\n",
        {"queue_grew", "mean_waiting"},
    ),
    (
        "ch08_capacity",
        "import minillm\n\ndef request_is_good(ttft, itls, e2e, slos):\n"
        "    return getattr(minillm.capacity.measure, 'request_is_good')(ttft, itls, e2e, slos)\n",
        {"request_is_good"},
    ),
    (
        "ch09_roofline",
        "from minillm.sim.cost_model import Profile\n\ndef decode_step_floor(*args):\n"
        "    return Profile.forward_cost(*args)\n",
        {"decode_step_floor", "Profile", "crossover_batch"},  # crossover_batch calls decode_step_floor
    ),
    ("ch09_roofline", "from minillm import sim\nFLOOR = sim.Profile\n", {"FLOOR"}),
    (
        "ch08_no_evict",
        "from minillm.engines.trtllm import TRTLLMScheduler\n\nclass MyNoEvictScheduler(TRTLLMScheduler):\n    pass\n",
        {"TRTLLMScheduler", "MyNoEvictScheduler"},
    ),
    (
        "ch10_tensor_parallel",
        "from minillm.distributed.tensor_parallel import shard_state_dict\n\ndef split_mlp(mlp, tp_size):\n"
        "    return [shard_state_dict(mlp, rank, tp_size) for rank in range(tp_size)]\n",
        {"split_mlp", "shard_state_dict"},
    ),
    (
        "ch10_tensor_parallel",
        "import minillm.distributed.tensor_parallel as tp\n\ndef shard_forward(shard, x):\n"
        "    h = F.silu(F.linear(x, shard.gate_weight)) * F.linear(x, shard.up_weight)\n"
        "    return tp.RowParallelLinear(shard.down_weight, None, None)(h)\n",
        {"shard_forward", "parallel_mlp"},  # parallel_mlp runs every rank's shard_forward
    ),
    (
        "ch10_tensor_parallel",
        "def shard_forward(shard, x):\n    return MLP.forward(shard, x)\n",
        {"shard_forward", "parallel_mlp"},  # the layer's forward is given as a type, not as the answer
    ),
    ("ch04_selective", "import minillm.kernels\nminillm.kernels.paged_attention_reference(1)\n", {WHOLE_MODULE}),
    (
        "ch04_selective",
        "def pack(seqs):\n    from minillm.engines import selective\n    return selective\n",
        set(),  # a module is not an answer: only what is taken from it can be
    ),
    (
        "ch04_selective",
        "def unpack(flat, cu):\n    from minillm.attention.causal import causal_attention\n    return flat\n",
        {"unpack"},  # an answer imported inside a function is charged to it
    ),
]


@pytest.mark.parametrize(
    ("module", "appended", "charged"), ATTEMPTS, ids=[f"{a[0]}-{i}" for i, a in enumerate(ATTEMPTS)]
)
def test_a_delegation_is_charged_to_what_it_dodges(module, appended, charged):
    found = find_delegations(solution(module) + "\n\n" + appended, module)
    assert set(found) == charged, {k: (v.line, v.reaches) for k, v in found.items()}


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_the_reference_answers_delegate_nothing(module):
    assert find_delegations(solution(module), module) == {}


LEGITIMATE = [
    # a comment, a string and a docstring may name minillm's answer
    ("ch05_paged", "# like minillm.engines.paged.slot_mapping\nNOTE = 'minillm.kv.block_manager.BlockManager'\n"),
    # the engine's vocabulary and what the exercise gives to build on
    (
        "ch06_chunked",
        "from minillm import SamplingParams\nfrom minillm.request import RequestStatus\nP = SamplingParams()\n",
    ),
    (
        "ch02_batching",
        "class R(PaddedBatchRunner):\n    def __init__(self, model, device):\n"
        "        super().__init__(model, device)\n",
    ),
    # trying minillm's engine out under the main guard runs only when the file is run as a script
    (
        "ch08_capacity",
        "if __name__ == '__main__':\n    from minillm.capacity import search_max_rate\n    search_max_rate\n",
    ),
]


@pytest.mark.parametrize(("module", "appended"), LEGITIMATE)
def test_legitimate_uses_are_not_delegations(module, appended):
    assert find_delegations(solution(module) + "\n\n" + appended, module) == {}


def probe_one(ch05, x):
    return ch05.slot_mapping(x), ch05.SlotMappingRunner


def probe_whole(ch05):
    return helper(ch05)


def helper(module):
    return module


def test_a_probe_uses_the_attributes_it_reads_or_everything():
    assert names_used(probe_one) == {"slot_mapping", "SlotMappingRunner"}
    assert names_used(probe_whole) is None


def test_a_kernel_puzzle_is_graded_on_its_kernel_not_its_launcher(tmp_path):
    """A launcher that returns the reference's answer around a kernel left unwritten earns nothing:
    the grader launches the kernel itself (and refuses the launcher, which reaches minillm's kernel)."""
    source = solution("ch05_kernel")
    begin, end = (
        source.index("    # BEGIN SOLUTION\n    # HINT: write the body of one_block_attention_kernel"),
        source.index("    # END SOLUTION"),
    )
    source = source[:begin] + '    raise NotImplementedError("one_block_attention_kernel")\n' + source[end:]
    launcher = "    return launch_one_block(one_block_attention_kernel, q, k_cache, v_cache, block_id, scale, out)\n"
    reference = (  # the reference's answer, from a launcher that never runs the kernel
        "    from minillm.kernels.paged_attention import paged_attention_reference\n"
        "    one = torch.ones(1, dtype=torch.int32)\n"
        "    table, lens, starts = one[None] * block_id, one * k_cache.shape[1], torch.arange(2, dtype=torch.int32)\n"
        "    return paged_attention_reference(q[None], k_cache, v_cache, table, lens, starts, scale)[0]\n"
    )
    assert source.count(launcher) == 1
    source = source.replace(launcher, reference)
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "ch05_kernel.py").write_text(source)
    q, pool = torch.randn(2, 16), torch.randn(1, 16, 2, 16)
    with LearnerProcess("ch05_kernel", impl=str(folder)) as learner:
        with pytest.raises(Delegated, match="paged_attention_reference"):  # the launcher itself is refused
            learner.call(run_launcher, q, pool, pool, 0, 0.25)
        with pytest.raises(NotImplementedError, match="one_block_attention_kernel"):
            learner.call(run_one_block, q, pool, pool, 0, 0.25)


def run_one_block(ch05k, q, k_cache, v_cache, block_id, scale):  # as the grading test launches puzzle 1
    return launch_one_block(ch05k.one_block_attention_kernel, q, k_cache, v_cache, block_id, scale)


def run_launcher(ch05k, q, k_cache, v_cache, block_id, scale):
    return ch05k.one_block_attention(q, k_cache, v_cache, block_id, scale)


def test_grading_charges_the_delegated_function_only(tmp_path):
    """A submission whose ``measured_slice`` is minillm's: those tests earn nothing and say why,
    without their hints (which would name a mistake); its own other functions still pass."""
    folder = tmp_path / "submission"
    folder.mkdir()
    shutil.copy(REPO_ROOT / "solutions" / "ch08_capacity.py", folder)
    path = folder / "ch08_capacity.py"
    path.write_text(path.read_text() + "\n\nfrom minillm.capacity.measure import measured_slice\n")
    report = grade(["ch08"], impl=str(folder), timeout=60)
    results = report.results
    delegated = [r for r in results if r.status == "delegated"]
    assert {r.test for r in delegated} == {r.test for r in results if "measured_slice" in r.test}
    assert all(r.passed for r in results if "request_is_good" in r.test or "queue_grew" in r.test)
    line = delegated[0].line(60)
    assert "uses minillm's own `minillm.capacity.measure.measured_slice`" in line and delegated[0].hint not in line
