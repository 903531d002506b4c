"""The grading tests catch plausible wrong answers, each with the hint that names the mistake, and
pass correct answers written differently.

Each case is a reference solution with a few lines edited (``MISTAKES``: what a learner might
write, and the grading test that must fail on it; ``VARIANTS``: correct answers in another style,
which must pass every test of their chapter). The grading test functions run here against the
edited module through ``InProcessLearner``, a stand-in for the sandbox's ``LearnerProcess`` that
converts results to plain data the same way, in this process: the edited modules are ours.
"""

import os

# Chapter 5's kernels run here on CPU tensors, as the sandbox runs them for learners: in Triton's
# interpreter, which Triton asks about when a kernel is made and when it is launched.
os.environ.setdefault("TRITON_INTERPRET", "1")

import hashlib
import importlib
import linecache
import types
from dataclasses import dataclass, field

import pytest

from minillm.course.delegation import names_used
from minillm.course.paths import REPO_ROOT
from minillm.course.runtime_check import Guard, check_definitions, tasks_of
from minillm.course.sandbox import Delegated, LearnerError, plain
from tests.test_course import needs_solutions

pytestmark = needs_solutions  # every case edits a reference answer; make-release also withholds this file


class InProcessLearner:
    """``LearnerProcess.call`` without the child process: the same checks of whose code answered
    (``minillm.course.runtime_check``, so a correct variant that builds on what an exercise gives
    is shown not to be refused), plain data back, errors as ``LearnerError``."""

    guards: dict[str, Guard] = {}  # one per exercise: it instruments minillm's answers in this process

    def __init__(self, module, chapter: str):
        self.module, self.chapter = module, chapter
        if chapter not in self.guards:
            self.guards[chapter] = Guard(chapter, grades_the_answers=True)
        self.guard = self.guards[chapter]

    def call(self, probe, *args, timeout=None, **kwargs):
        tasks = tasks_of(self.chapter, names_used(probe))
        refused = check_definitions(self.module, tasks)
        if refused is not None:
            raise (NotImplementedError if refused[0] == "not_implemented" else Delegated)(refused[1])
        try:
            with self.guard.probing(tasks, self.module):
                result = probe(self.module, *args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as err:
            raise LearnerError(f"{type(err).__name__}: {err}") from err
        finally:
            if self.guard.found is not None:
                raise Delegated(self.guard.found)
        return plain(result)


def edited_solution(chapter: str, edits: list[tuple[str, str]]) -> types.ModuleType:
    """``solutions/<chapter>.py`` with each ``old`` text (found exactly once) replaced by ``new``."""
    path = REPO_ROOT / "solutions" / f"{chapter}.py"
    source = path.read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"{chapter}: the edit's text must occur once in the solution: {old!r}"
        source = source.replace(old, new)
    module = types.ModuleType(f"edited_{chapter}")
    # A file name of its own, its text in linecache: Triton's jit reads a kernel's source with inspect,
    # which would otherwise read the unedited solutions file from disk.
    filename = f"<edited solutions/{chapter}.py {hashlib.sha256(source.encode()).hexdigest()[:12]}>"
    module.__file__ = filename  # the learner's file, for the checks that the code is the learner's own
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def grading_test(chapter: str, name: str):
    return getattr(importlib.import_module(f"tests.grading.test_{chapter}"), name)


def hint_of(test) -> str:
    return next(m.args[0] for m in test.pytestmark if m.name == "hint")


@dataclass
class Mistake:
    what: str  # what the learner did
    chapter: str
    edits: list[tuple[str, str]]
    test: str  # the grading test that must fail on it
    hint_says: str  # words its hint must contain: the hint names this mistake
    message_says: str = ""  # words the failure message must contain, where the hint is general
    still_passes: list[str] = field(default_factory=list)  # tests whose hints would mislead if they failed too


CH01, CH02, CH03, CH04, CH05 = "ch01_naive", "ch02_batching", "ch03_scheduling", "ch04_selective", "ch05_paged"
CH05K = "ch05_kernel"
FITS_CHECK = "        if missing > len(self.free_block_ids):\n            return False\n"
SLOTS = "    return [\n        table[p // block_size] * block_size + p % block_size\n"
ADVANCE = "        cache.advance(len(ids))\n"
POSITIONS = "positions = torch.arange(cache.num_tokens, cache.num_tokens + len(ids), device=param.device)"
APPEND_THEN_EOS = "        output.append(token)\n        if token == eos_token_id:\n            break\n"
ADMIT_LOOP = "        while self.waiting and len(self.running) < self.max_num_seqs:\n"
DECODE_MASK = '        scores = tl.where(in_context, scores, float("-inf"))\n'
KV_CHECK = "self.num_reserved_kv_tokens + request.max_num_tokens > self.num_kv_tokens\n"
CH06 = "ch06_chunked"
ADMIT_BUDGET = "                    budget -= n\n"
FIRST_OF_QUEUE = "                    n = tokens_for(queue[0])\n"
NO_BUDGET_LEFT = "            if budget == 0:\n                break\n"
CH06B = "ch06_budget"
CH07 = "ch07_prefix_caching"
CHAIN = "            parent = hash_block(parent, "  # find_cached_blocks' and cache_full_blocks' hashing
RELEASE = (  # free's loop body
    "            self.ref_counts[block] -= 1\n"
    "            if self.ref_counts[block] == 0:\n"
    "                self.free_block_ids.append(block)\n"
)
EVICT = (
    "        block = self.free_block_ids.popleft()\n"
    "        if self.block_hashes[block] is not None:\n"
    "            del self.cached_block_ids[self.block_hashes[block]]\n"
    "            self.block_hashes[block] = None\n"
)
UNQUEUE = (
    "            if self.ref_counts[block] == 0:\n"
    "                self.free_block_ids.remove(block)  # held again: off the free queue, so never evicted\n"
)
CH08 = "ch08_capacity"
GALLOP = (
    "    while lo < high:  # gallop: double the rate until one fails, or high passes\n        nxt = min(2 * lo, high)\n"
)
ITL_CHECK = '    if "itl" in slos and itls and sum(itls) / len(itls) > slos["itl"]:\n'
CH08N = "ch08_no_evict"
NEED = "            need = bm.num_blocks_for(request.max_num_tokens)\n"
RUNNING_NEED = "        free = bm.num_free_blocks - sum(self.blocks_still_needed(r) for r in self.running)\n"
ADMIT_WHILE = "        while self.waiting and len(self.running) < self.max_num_seqs:\n"
CH09 = "ch09_roofline"
CROSSOVER = (  # crossover_batch's body, after its two times
    "    if per_request_s <= 0:\n"
    "        return None  # each request adds at least as much memory time as compute time\n"
    "    batch = max(1, math.ceil(weights_s / per_request_s))\n"
)

CH10 = "ch10_tensor_parallel"
GATE_ROWS = "                gate_weight=gate.weight.detach()[mine],"
UP_ROWS = "                up_weight=up.weight.detach()[mine],\n"
UP_BIAS = "                up_bias=None if up.bias is None else up.bias.detach()[mine],\n"
DOWN_COLUMNS = "                down_weight=down.weight.detach()[:, mine],"
DIVIDES = (
    "    if size % tp_size:\n"
    '        raise ValueError(f"tp_size={tp_size} must divide the layer\'s intermediate_size ({size})")\n'
)
SWIGLU = (
    "    h = F.silu(F.linear(x, shard.gate_weight, shard.gate_bias)) * F.linear(x, shard.up_weight, shard.up_bias)\n"
)
PARTIAL = "    return F.linear(h, shard.down_weight)"
BIAS_ONCE = "    return out if bias is None else out + bias"


def crossover_returning(expression: str) -> list[tuple[str, str]]:
    """Edits that make ``crossover_batch`` return ``expression`` (of ``weights_s``, ``per_request_s``
    and the arguments) at once, skipping the reference's rounding checks."""
    return [(CROSSOVER, f"    return {expression}\n" + CROSSOVER)]


MISTAKES = [
    # chapter 1: decode_loop
    Mistake(
        "never calls cache.advance",
        CH01,
        [(ADVANCE, "")],
        "test_decode_loop_advances_the_cache",
        "cache.advance",
        still_passes=[
            "test_decode_loop_respects_max_tokens",
            "test_decode_loop_stops_at_eos",
            "test_decode_loop_eos_token_id_zero",
            "test_decode_loop_in_other_dtypes",
        ],
    ),
    Mistake(
        "positions restart at 0 every pass",
        CH01,
        [(POSITIONS, "positions = torch.arange(len(ids), device=param.device)")],
        "test_decode_loop_positions",
        "0..n-1 for the prompt, then n, n+1",
        still_passes=["test_decode_loop_advances_the_cache", "test_decode_loop_stops_at_eos"],
    ),
    Mistake(
        "decode positions count generated tokens only",
        CH01,
        [(POSITIONS, "positions = torch.arange(len(output), len(output) + len(ids), device=param.device)")],
        "test_decode_loop_positions",
        "index in the whole sequence",
    ),
    Mistake(
        "`if eos_token_id and token == eos_token_id`",
        CH01,
        [("if token == eos_token_id:", "if eos_token_id and token == eos_token_id:")],
        "test_decode_loop_eos_token_id_zero",
        "may be 0",
        still_passes=["test_decode_loop_stops_at_eos"],
    ),
    Mistake(
        "drops the EOS token from the output",
        CH01,
        [(APPEND_THEN_EOS, "        if token == eos_token_id:\n            break\n        output.append(token)\n")],
        "test_decode_loop_stops_at_eos",
        "keep it in the output",
        still_passes=["test_decode_loop_eos_token_id_zero"],
    ),
    Mistake(
        "checks EOS only on decoded tokens, not the prefill's",
        CH01,
        [("if token == eos_token_id:", "if token == eos_token_id and len(output) > 1:")],
        "test_decode_loop_stops_at_eos",
        "the prefill's first one too",
    ),
    Mistake(
        "one token too many (<= max_tokens)",
        CH01,
        [("while len(output) < max_tokens:", "while len(output) <= max_tokens:")],
        "test_decode_loop_respects_max_tokens",
        "max_tokens",
        still_passes=[
            "test_decode_loop_prefills_then_one_token_per_pass",
            "test_decode_loop_advances_the_cache",
            "test_decode_loop_positions",
        ],
    ),
    Mistake(
        "no KV cache reuse: the whole sequence every pass",
        CH01,
        [
            (
                "        ids = torch.tensor([token], device=param.device)",
                "        ids = torch.tensor(prompt_token_ids + output, device=param.device)\n"
                "        cache = ContiguousKVCache(model.config, len(prompt_token_ids) + max_tokens, param.dtype, "
                "param.device)",
            )
        ],
        "test_decode_loop_prefills_then_one_token_per_pass",
        "only the newest token",
        still_passes=["test_decode_loop_matches_engine"],
    ),
    Mistake(
        "a float32 cache whatever the model's dtype",
        CH01,
        [("len(prompt_token_ids) + max_tokens, param.dtype", "len(prompt_token_ids) + max_tokens, torch.float32")],
        "test_decode_loop_in_other_dtypes",
        "model's dtype",
        still_passes=["test_decode_loop_matches_engine"],
    ),
    Mistake(
        "the logits of the first row, not the last",
        CH01,
        [("compute_logits(hidden[-1:]).argmax", "compute_logits(hidden[:1]).argmax")],
        "test_decode_loop_matches_engine",
        "LAST row",
    ),
    Mistake(
        "returns a tensor of tokens",
        CH01,
        [("    return output\n", "    return torch.tensor(output)\n")],
        "test_decode_loop_returns_python_ints",
        "Python ints",
        still_passes=["test_decode_loop_matches_engine"],
    ),
    # chapter 1: latency_metrics
    Mistake(
        "e2e from the first token",
        CH01,
        [('"e2e": token_times[-1] - arrival_time', '"e2e": token_times[-1] - token_times[0]')],
        "test_latency_metrics_hand_made",
        "e2e = last token - arrival",
    ),
    Mistake(
        "ttft from time zero",
        CH01,
        [('"ttft": token_times[0] - arrival_time', '"ttft": token_times[0]')],
        "test_latency_metrics_hand_made",
        "ttft = first token - arrival",
    ),
    Mistake(
        "itl includes the wait for the first token",
        CH01,
        [("zip(token_times, token_times[1:])", "zip([arrival_time] + token_times, token_times)")],
        "test_latency_metrics_one_token",
        "itl is empty",
    ),
    Mistake(
        "itl measured from the first token",
        CH01,
        [("[b - a for a, b in", "[b - token_times[0] for a, b in")],
        "test_latency_metrics_hand_made",
        "gaps between neighbouring tokens",
    ),
    # chapter 2: left_pad
    Mistake(
        "mask = input_ids != pad_id",
        CH02,
        [("offsets >= 0\n", "input_ids != pad_id\n")],
        "test_left_pad_pad_id_inside_prompts",
        "by position",
        still_passes=["test_left_pad_input_ids", "test_left_pad_positions", "test_left_pad_mask"],
    ),
    Mistake(
        "positions are column numbers",
        CH02,
        [
            (
                "offsets.clamp(min=0), offsets >= 0",
                "torch.arange(width).expand(len(batch_token_ids), width), offsets >= 0",
            )
        ],
        "test_left_pad_positions",
        "first real token",
        still_passes=["test_left_pad_pad_id_inside_prompts"],
    ),
    Mistake(
        "pads get negative positions",
        CH02,
        [("offsets.clamp(min=0), offsets >= 0", "offsets, offsets >= 0")],
        "test_left_pad_positions",
        "pads get 0",
        still_passes=["test_left_pad_pad_id_inside_prompts"],
    ),
    Mistake(
        "right padding",
        CH02,
        [("[pad_id] * (width - len(ids)) + list(ids)", "list(ids) + [pad_id] * (width - len(ids))")],
        "test_left_pad_input_ids",
        "in front of",
        still_passes=["test_left_pad_pad_id_inside_prompts"],
    ),
    Mistake(
        "a 0/1 integer mask",
        CH02,
        [("offsets >= 0\n", "(offsets >= 0).int()\n")],
        "test_left_pad_mask",
        "torch.bool",
        still_passes=["test_left_pad_input_ids", "test_left_pad_positions", "test_left_pad_pad_id_inside_prompts"],
    ),
    # chapter 2: form_batch
    Mistake(
        "starts only after the deadline (> instead of >=)",
        CH02,
        [("if now >= deadline", "if now > deadline")],
        "test_form_batch_waits_for_the_oldest_requests_deadline",
        "at that very time",
    ),
    Mistake(
        "the deadline of the newest request",
        CH02,
        [("waiting_arrival_times[0] + max_queue_delay", "waiting_arrival_times[-1] + max_queue_delay")],
        "test_form_batch_waits_for_the_oldest_requests_deadline",
        "OLDEST",
    ),
    Mistake(
        "returns how long to wait, not until when",
        CH02,
        [("else (0, deadline)", "else (0, deadline - now)")],
        "test_form_batch_waits_for_the_oldest_requests_deadline",
        "(0, that time)",
    ),
    Mistake(
        "a batch larger than max_num_seqs",
        CH02,
        [("return min(num_waiting, max_num_seqs), None", "return num_waiting, None")],
        "test_form_batch_full_batch_starts_at_once",
        "with max_num_seqs requests",
    ),
    Mistake(
        "a full batch waits (> instead of >=)",
        CH02,
        [("num_waiting >= max_num_seqs or", "num_waiting > max_num_seqs or")],
        "test_form_batch_full_batch_starts_at_once",
        "starts at once",
    ),
    Mistake(
        "an empty queue is not handled",
        CH02,
        [("    if num_waiting == 0:\n        return 0, None\n", "")],
        "test_form_batch_with_nobody_waiting",
        "(0, None)",
    ),
    # chapter 3: IterationLevelScheduler.schedule
    Mistake(
        "an exact KV fit is refused (>= instead of >)",
        CH03,
        [(KV_CHECK, "self.num_reserved_kv_tokens + request.max_num_tokens >= self.num_kv_tokens\n")],
        "test_kv_capacity_exact_fit",
        "exact fit",
    ),
    Mistake(
        "never reserves KV tokens",
        CH03,
        [("            self.num_reserved_kv_tokens += request.max_num_tokens\n", "")],
        "test_respects_kv_capacity",
        "add each admitted",
    ),
    Mistake(
        "a smaller request overtakes the oldest",
        CH03,
        [
            (
                ADMIT_LOOP + "            request = self.waiting[0]\n",
                "        for request in list(self.waiting):\n"
                "            if len(self.running) >= self.max_num_seqs:\n                break\n",
            ),
            (
                "                break  # first come, first served: nobody overtakes the oldest request\n"
                "            self.waiting.popleft()\n",
                "                continue\n            self.waiting.remove(request)\n",
            ),
        ],
        "test_first_come_first_served",
        "First come, first served",
    ),
    Mistake(
        "admits one request a step",
        CH03,
        [
            (
                ADMIT_LOOP,
                "        for _ in range(1):\n"
                "            if not (self.waiting and len(self.running) < self.max_num_seqs):\n                break\n",
            )
        ],
        "test_fills_every_free_slot_at_once",
        "fill every free slot",
    ),
    Mistake(
        "one request too many (<= max_num_seqs)",
        CH03,
        [("len(self.running) < self.max_num_seqs:", "len(self.running) <= self.max_num_seqs:")],
        "test_respects_max_num_seqs",
        "max_num_seqs",
    ),
    Mistake(
        "plans one token for everyone",
        CH03,
        [("r.request_id: r.num_tokens - r.num_computed_tokens", "r.request_id: 1")],
        "test_plan_prefill_then_one_token_per_step",
        "whole prompt",
    ),
    Mistake(
        "plans only the newly admitted requests",
        CH03,
        [("for r in self.running},", "for r in self.running if r.request_id in admitted},")],
        "test_plan_prefill_then_one_token_per_step",
        "EVERY running request",
    ),
    Mistake(
        "appends to running without _admit (no slot)",
        CH03,
        [("            self._admit(request)\n", "            self.running.append(request)\n")],
        "test_two_slot_example",
        "slot",
        message_says="self._admit(request)",
    ),
    Mistake(
        "no KV limit (None) is not handled",
        CH03,
        [
            (
                "self.num_kv_tokens is not None\n                and self.num_reserved_kv_tokens",
                "self.num_reserved_kv_tokens",
            )
        ],
        "test_two_slot_example",
        "no KV limit",
        message_says="TypeError",
    ),
    # chapter 4
    Mistake(
        "cu_seqlens without the leading 0",
        CH04,
        [("[0, *accumulate(", "[*accumulate(")],
        "test_pack",
        "cu_seqlens = [0, n_0",
    ),
    Mistake(
        "float offsets",
        CH04,
        [("dtype=torch.int32, device=flat.device", "dtype=torch.float32, device=flat.device")],
        "test_pack",
        "cu_seqlens",
    ),
    Mistake(
        "cu_seqlens on the CPU whatever flat's device",
        CH04,
        [(", dtype=torch.int32, device=flat.device)", ", dtype=torch.int32)")],
        "test_pack_keeps_the_device",
        "flat's device",
        still_passes=["test_pack"],
    ),
    Mistake(
        "unpack drops the last sequence",
        CH04,
        [("zip(bounds, bounds[1:])", "zip(bounds[:-1], bounds[1:-1])")],
        "test_unpack",
        "one tensor per sequence",
    ),
    Mistake(
        "no 1/sqrt(D) scale", CH04, [(" / math.sqrt(q.shape[-1])", "")], "test_ragged_attention_one_prefill", "sqrt(D)"
    ),
    Mistake(
        "a causal mask across sequences",
        CH04,
        [("(seq_q[:, None] == seq_k[None, :]) & ", "")],
        "test_ragged_attention_sequences_do_not_mix",
        "block-diagonal",
    ),
    Mistake(
        "queries placed at the start of their keys",
        CH04,
        [(" + (lens_k - lens_q)[seq_q]", "")],
        "test_ragged_attention_decodes_and_chunks",
        "LAST n_q",
    ),
    Mistake(
        "GQA by tiling heads (repeat, not repeat_interleave)",
        CH04,
        [
            (
                "k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)",
                "k.repeat(1, groups, 1), v.repeat(1, groups, 1)",
            )
        ],
        "test_ragged_attention_grouped_query_heads",
        "h // (H // KVH)",
    ),
    Mistake(
        "returns float64 whatever q's dtype",
        CH04,
        [('torch.einsum("hqk,khd->qhd", probs, v)', 'torch.einsum("hqk,khd->qhd", probs.double(), v.double())')],
        "test_ragged_attention_float32_and_bfloat16",
        "keep it",
        still_passes=["test_ragged_attention_random_batches"],
    ),
    # chapter 5: MyBlockManager
    Mistake(
        "an exact fit of the last free block is refused (>=)",
        CH05,
        [(FITS_CHECK, FITS_CHECK.replace(">", ">="))],
        "test_exact_fit_of_the_last_free_block",
        "exact fit",
        still_passes=["test_a_new_block_exactly_at_a_multiple_of_block_size"],
    ),
    Mistake(
        "takes blocks until they run out, then returns False",
        CH05,
        [
            (FITS_CHECK, ""),
            (
                "            table.append(self.free_block_ids.popleft())\n",
                "            if not self.free_block_ids:\n                return False\n"
                "            table.append(self.free_block_ids.popleft())\n",
            ),
        ],
        "test_one_token_too_many_fails_and_allocates_nothing",
        "allocate NOTHING",
        still_passes=["test_allocates_just_in_time", "test_exact_fit_of_the_last_free_block"],
    ),
    Mistake(
        "floor + 1 blocks: a whole block too many at a multiple of block_size",
        CH05,
        [
            (
                "self.num_blocks_for(request.num_computed_tokens + num_new_tokens)",
                "(request.num_computed_tokens + num_new_tokens) // self.block_size + 1",
            )
        ],
        "test_a_new_block_exactly_at_a_multiple_of_block_size",
        "ceil",
        # the slot mapping is tested on minillm's allocator: this allocator's mistake is not blamed on it
        still_passes=["test_slot_mapping_several_sequences", "test_slot_mapping_runs_the_paged_engine"],
    ),
    Mistake(
        "free forgets to put the blocks back",
        CH05,
        [("        self.free_block_ids.extend(table)\n", "")],
        "test_freed_blocks_are_reused",
        "back on the free list",
        still_passes=["test_allocates_just_in_time", "test_one_token_too_many_fails_and_allocates_nothing"],
    ),
    Mistake(
        "a double free passes silently",
        CH05,
        [("self.block_tables.pop(request.request_id, None)", "self.block_tables.pop(request.request_id, [])")],
        "test_double_free_raises",
        "ValueError",
        still_passes=["test_freed_blocks_are_reused"],
    ),
    # chapter 5: slot_mapping
    Mistake(
        "positions counted from 0, not num_computed_tokens",
        CH05,
        [("        for p in range(start, start + n)\n", "        for p in range(n)\n")],
        "test_slot_mapping_chunk_starting_mid_block",
        "not 0",
        still_passes=["test_slot_mapping_one_prefill"],
    ),
    Mistake(
        "the block id is not multiplied by block_size",
        CH05,
        [(SLOTS, "    return [\n        table[p // block_size] + p % block_size\n")],
        "test_slot_mapping_one_prefill",
        "block_table[p // block_size] * block_size",
    ),
    Mistake(
        "every sequence reads the first one's table",
        CH05,
        [(SLOTS, "    return [\n        block_tables[0][p // block_size] * block_size + p % block_size\n")],
        "test_slot_mapping_several_sequences",
        "own table",
        still_passes=["test_slot_mapping_one_prefill", "test_slot_mapping_chunk_starting_mid_block"],
    ),
    # chapter 5: preemption
    Mistake(
        "preempts the request admitted first",
        CH05,
        [
            (
                "        request = self.running.pop()\n        self.release_slot",
                "        request = self.running.pop(0)\n        self.release_slot",
            )
        ],
        "test_preempt_takes_the_request_admitted_last",
        "admitted last",
    ),
    Mistake(
        "keeps the victim's batch slot",
        CH05,
        [
            (
                "        request = self.running.pop()\n        self.release_slot(request)\n",
                "        request = self.running.pop()\n",
            )
        ],
        "test_preempt_gives_back_blocks_and_slot",
        "release_slot",
        still_passes=[
            "test_preempt_takes_the_request_admitted_last",
            "test_recompute_puts_it_first_in_line_with_nothing_computed",
        ],
    ),
    Mistake(
        "recompute keeps the computed count",
        CH05,
        [
            (
                "            request.num_computed_tokens = 0\n            self.waiting.appendleft",
                "            self.waiting.appendleft",
            )
        ],
        "test_recompute_puts_it_first_in_line_with_nothing_computed",
        "num_computed_tokens 0",
        still_passes=[
            "test_preempt_takes_the_request_admitted_last",
            "test_preempt_gives_back_blocks_and_slot",
            "test_swap_lists_its_blocks_and_keeps_its_progress",
        ],
    ),
    Mistake(
        "swap reads the victim's blocks after freeing them",
        CH05,
        [
            (
                '        if self.preemption_mode == "swap":\n'
                "            swap_out[request.request_id] = self.computed_blocks(request)"
                "  # before free() empties its table\n"
                "        self.block_manager.free(request)\n",
                "        self.block_manager.free(request)\n"
                '        if self.preemption_mode == "swap":\n'
                "            swap_out[request.request_id] = self.computed_blocks(request)\n",
            )
        ],
        "test_swap_lists_its_blocks_and_keeps_its_progress",
        "BEFORE freeing",
        still_passes=[
            "test_preempt_gives_back_blocks_and_slot",
            "test_recompute_puts_it_first_in_line_with_nothing_computed",
        ],
    ),
    Mistake(
        "a recomputed victim waits at the back of the queue",
        CH05,
        [
            (
                "            self.waiting.appendleft(request)\n        return request",
                "            self.waiting.append(request)\n        return request",
            )
        ],
        "test_recompute_puts_it_first_in_line_with_nothing_computed",
        "first in line",
        still_passes=[
            "test_preempt_takes_the_request_admitted_last",
            "test_swap_lists_its_blocks_and_keeps_its_progress",
        ],
    ),
    Mistake(
        "swapped victims queue behind each other",
        CH05,
        [
            (
                "            self.num_swapped_out += 1\n            self.swapped.appendleft(request)\n",
                "            self.num_swapped_out += 1\n            self.swapped.append(request)\n",
            )
        ],
        "test_two_victims_leave_the_earlier_admitted_first",
        "FRONT of its queue",
        still_passes=["test_swap_lists_its_blocks_and_keeps_its_progress"],
    ),
    # chapter 5's kernels, puzzle 1: one_block_attention_kernel
    Mistake(
        "puzzle 1: GQA ignored: query head h reads KV head h",
        CH05K,
        [
            (
                "    head = tl.program_id(0)\n    kv_head = head // GROUP\n",
                "    head = tl.program_id(0)\n    kv_head = head\n",
            )
        ],
        "test_one_block_grouped_query_heads",
        "h // GROUP",
        still_passes=["test_one_block_attention", "test_one_block_reads_block_id", "test_one_block_applies_scale"],
    ),
    Mistake(
        "puzzle 1: reads block 0 whatever block_id",
        CH05K,
        [("    offs = block_id * stride_block + slots", "    offs = slots")],
        "test_one_block_reads_block_id",
        "block_id * stride_block",
        still_passes=["test_one_block_attention", "test_one_block_grouped_query_heads"],
    ),
    Mistake(
        "puzzle 1: 1/sqrt(HEAD_DIM) instead of the scale argument",
        CH05K,
        [("axis=1) * scale  # [BLOCK_SIZE]", "axis=1) * (1.0 / HEAD_DIM ** 0.5)  # [BLOCK_SIZE]")],
        "test_one_block_applies_scale",
        "`scale` argument",
        still_passes=[
            "test_one_block_attention",
            "test_one_block_grouped_query_heads",
            "test_one_block_reads_block_id",
        ],
    ),
    # chapter 5's kernels, puzzle 2: paged_decode_kernel
    Mistake(
        "puzzle 2: masks the loads but not the scores",
        CH05K,
        [(DECODE_MASK, "")],
        "test_decode_context_not_a_multiple_of_block_size",
        "a masked load alone",
        still_passes=["test_decode_one_block", "test_decode_follows_the_block_table"],
    ),
    Mistake(
        "puzzle 2: no mask: reads the last block's stale slots",
        CH05K,
        [
            (DECODE_MASK, ""),
            ("k = tl.load(k_ptr + offs, mask=in_context[:, None], other=0.0)", "k = tl.load(k_ptr + offs)"),
            ("v = tl.load(v_ptr + offs, mask=in_context[:, None], other=0.0)", "v = tl.load(v_ptr + offs)"),
        ],
        "test_decode_context_not_a_multiple_of_block_size",
        "positions >= seq_len",
        still_passes=["test_decode_one_block", "test_decode_follows_the_block_table"],
    ),
    Mistake(
        "puzzle 2: the logical block number used as the physical block",
        CH05K,
        [("physical = tl.load(block_tables_ptr + seq * stride_table + b).to(tl.int64)", "physical = b")],
        "test_decode_follows_the_block_table",
        "PHYSICAL block block_tables[seq, b]",
    ),
    Mistake(
        "puzzle 2: every sequence reads sequence 0's block table",
        CH05K,
        [("physical = tl.load(block_tables_ptr + seq * stride_table + b)", "physical = tl.load(block_tables_ptr + b)")],
        "test_decode_batch_of_sequences",
        "OWN sequence",
        still_passes=["test_decode_one_block", "test_decode_follows_the_block_table"],
    ),
    Mistake(
        "puzzle 2: GQA as h // num_kv_heads",
        CH05K,
        [
            (
                "    head = tl.program_id(1)\n    kv_head = head // GROUP\n",
                "    head = tl.program_id(1)\n    kv_head = head // (num_heads // GROUP)\n",
            )
        ],
        "test_decode_grouped_query_heads",
        "h // GROUP",
        still_passes=["test_decode_large_scores"],
    ),
    Mistake(
        "puzzle 2: no running max: exp of the raw scores",
        CH05K,
        [
            ("        alpha = tl.exp(m - m_new)", "        alpha = 1.0"),
            ("p = tl.exp(scores - m_new)", "p = tl.exp(scores)"),
        ],
        "test_decode_large_scores",
        "exp(90) overflows",
        still_passes=[
            "test_decode_one_block",
            "test_decode_context_not_a_multiple_of_block_size",
            "test_decode_follows_the_block_table",
            "test_decode_batch_of_sequences",
            "test_decode_grouped_query_heads",
        ],
    ),
    Mistake(
        "puzzle 2: rescales l but not acc when the max grows",
        CH05K,
        [("acc = acc * alpha + tl.sum(", "acc = acc + tl.sum(")],
        "test_decode_large_scores",
        "BOTH l and acc",
        still_passes=["test_decode_one_block"],
    ),
    # chapter 5's kernels, puzzle 3: ragged_paged_kernel
    Mistake(
        "puzzle 3: not causal: every query sees the whole sequence",
        CH05K,
        [
            (
                "        visible = seq_len - q_len + j + 1  # keys at positions 0 .. its own\n",
                "        visible = seq_len\n",
            )
        ],
        "test_ragged_one_prefill",
        "up to its own",
    ),
    Mistake(
        "puzzle 3: query j at position j, as if nothing were cached",
        CH05K,
        [
            (
                "        visible = seq_len - q_len + j + 1  # keys at positions 0 .. its own\n",
                "        visible = j + 1\n",
            )
        ],
        "test_ragged_chunk_after_cached_tokens",
        "NEWEST tokens",
        still_passes=["test_ragged_one_prefill"],
    ),
    Mistake(
        "puzzle 3: the query's row from its sequence number, not query_start_loc",
        CH05K,
        [
            (
                "        q_offs = ((q_start + j) * num_heads + head) * HEAD_DIM + dims\n",
                "        q_offs = ((seq + j) * num_heads + head) * HEAD_DIM + dims\n",
            )
        ],
        "test_ragged_mixed_batch",
        "query_start_loc[seq] + j",
        still_passes=["test_ragged_one_prefill", "test_ragged_chunk_after_cached_tokens"],
    ),
    # chapter 6: MyChunkedScheduler.schedule
    Mistake(
        "an admitted prompt's tokens are not taken from the budget",
        CH06,
        [(ADMIT_BUDGET, "")],
        "test_never_exceeds_the_budget",
        "running and admitted alike",
    ),
    Mistake(
        "a new prompt is admitted only when it fits with room to spare (< instead of <=)",
        CH06,
        [
            (
                FIRST_OF_QUEUE,
                "                    if queue[0].num_tokens - queue[0].num_computed_tokens >= budget:\n"
                "                        break\n" + FIRST_OF_QUEUE,
            )
        ],
        "test_prompt_of_exactly_the_budget",
        "exactly the budget",
    ),
    Mistake(
        "a new prompt must fit whole in the budget left (no first chunk)",
        CH06,
        [
            (
                FIRST_OF_QUEUE,
                "                    if queue[0].num_tokens - queue[0].num_computed_tokens > budget:\n"
                "                        break\n" + FIRST_OF_QUEUE,
            )
        ],
        "test_prompt_one_token_longer_than_the_budget",
        "starts with a chunk",
    ),
    Mistake(
        "running prompts before decodes",
        CH06,
        [("for request in decodes + prefills:", "for request in prefills + decodes:")],
        "test_decodes_are_never_starved_by_a_long_prompt",
        "Decodes never starve",
    ),
    Mistake(
        "long_prefill_token_threshold ignored",
        CH06,
        [
            (
                "            if self.long_prefill_token_threshold > 0:\n"
                "                n = min(n, self.long_prefill_token_threshold)\n",
                "",
            )
        ],
        "test_long_prefill_token_threshold_caps_a_chunk",
        "long_prefill_token_threshold",
        still_passes=["test_never_exceeds_the_budget", "test_decodes_are_never_starved_by_a_long_prompt"],
    ),
    Mistake(
        "a prompt's chunk counts its tokens from 0, not from num_computed_tokens",
        CH06,
        [
            (
                "            n = request.num_tokens - request.num_computed_tokens\n",
                "            n = request.num_tokens\n",
            )
        ],
        "test_a_chunked_prompt_generates_the_naive_engines_tokens",
        "NOT computed yet",
    ),
    Mistake(
        "admits while a slot is free, budget or not (0-token plans)",
        CH06,
        [("while queue and budget > 0 and len(self.running)", "while queue and len(self.running)")],
        "test_a_budget_of_one_token",
        "while budget is left",
    ),
    Mistake(
        "swapped requests are never resumed",
        CH06,
        [("            for queue in (self.swapped, self.waiting):\n", "            for queue in (self.waiting,):\n")],
        "test_keeps_the_contract_under_pool_pressure_and_arrivals",
        "bring swapped and waiting requests in",
        message_says="no progress",
        still_passes=["test_never_exceeds_the_budget", "test_decodes_are_never_starved_by_a_long_prompt"],
    ),
    # chapter 7: MyPrefixCachingBlockManager
    Mistake(
        "names a block by its own tokens, not the name of the block before it",
        CH07,
        [
            ("            parent = hash_block(parent, token_ids[", "            parent = hash_block(None, token_ids["),
            ("            parent = hash_block(parent, request.", "            parent = hash_block(None, request."),
        ],
        "test_a_prompt_that_differs_in_an_early_block_misses_every_block_after_it",
        "the block before it",
        still_passes=[
            "test_hash_block_depends_on_the_tokens_and_the_block_before",
            "test_finds_the_cached_blocks_of_a_shared_prefix",
        ],
    ),
    Mistake(
        "hash_block ignores the parent",
        CH07,
        [("    return hash((parent_hash, tuple(token_ids)))\n", "    return hash(tuple(token_ids))\n")],
        "test_hash_block_depends_on_the_tokens_and_the_block_before",
        "parent",
        still_passes=[  # a learner's run drew the hints of these three, which blamed eviction and free order
            "test_finds_the_cached_blocks_of_a_shared_prefix",
            "test_eviction_takes_the_least_recently_freed_block_first",
            "test_a_request_frees_its_last_block_first",
            "test_a_held_block_is_never_evicted",
        ],
    ),
    Mistake(
        "a block's parent name taken from the previous block's stored name, which may be none",
        CH07,
        [
            (
                "            parent = hash_block(parent, request.token_ids_slice(",
                "            stored = self.block_hashes[table[i - 1]] if i else None\n"
                "            parent = hash_block(stored, request.token_ids_slice(",
            )
        ],
        "test_a_block_after_an_unnamed_one_is_named_after_its_whole_prefix",
        "stored on the previous block",
        still_passes=["test_finds_the_cached_blocks_of_a_shared_prefix", "test_a_shared_block_is_held_once_per_table"],
    ),
    Mistake(
        "names the partial last block too (ceil)",
        CH07,
        [
            (
                "min(request.num_computed_tokens // self.block_size, len(table))",
                "min(self.num_blocks_for(request.num_computed_tokens), len(table))",
            )
        ],
        "test_a_partial_block_is_never_named_nor_found",
        "FULL blocks",
        still_passes=["test_a_prompt_that_differs_in_an_early_block_misses_every_block_after_it"],
    ),
    Mistake(
        "a shared block's count is set to 1, not raised by 1",
        CH07,
        [("            self.ref_counts[block] += 1\n", "            self.ref_counts[block] = 1\n")],
        "test_a_shared_block_is_held_once_per_table",
        "+= 1, not = 1",
        still_passes=[
            "test_finds_the_cached_blocks_of_a_shared_prefix",
            "test_a_hit_takes_a_freed_block_out_of_the_free_queue",
        ],
    ),
    Mistake(
        "free gives back a shared block that another request still holds",
        CH07,
        [(RELEASE, "            self.ref_counts[block] -= 1\n            self.free_block_ids.append(block)\n")],
        "test_freeing_a_shared_block_keeps_it_for_the_other_holder",
        "still belongs to the other",
        still_passes=[
            "test_a_shared_block_is_held_once_per_table",
            "test_eviction_takes_the_least_recently_freed_block_first",
            "test_a_request_frees_its_last_block_first",
        ],
    ),
    Mistake(
        "the most recently freed block is evicted first",
        CH07,
        [
            (
                "                self.free_block_ids.append(block)\n",
                "                self.free_block_ids.appendleft(block)\n",
            )
        ],
        "test_eviction_takes_the_least_recently_freed_block_first",
        "least recently FREED",
        still_passes=["test_a_shared_block_is_held_once_per_table", "test_a_partial_block_is_never_named_nor_found"],
    ),
    Mistake(
        "evicts the most recently freed block: pop() for popleft()",
        CH07,
        [("        block = self.free_block_ids.popleft()\n", "        block = self.free_block_ids.pop()\n")],
        "test_eviction_takes_the_least_recently_freed_block_first",
        "least recently FREED",
        message_says="take_free_block",  # where the tables first differ, named in every failing test's message
    ),
    Mistake(
        "evicts the block allocated first (the lowest id), not the least recently freed",
        CH07,
        [
            (
                "        block = self.free_block_ids.popleft()\n",
                "        block = min(self.free_block_ids)\n        self.free_block_ids.remove(block)\n",
            )
        ],
        "test_eviction_takes_the_least_recently_freed_block_first",
        "allocated first",
        still_passes=["test_a_shared_block_is_held_once_per_table", "test_a_partial_block_is_never_named_nor_found"],
    ),
    Mistake(
        "a request's first block is freed first",
        CH07,
        [("        for block in reversed(table):\n", "        for block in table:\n")],
        "test_a_request_frees_its_last_block_first",
        "LAST block first",
        still_passes=["test_eviction_takes_the_least_recently_freed_block_first", "test_a_held_block_is_never_evicted"],
    ),
    Mistake(
        "a hit on a freed block leaves it on the free queue",
        CH07,
        [(UNQUEUE, "")],
        "test_a_hit_takes_a_freed_block_out_of_the_free_queue",
        "OUT of the free queue",
        still_passes=[
            "test_a_shared_block_is_held_once_per_table",
            "test_freeing_a_shared_block_keeps_it_for_the_other_holder",
        ],
    ),
    Mistake(
        "eviction forgets the oldest name, whoever holds its block",
        CH07,
        [
            (
                EVICT,
                "        block = self.free_block_ids.popleft()\n"
                "        if self.cached_block_ids:  # the name cached longest ago\n"
                "            oldest = next(iter(self.cached_block_ids))\n"
                "            self.block_hashes[self.cached_block_ids.pop(oldest)] = None\n",
            )
        ],
        "test_a_held_block_is_never_evicted",
        "never evicted",
        still_passes=["test_a_shared_block_is_held_once_per_table"],
    ),
    Mistake(
        "reset forgets the names of held blocks too",
        CH07,
        [("        if self.num_free_blocks < self.num_blocks:\n            return False\n", "")],
        "test_reset_prefix_cache_forgets_every_name_only_when_no_block_is_held",
        "change nothing and return False",
    ),
    # chapter 8: measured_slice and queue_grew
    Mistake(
        "rounds the trimmed requests to the nearest",
        CH08,
        [
            (
                "    return slice(int(num_requests * warmup), num_requests - int(num_requests * cooldown))\n",
                "    return slice(round(num_requests * warmup), num_requests - round(num_requests * cooldown))\n",
            )
        ],
        "test_measured_slice_rounds_down",
        "rounded DOWN",
        still_passes=["test_measured_slice_leaves_out_warmup_and_cooldown"],
    ),
    Mistake(
        "trims the cool-down from the front too",
        CH08,
        [
            (
                "    return slice(int(num_requests * warmup), num_requests - int(num_requests * cooldown))\n",
                "    return slice(int(num_requests * (warmup + cooldown)), num_requests)\n",
            )
        ],
        "test_measured_slice_leaves_out_warmup_and_cooldown",
        "the last cooldown",
        still_passes=["test_measured_slice_refuses_fractions_that_leave_nothing"],
    ),
    Mistake(
        "accepts fractions that leave nothing to measure",
        CH08,
        [("    if not (0 <= warmup < 1 and 0 <= cooldown < 1 and warmup + cooldown < 1):\n", "    if False:\n")],
        "test_measured_slice_refuses_fractions_that_leave_nothing",
        "raise ValueError",
        still_passes=["test_measured_slice_leaves_out_warmup_and_cooldown", "test_measured_slice_rounds_down"],
    ),
    Mistake(
        "averages the counts of the steps, not over time",
        CH08,
        [
            (
                "    quarter = (end - start) / 4\n",
                "    def time_average(a, b):  # noqa: F811 -- one vote per step\n"
                "        inside = [n for t, n in waiting if a <= t < b]\n"
                "        return sum(inside) / len(inside) if inside else 0.0\n"
                "\n"
                "    quarter = (end - start) / 4\n",
            )
        ],
        "test_queue_grew_averages_over_time",
        "TIME averages",
        still_passes=["test_queue_grew_needs_more_than_chance"],
    ),
    Mistake(
        "forgets the count set before the quarter starts",
        CH08,
        [
            (
                "            if time <= a:\n                count = n\n            elif time < b:\n",
                "            if a <= time < b:  # only the pairs inside the quarter\n",
            )
        ],
        "test_queue_grew_counts_across_the_quarters_edges",
        "at or before the quarter's start",
        still_passes=["test_queue_grew_averages_over_time", "test_queue_grew_needs_more_than_chance"],
    ),
    Mistake(
        "any growth counts",
        CH08,
        [
            (
                "    return last - first > max(3, 0.05 * num_requests), first, last\n",
                "    return last > first, first, last\n",
            )
        ],
        "test_queue_grew_needs_more_than_chance",
        "MORE than 3 requests",
        still_passes=["test_queue_grew_averages_over_time", "test_queue_grew_counts_across_the_quarters_edges"],
    ),
    # chapter 8: request_is_good
    Mistake(
        "ITL judged by the longest gap",
        CH08,
        [("sum(itls) / len(itls) > slos", "max(itls) > slos")],
        "test_request_is_good_itl_is_the_mean_gap",
        "not its longest gap",
        still_passes=[
            "test_request_is_good_ttft",
            "test_request_is_good_e2e",
            "test_request_is_good_one_token_request",
            "test_request_is_good_ignores_metrics_without_a_target",
        ],
    ),
    Mistake(
        "ITL judged by the sum of the gaps",
        CH08,
        [("sum(itls) / len(itls) > slos", "sum(itls) > slos")],
        "test_request_is_good_itl_is_the_mean_gap",
        "nor their sum",
        still_passes=["test_request_is_good_ttft", "test_request_is_good_one_token_request"],
    ),
    Mistake(
        "a TTFT equal to its target breaks it (>=)",
        CH08,
        [('ttft > slos["ttft"]', 'ttft >= slos["ttft"]')],
        "test_request_is_good_ttft",
        "AT MOST",
        still_passes=[
            "test_request_is_good_itl_is_the_mean_gap",
            "test_request_is_good_e2e",
            "test_request_is_good_one_token_request",
        ],
    ),
    Mistake(
        "e2e not checked",
        CH08,
        [('    if "e2e" in slos and e2e > slos["e2e"]:\n        return False\n', "")],
        "test_request_is_good_e2e",
        "e2e",
        still_passes=["test_request_is_good_ttft", "test_request_is_good_itl_is_the_mean_gap"],
    ),
    Mistake(
        "every metric looked up (KeyError when one has no target)",
        CH08,
        [('if "e2e" in slos and e2e > slos["e2e"]:', 'if e2e > slos["e2e"]:')],
        "test_request_is_good_ignores_metrics_without_a_target",
        "absent from the dict",
        message_says="KeyError",
    ),
    Mistake(
        "a metric without a target gets a target of 0",
        CH08,
        [(ITL_CHECK, '    if itls and sum(itls) / len(itls) > slos.get("itl", 0):\n')],
        "test_request_is_good_ignores_metrics_without_a_target",
        "default of 0",
        still_passes=["test_request_is_good_itl_is_the_mean_gap", "test_request_is_good_one_token_request"],
    ),
    Mistake(
        "divides by zero on a one-token request",
        CH08,
        [('"itl" in slos and itls and sum(', '"itl" in slos and sum(')],
        "test_request_is_good_one_token_request",
        "Don't divide",
        message_says="ZeroDivisionError",
        still_passes=[
            "test_request_is_good_itl_is_the_mean_gap",
            "test_request_is_good_ignores_metrics_without_a_target",
        ],
    ),
    Mistake(
        "a one-token request's NaN mean gap compared with <=",
        CH08,
        [
            (
                ITL_CHECK,
                '    if "itl" in slos and not ((sum(itls) / len(itls) if itls else float("nan")) <= slos["itl"]):\n',
            )
        ],
        "test_request_is_good_one_token_request",
        "NaN",
        still_passes=["test_request_is_good_itl_is_the_mean_gap", "test_request_is_good_e2e"],
    ),
    # chapter 6, part 2: choose_token_budget
    Mistake(
        "the 95th-percentile gap held to the target, not the worst",
        CH06B,
        [
            (
                "        return max(max(o.metrics.itl, default=0.0) for o in run.outputs)\n",
                "        gaps = [g for o in run.outputs for g in o.metrics.itl]\n"
                '        return float(__import__("numpy").percentile(gaps, 95))\n',
            )
        ],
        "test_meets_the_itl_target",
        "not the 95th percentile",
        still_passes=["test_returns_engine_options"],
    ),
    Mistake(
        "a safe small budget, whatever the target",
        CH06B,
        [("    good, bad = smallest, ", '    return {"max_num_batched_tokens": 512}\n    good, bad = smallest, ')],
        "test_gives_the_best_ttft_the_target_allows",
        "LARGEST budget",
        still_passes=["test_meets_the_itl_target", "test_refuses_a_target_no_budget_meets"],
    ),
    Mistake(
        "the smallest budget returned when even it misses the target",
        CH06B,
        [
            (
                '        raise ValueError(f"no token budget of {smallest} or more meets itl_target={itl_target} s")\n',
                '        return {"max_num_batched_tokens": smallest}\n',
            )
        ],
        "test_refuses_a_target_no_budget_meets",
        "raise ValueError",
        still_passes=["test_meets_the_itl_target"],
    ),
    Mistake(
        "the budget returned as a number",
        CH06B,
        [('    return {"max_num_batched_tokens": good}\n', "    return good\n")],
        "test_returns_engine_options",
        "as a dict",
    ),
    # chapter 8b: guaranteed-no-evict admission
    Mistake(
        "a request counted by its prompt, as vLLM admits",
        CH08N,
        [(NEED, "            need = bm.num_blocks_for(request.num_prompt_tokens)\n")],
        "test_counts_a_requests_whole_length",
        "whole length",
        still_passes=["test_keeps_to_max_num_seqs"],
    ),
    Mistake(
        "the running requests' growth not counted",
        CH08N,
        [(RUNNING_NEED, "        free = bm.num_free_blocks\n")],
        "test_counts_what_the_running_requests_may_still_take",
        "may still take",
        still_passes=["test_keeps_to_max_num_seqs"],
    ),
    Mistake(
        "each admission compared with the same free count",
        CH08N,
        [("            free -= need\n", "")],
        "test_counts_the_requests_admitted_in_the_same_step",
        "admitted earlier in the same step",
        still_passes=["test_counts_what_the_running_requests_may_still_take", "test_keeps_to_max_num_seqs"],
    ),
    Mistake(
        "a smaller request let past one that does not fit",
        CH08N,
        [
            (
                ADMIT_WHILE + "            request = self.waiting[0]\n",
                "        for request in list(self.waiting):\n"
                "            if len(self.running) >= self.max_num_seqs:\n"
                "                break\n",
            ),
            (
                "                break\n            free -= need\n",
                "                continue\n            free -= need\n",
            ),
            (
                "            self.admit_first(self.waiting,",
                "            self.waiting.remove(request)\n"
                "            self.waiting.appendleft(request)\n"
                "            self.admit_first(self.waiting,",
            ),
        ],
        "test_nobody_jumps_the_queue",
        "does not skip ahead",
        still_passes=["test_counts_the_requests_admitted_in_the_same_step", "test_keeps_to_max_num_seqs"],
    ),
    Mistake(
        "an exact fit refused",
        CH08N,
        [("            if need > free:\n", "            if need >= free:\n")],
        "test_a_request_that_exactly_fits_is_admitted",
        "exactly the blocks left",
        still_passes=["test_counts_a_requests_whole_length", "test_keeps_to_max_num_seqs"],
    ),
    Mistake(
        "max_num_seqs ignored",
        CH08N,
        [(ADMIT_WHILE, "        while self.waiting:\n")],
        "test_keeps_to_max_num_seqs",
        "max_num_seqs",
        still_passes=["test_counts_a_requests_whole_length"],
    ),
    # chapter 9: decode_step_floor and crossover_batch
    Mistake(
        "one FLOP per weight per token",
        CH09,
        [("    flops = 2 * num_params * batch_size\n", "    flops = num_params * batch_size\n")],
        "test_floor_counts_two_flops_per_parameter_per_token",
        "one multiply and one add",
        still_passes=[
            "test_floor_reads_the_weights_once_for_the_whole_batch",
            "test_floor_adds_every_requests_kv_cache",
        ],
    ),
    Mistake(
        "the weights read once per request",
        CH09,
        [("    bytes_ = num_params * bytes_per_param + ", "    bytes_ = batch_size * num_params * bytes_per_param + ")],
        "test_floor_reads_the_weights_once_for_the_whole_batch",
        "read once per step",
        still_passes=["test_floor_counts_two_flops_per_parameter_per_token"],
    ),
    Mistake(
        "no KV cache reads",
        CH09,
        [(" + batch_size * context_len * kv_bytes_per_token\n", "\n")],
        "test_floor_adds_every_requests_kv_cache",
        "each request reads its own cache",
        still_passes=["test_floor_counts_two_flops_per_parameter_per_token"],
    ),
    Mistake(
        "the two times added up",
        CH09,
        [('        "seconds": max(compute_s, memory_s),\n', '        "seconds": compute_s + memory_s,\n')],
        "test_floor_is_the_slower_of_compute_and_memory",
        "not their sum",
        still_passes=["test_floor_adds_every_requests_kv_cache"],
    ),
    Mistake(
        "a tie called memory-bound",
        CH09,
        [('"compute" if compute_s >= memory_s else "memory"', '"compute" if compute_s > memory_s else "memory"')],
        "test_floor_is_the_slower_of_compute_and_memory",
        "a tie is 'compute'",
    ),
    Mistake(
        "the crossover without the caches' reads",
        CH09,
        crossover_returning("max(1, math.ceil(weights_s / (2 * num_params / peak_flops)))"),
        "test_crossover_with_a_cache",
        "each request also reads its own cache",
        still_passes=["test_crossover_without_a_cache"],
    ),
    Mistake(
        "the crossover rounded down",
        CH09,
        crossover_returning("max(1, int(weights_s / per_request_s))"),
        "test_crossover_without_a_cache",
        "round up",
    ),
    Mistake(
        "infinity for a batch that never comes",
        CH09,
        [("        return None  # each request", "        return math.inf  # each request")],
        "test_crossover_none_when_the_cache_costs_as_much_as_the_arithmetic",
        "return None",
        still_passes=["test_crossover_with_a_cache", "test_crossover_is_the_first_compute_bound_batch"],
    ),
    # chapter 10: the Megatron split of one MLP layer
    Mistake(
        "gate and up cut by their input features",
        CH10,
        [
            (GATE_ROWS, "                gate_weight=gate.weight.detach().chunk(tp_size, dim=1)[rank],"),
            (UP_ROWS, "                up_weight=up.weight.detach().chunk(tp_size, dim=1)[rank],\n"),
        ],
        "test_split_cuts_gate_and_up_by_their_output_features",
        "OUTPUT features",
        message_says="cuts the input features",
        still_passes=[
            "test_split_cuts_down_proj_by_its_input_features",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_all_reduce_sums_the_partials",
            "test_parallel_mlp_all_reduces_every_ranks_partial",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "down_proj cut by its output features",
        CH10,
        [(DOWN_COLUMNS, "                down_weight=down.weight.detach().chunk(tp_size, dim=0)[rank],")],
        "test_split_cuts_down_proj_by_its_input_features",
        "INPUT features",
        message_says="cuts the output features",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_all_reduce_sums_the_partials",
            "test_parallel_mlp_all_reduces_every_ranks_partial",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "up_proj's slices taken in the reverse rank order",
        CH10,
        [
            (UP_ROWS, "                up_weight=up.weight.detach().chunk(tp_size)[tp_size - 1 - rank],\n"),
            (
                UP_BIAS,
                "                up_bias=None if up.bias is None else "
                "up.bias.detach().chunk(tp_size)[tp_size - 1 - rank],\n",
            ),
        ],
        "test_split_gives_each_rank_the_same_channels_in_every_weight",
        "same channels",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_split_cuts_down_proj_by_its_input_features",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_all_reduce_sums_the_partials",
            "test_parallel_mlp_all_reduces_every_ranks_partial",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "the ranks numbered backwards (the sum still right)",
        CH10,
        [
            (
                "        mine = slice(rank * step, (rank + 1) * step)",
                "        mine = slice(size - (rank + 1) * step, size - rank * step)",
            )
        ],
        "test_split_gives_each_rank_the_same_channels_in_every_weight",
        "the r-th slice in rank order",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_split_cuts_down_proj_by_its_input_features",
            "test_parallel_mlp_adds_down_projs_bias_once",
            "test_split_then_parallel_equals_the_layer",
        ],
    ),
    Mistake(
        "silu applied after the product",
        CH10,
        [
            (
                SWIGLU,
                "    h = F.silu(F.linear(x, shard.gate_weight, shard.gate_bias) * F.linear(x, shard.up_weight, "
                "shard.up_bias))\n",
            )
        ],
        "test_shard_forward_is_swiglu_on_the_ranks_channels",
        "silu on the gate's output alone",
        message_says="applies silu to the product",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_split_cuts_down_proj_by_its_input_features",
            "test_split_gives_each_rank_the_same_channels_in_every_weight",
            "test_all_reduce_sums_the_partials",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "silu applied to up instead of gate",
        CH10,
        [
            (
                SWIGLU,
                "    h = F.linear(x, shard.gate_weight, shard.gate_bias) * F.silu(F.linear(x, shard.up_weight, "
                "shard.up_bias))\n",
            )
        ],
        "test_shard_forward_is_swiglu_on_the_ranks_channels",
        "silu on the gate's output alone",
        message_says="applies silu to up",
    ),
    Mistake(
        "all_reduce returns the partials' mean",
        CH10,
        [("    return total\n", "    return total / len(partials)\n")],
        "test_all_reduce_sums_the_partials",
        "not their mean",
        message_says="their mean, not their sum",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "all_reduce returns rank 0's partial",
        CH10,
        [("    return total\n", "    return partials[0]\n")],
        "test_all_reduce_sums_the_partials",
        "not one rank's partial",
        message_says="one rank's partial, not their sum",
    ),
    Mistake(
        "parallel_mlp returns rank 0's partial, with no all-reduce",
        CH10,
        [
            (
                "    out = all_reduce([shard_forward(shard, x) for shard in shards])",
                "    out = shard_forward(shards[0], x)",
            )
        ],
        "test_parallel_mlp_all_reduces_every_ranks_partial",
        "every rank's partial",
        message_says="one rank's partial, not their sum",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_split_gives_each_rank_the_same_channels_in_every_weight",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_all_reduce_sums_the_partials",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "down_proj's bias added in every rank's partial",
        CH10,
        [(PARTIAL, "    return F.linear(h, shard.down_weight, shard.down_bias)"), (BIAS_ONCE, "    return out")],
        "test_parallel_mlp_adds_down_projs_bias_once",
        "not in every rank's partial",
        message_says="added 2 times",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_split_cuts_down_proj_by_its_input_features",
            "test_split_gives_each_rank_the_same_channels_in_every_weight",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_all_reduce_sums_the_partials",
            "test_parallel_mlp_all_reduces_every_ranks_partial",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
    Mistake(
        "down_proj's bias never added",
        CH10,
        [(BIAS_ONCE, "    return out")],
        "test_parallel_mlp_adds_down_projs_bias_once",
        "not left out",
        message_says="bias is missing",
        still_passes=["test_parallel_mlp_all_reduces_every_ranks_partial"],
    ),
    Mistake(
        "a tp_size that does not divide is not refused",
        CH10,
        [(DIVIDES, "")],
        "test_split_refuses_a_tp_size_that_does_not_divide",
        "raise ValueError",
        message_says="raised no ValueError",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_parallel_mlp_adds_down_projs_bias_once",
            "test_split_then_parallel_equals_the_layer",
        ],
    ),
    Mistake(
        "a ValueError that names neither number",
        CH10,
        [(DIVIDES, '    if size % tp_size:\n        raise ValueError("tp_size must divide the intermediate size")\n')],
        "test_split_refuses_a_tp_size_that_does_not_divide",
        "names tp_size and the intermediate size",
        message_says="must name tp_size",
    ),
    Mistake(
        "split_mlp reads biases a layer without biases does not have",
        CH10,
        [
            ("gate_bias=None if gate.bias is None else gate.bias.detach()[mine]", "gate_bias=gate.bias.detach()[mine]"),
            (UP_BIAS, "                up_bias=up.bias.detach()[mine],\n"),
            ("down_bias=None if down.bias is None else down.bias.detach(),", "down_bias=down.bias.detach(),"),
        ],
        "test_split_then_parallel_equals_the_layer",
        "its biases are None",
        message_says="NoneType",
        still_passes=[
            "test_split_cuts_gate_and_up_by_their_output_features",
            "test_split_cuts_down_proj_by_its_input_features",
            "test_split_gives_each_rank_the_same_channels_in_every_weight",
            "test_shard_forward_is_swiglu_on_the_ranks_channels",
            "test_all_reduce_sums_the_partials",
            "test_parallel_mlp_all_reduces_every_ranks_partial",
            "test_parallel_mlp_adds_down_projs_bias_once",
            "test_split_refuses_a_tp_size_that_does_not_divide",
        ],
    ),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.chapter[:4]}: {m.what}")
def test_a_plausible_mistake_fails_the_test_whose_hint_names_it(mistake):
    learner = InProcessLearner(edited_solution(mistake.chapter, mistake.edits), mistake.chapter)
    test = grading_test(mistake.chapter, mistake.test)
    assert mistake.hint_says in hint_of(test)
    with pytest.raises((AssertionError, LearnerError)) as failure:
        test(learner)
    assert mistake.message_says in str(failure.value)
    for name in mistake.still_passes:
        grading_test(mistake.chapter, name)(learner)


VARIANTS = {
    "ch06: another design: new prompts admitted before the running prompts' next chunks": (
        CH06,
        [
            ("for request in decodes + prefills:", "for request in decodes:"),
            (
                "        return self.finish_plan(plan)\n",
                "        for request in prefills:\n"
                "            if budget == 0:\n                break\n"
                "            if request.status is not RequestStatus.RUNNING:\n                continue\n"
                "            n = tokens_for(request)\n"
                "            budget += self.allocate_or_preempt(request, n, plan)\n"
                "            if request.status is RequestStatus.RUNNING:\n"
                "                plan.scheduled.append(request)\n"
                "                plan.num_scheduled_tokens[request.request_id] = n\n"
                "                budget -= n\n"
                "        return self.finish_plan(plan)\n",
            ),
        ],
    ),
    "ch05: preempt by remove and one branch per mode": (
        CH05,
        [
            (
                "        request = self.running.pop()\n        self.release_slot(request)\n",
                "        request = self.running[len(self.running) - 1]\n        self.running.remove(request)\n"
                "        self.release_slot(request)\n",
            ),
            (
                '        if self.preemption_mode == "swap":\n            self.num_swapped_out += 1\n'
                "            self.swapped.appendleft(request)\n        else:\n"
                "            request.num_computed_tokens = 0\n            self.waiting.appendleft(request)\n",
                '        queue = self.swapped if self.preemption_mode == "swap" else self.waiting\n'
                "        if queue is self.swapped:\n            self.num_swapped_out += 1\n"
                "        else:\n            request.num_computed_tokens = 0\n        queue.insert(0, request)\n",
            ),
        ],
    ),
    "ch01: numpy itl, hidden[-1] and .item()": (
        CH01,
        [
            (
                '"itl": [b - a for a, b in zip(token_times, token_times[1:])],',
                '"itl": __import__("numpy").diff(token_times),',
            ),
            (
                "token = int(model.compute_logits(hidden[-1:]).argmax(dim=-1))",
                "token = model.compute_logits(hidden[-1]).argmax().item()",
            ),
        ],
    ),
    "ch01: tuple itl, a position counter": (
        CH01,
        [
            (
                '"itl": [b - a for a, b in zip(token_times, token_times[1:])],',
                '"itl": tuple(b - a for a, b in zip(token_times, token_times[1:])),',
            ),
            (
                POSITIONS,
                "start = len(prompt_token_ids) + len(output) - 1 if output else 0\n"
                "        positions = torch.arange(start, start + len(ids), device=param.device)",
            ),
        ],
    ),
    "ch02: nested lists, a list pair": (
        CH02,
        [
            (
                "return input_ids, offsets.clamp(min=0), offsets >= 0",
                "return input_ids.tolist(), offsets.clamp(min=0).tolist(), (offsets >= 0).tolist()",
            ),
            ("return min(num_waiting, max_num_seqs), None", "return [min(num_waiting, max_num_seqs), None]"),
        ],
    ),
    "ch02: numpy arrays": (
        CH02,
        [
            (
                "return input_ids, offsets.clamp(min=0), offsets >= 0",
                "return input_ids.numpy(), offsets.clamp(min=0).numpy(), (offsets >= 0).numpy()",
            ),
        ],
    ),
    "ch03: the plan built in a loop, positional arguments": (
        CH03,
        [
            (
                "        return SchedulerOutput(\n            scheduled=list(self.running),\n"
                "            num_scheduled_tokens={r.request_id: r.num_tokens - r.num_computed_tokens for r in "
                "self.running},\n"
                "            admitted_ids=admitted,\n            slots=dict(self.slots),\n        )\n",
                "        tokens = {}\n"
                "        for r in self.running:\n"
                "            tokens[r.request_id] = r.num_tokens - r.num_computed_tokens\n"
                "        return SchedulerOutput(list(self.running), tokens, admitted, slots=self.slots)\n",
            ),
        ],
    ),
    "ch04: int64 offsets, split, a loop per sequence": (
        CH04,
        [
            (
                "cu_seqlens = torch.tensor([0, *accumulate(len(seq) for seq in seqs)], dtype=torch.int32, "
                "device=flat.device)",
                "cu_seqlens = torch.nn.functional.pad(torch.tensor([len(s) for s in seqs], "
                "device=flat.device).cumsum(0), (1, 0))",
            ),
            (
                "    return [flat[start:end] for start, end in zip(bounds, bounds[1:])]",
                "    return tuple(flat.split(cu_seqlens.diff().tolist()))",
            ),
            (
                "    cu_q, cu_k = cu_seqlens_q.to(q.device, torch.long), cu_seqlens_k.to(q.device, torch.long)\n",
                "    out = torch.empty_like(q)\n"
                "    bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(), "
                "cu_seqlens_k.tolist()[1:])\n"
                "    for q0, q1, k0, k1 in bounds:\n"
                "        qi, ki, vi = q[q0:q1], k[k0:k1], v[k0:k1]\n"
                "        ki = ki.repeat_interleave(q.shape[1] // k.shape[1], dim=1)\n"
                "        vi = vi.repeat_interleave(q.shape[1] // k.shape[1], dim=1)\n"
                "        scores = torch.einsum('qhd,khd->hqk', qi, ki) * q.shape[-1] ** -0.5\n"
                "        visible = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(diagonal=(k1 - k0) - (q1 - "
                "q0))\n"
                "        out[q0:q1] = torch.einsum('hqk,khd->qhd', scores.masked_fill(~visible, "
                "float('-inf')).softmax(-1), vi)\n"
                "    return out\n"  # the reference lines after it never run
                "    cu_q, cu_k = cu_seqlens_q.to(q.device, torch.long), cu_seqlens_k.to(q.device, torch.long)\n",
            ),
        ],
    ),
    "ch05: a LIFO free list, a tensor slot mapping": (
        CH05,
        [
            (
                "            table.append(self.free_block_ids.popleft())",
                "            table.append(self.free_block_ids.pop())",
            ),
            (
                SLOTS,
                "    positions = [torch.arange(s, s + n) for s, n in zip(num_computed_tokens, num_scheduled_tokens)]\n"
                "    return torch.cat([torch.tensor(t, dtype=torch.long)[p // block_size] * block_size + p % "
                "block_size\n"
                "                      for t, p in zip(block_tables, positions)])\n" + SLOTS,
            ),  # the reference lines after it never run
        ],
    ),
    "ch05 kernels: exp2, a finite initial max and mask, the scale folded into q": (
        CH05K,
        [
            (
                "p = tl.exp(scores - tl.max(scores, axis=0))",
                "p = tl.exp2((scores - tl.max(scores, axis=0)) * 1.4426950408889634)",
            ),
            ("q = tl.load(q_ptr + q_offs).to(tl.float32)", "q = tl.load(q_ptr + q_offs).to(tl.float32) * scale"),
            ('    m = float("-inf")', "    m = -1.0e30"),
            (
                "        scores = tl.sum(q[None, :] * k, axis=1) * scale\n" + DECODE_MASK,
                "        scores = tl.where(in_context, tl.sum(q[None, :] * k, axis=1), -1.0e30)\n",
            ),
        ],
    ),
    "ch06: a stable sort for decodes first, two admission loops, budget <= 0": (
        CH06,
        [
            (
                "        decodes = [r for r in self.running if r.is_decode]\n"
                "        prefills = [r for r in self.running if not r.is_decode]\n"
                "        for request in decodes + prefills:\n",
                "        for request in sorted(self.running, key=lambda r: not r.is_decode):\n",
            ),
            (NO_BUDGET_LEFT, "            if budget <= 0:\n                break\n"),
            (
                "            for queue in (self.swapped, self.waiting):\n"
                "                if queue is self.waiting and self.swapped:\n"
                "                    break  # a swapped request resumes before any new admission\n"
                "                while queue and budget > 0 and len(self.running) < self.max_num_seqs:\n"
                + FIRST_OF_QUEUE
                + "                    if not self.admit_first(queue, n, plan):\n"
                "                        break\n" + ADMIT_BUDGET,
                "            while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:\n"
                "                n = tokens_for(self.swapped[0])\n"
                "                if not self.admit_first(self.swapped, n, plan):\n"
                "                    break\n"
                "                budget -= n\n"
                "            while not self.swapped and self.waiting and budget > 0 and len(self.running) < "
                "self.max_num_seqs:\n"
                "                n = tokens_for(self.waiting[0])\n"
                "                if self.admit_first(self.waiting, n, plan):\n"
                "                    budget -= n\n"
                "                else:\n"
                "                    break\n",
            ),
        ],
    ),
    "ch06b: budgets tried upward, 10% at a time, until the target breaks": (
        CH06B,
        [
            (
                "    good, bad = smallest, ",
                "    budget = smallest\n"
                "    while worst_gap(int(budget * 1.1) + 1) <= itl_target and budget < 1 << 16:\n"
                "        budget = int(budget * 1.1) + 1\n"
                '    return {"max_num_batched_tokens": budget}\n'
                "    good, bad = smallest, ",
            )
        ],
    ),
    "ch07: an ordered dict as the free queue, sha256 names": (
        CH07,
        [
            ("from collections import deque\n", "import hashlib\nfrom collections import OrderedDict, deque\n"),
            (
                "    return hash((parent_hash, tuple(token_ids)))\n",
                "    data = repr((parent_hash, [int(t) for t in token_ids])).encode()\n"
                '    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")\n',
            ),
            (
                "self.free_block_ids: deque[int] = deque(range(num_blocks))",
                "self.free_block_ids = OrderedDict.fromkeys(range(num_blocks))",
            ),
            ("self.free_block_ids.remove(block)", "del self.free_block_ids[block]"),
            (
                "                self.free_block_ids.append(block)\n",
                "                self.free_block_ids[block] = None\n",
            ),
            (
                "        block = self.free_block_ids.popleft()\n",
                "        block, _ = self.free_block_ids.popitem(last=False)\n",
            ),
        ],
    ),
    "ch07: each request's names kept and extended, a takewhile lookup, a reset by any()": (
        CH07,
        [
            ("from collections import deque\n", "import itertools\nfrom collections import deque\n"),
            (
                "        self.block_hashes: list[int | None] = [None] * num_blocks",
                "        self.request_hashes: dict[str, list[int]] = {}\n"
                "        self.block_hashes: list[int | None] = [None] * num_blocks",
            ),
            (
                "        blocks, parent = [], None\n",
                "        names, parent = [], None\n"
                "        for start in range(0, len(token_ids) // self.block_size * self.block_size, self.block_size):\n"
                "            parent = hash_block(parent, tuple(token_ids[start : start + self.block_size]))\n"
                "            names.append(parent)\n"
                "        found = itertools.takewhile(self.cached_block_ids.__contains__, names)\n"
                "        return [self.cached_block_ids[n] for n in found]\n"
                "        blocks, parent = [], None\n",
            ),  # the reference lines after it never run
            (
                "        self.block_tables[request_id] = list(block_ids)\n",
                "        self.block_tables[request_id] = list(block_ids)\n"
                "        self.request_hashes[request_id] = [self.block_hashes[b] for b in block_ids]\n",
            ),
            (
                "        table, parent = self.block_tables[request.request_id], None\n",
                "        table = self.block_tables[request.request_id]\n"
                "        names = self.request_hashes.setdefault(request.request_id, [])\n"
                "        for i in range(len(names), min(request.num_computed_tokens // self.block_size, len(table))):\n"
                "            tokens = request.token_ids_slice(i * self.block_size, (i + 1) * self.block_size)\n"
                "            names.append(hash_block(names[-1] if names else None, tokens))\n"
                "            if names[-1] not in self.cached_block_ids:\n"
                "                self.cached_block_ids[names[-1]] = table[i]\n"
                "                self.block_hashes[table[i]] = names[-1]\n"
                "        return\n"
                "        table, parent = self.block_tables[request.request_id], None\n",
            ),  # the reference lines after it never run
            (
                "        table = self.block_tables.pop(request.request_id)\n",
                "        table = self.block_tables.pop(request.request_id)\n"
                "        self.request_hashes.pop(request.request_id, None)\n",
            ),
            (
                "        if self.num_free_blocks < self.num_blocks:\n            return False\n"
                "        self.cached_block_ids.clear()\n",
                "        if any(self.ref_counts):\n            return False\n"
                "        for name in list(self.cached_block_ids):\n"
                "            self.block_hashes[self.cached_block_ids.pop(name)] = None\n"
                "        return True\n",
            ),  # the reference lines after it never run
        ],
    ),
    "ch08: all() over slos, fmean; a slice from a range; the averages by integrating piecewise": (
        CH08,
        [
            (
                '    if "ttft" in slos and ttft > slos["ttft"]:\n',
                '    own = {"ttft": ttft, "itl": __import__("statistics").fmean(itls) if itls else 0.0, "e2e": e2e}\n'
                "    return all(own[metric] <= target for metric, target in slos.items())\n"
                '    if "ttft" in slos and ttft > slos["ttft"]:\n',
            ),  # the reference lines after it never run
            (
                "    return slice(int(num_requests * warmup), num_requests - int(num_requests * cooldown))\n",
                "    skip_front, skip_back = int(num_requests * warmup), int(num_requests * cooldown)\n"
                "    kept = range(num_requests)[skip_front : num_requests - skip_back]\n"
                "    return slice(kept.start, kept.stop)\n",
            ),
            (
                "    quarter = (end - start) / 4\n",
                "    def time_average(a, b):  # noqa: F811 -- the same average, from the pieces' edges\n"
                "        edges = [(t, n) for t, n in waiting if a < t < b]\n"
                "        before = [n for t, n in waiting if t <= a]\n"
                "        counts = [before[-1] if before else 0] + [n for _, n in edges]\n"
                "        times = [a] + [t for t, _ in edges] + [b]\n"
                "        return sum(c * (t1 - t0) for c, t0, t1 in zip(counts, times, times[1:])) / (b - a)\n"
                "\n"
                "    quarter = (end - start) / 4\n",
            ),
        ],
    ),
    "ch08: numpy's mean of the gaps; the threshold as two comparisons": (
        CH08,
        [
            (ITL_CHECK, '    if "itl" in slos and len(itls) > 0 and __import__("numpy").mean(itls) > slos["itl"]:\n'),
            (
                "    return last - first > max(3, 0.05 * num_requests), first, last\n",
                "    growth = last - first\n    return bool(growth > 3 and growth > num_requests / 20), first, last\n",
            ),
        ],
    ),
    "ch08b: the running requests' growth counted as they are scheduled": (
        CH08N,
        [
            (RUNNING_NEED, ""),
            (
                "            n = request.num_tokens - request.num_computed_tokens\n",
                "            n = request.num_tokens - request.num_computed_tokens\n"
                "            free -= self.blocks_still_needed(request)  # before its blocks for this step\n",
            ),
            (
                "        for request in self.running:\n",
                "        free = bm.num_free_blocks\n        for request in self.running:\n",
            ),
        ],
    ),
    "ch09: the crossover as a closed form rounded up, with no checks either side; the floor from the ridge point": (
        CH09,
        [(CROSSOVER, CROSSOVER.replace("    batch = max(", "    return max("))]
        + [
            (
                '        "bound": "compute" if compute_s >= memory_s else "memory",\n',
                '        "bound": "memory" if flops / bytes_ < peak_flops / memory_bandwidth else "compute",\n',
            )
        ],
    ),
    "ch10: vLLM's design: down_proj's bias on rank 0 only, added before the all-reduce; tensor_split, "
    "x @ W.T, silu as g * sigmoid(g), a stacked sum": (
        CH10,
        [
            (
                DIVIDES,
                "    channels = mlp.up_proj.weight.shape[0]\n"
                "    if channels % tp_size != 0:\n"
                '        raise ValueError(f"{channels} channels cannot be cut into tp_size {tp_size} equal slices")\n'
                "    def cut(t, dim):\n"
                "        return [None] * tp_size if t is None else [p.detach() for p in t.tensor_split(tp_size, dim)]\n"
                "\n"
                "    g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj\n"
                "    parts = zip(cut(g.weight, 0), cut(u.weight, 0), cut(d.weight, 1),\n"
                "                cut(g.bias, 0), cut(u.bias, 0))\n"
                "    rank0_bias = None if d.bias is None else d.bias.detach()\n"
                "    return [MLPShard(*p, down_bias=rank0_bias if r == 0 else None) for r, p in enumerate(parts)]\n",
            ),  # the reference lines after it never run
            (
                SWIGLU + PARTIAL,
                "    g = x @ shard.gate_weight.T + (0 if shard.gate_bias is None else shard.gate_bias)\n"
                "    u = x @ shard.up_weight.T + (0 if shard.up_bias is None else shard.up_bias)\n"
                "    y = (g * torch.sigmoid(g) * u) @ shard.down_weight.T\n"
                "    return y if shard.down_bias is None else y + shard.down_bias  # rank 0's: once in the sum\n"
                + PARTIAL,
            ),  # the reference line after it never runs
            (
                "    total = partials[0].clone()\n",
                "    return torch.stack(list(partials)).sum(dim=0)\n    total = partials[0].clone()\n",
            ),
            (
                "    out = all_reduce([shard_forward(shard, x) for shard in shards])",
                "    return all_reduce(list(map(lambda shard: shard_forward(shard, x), shards)))\n"
                "    out = all_reduce([shard_forward(shard, x) for shard in shards])",
            ),
        ],
    ),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_a_correct_answer_written_differently_passes(name):
    chapter, edits = VARIANTS[name]
    learner = InProcessLearner(edited_solution(chapter, edits), chapter)
    module = importlib.import_module(f"tests.grading.test_{chapter}")
    tests = [getattr(module, n) for n in dir(module) if n.startswith("test_")]
    for test in tests:
        test(learner)
