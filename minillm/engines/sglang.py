"""SGLang's policy (its scheduler's prefill admission and decode retraction) on minillm's paged engine.

Four rules set SGLang's scheduler apart from vLLM's [sglang-source-scheduler]:

  prefill or decode   by default a step is either a prefill batch (new prompts, or the next chunk of
                      the one prompt being chunked) or one decode token for every running request,
                      never both, and prefill goes first whenever one can be formed; running requests
                      wait while a long prompt is chunked (``enable_mixed_chunk`` adds their tokens)
  an ordered queue    ``schedule_policy`` orders the waiting queue before each admission: ``fcfs``
                      (arrival order), ``lpm`` (longest cached prefix first, so requests that share a
                      prefix run while it is still cached), ``lof`` (longest output first)
  admit on estimates  a new request must fit its prompt plus all it may generate (at most 4,096 tokens
                      counted) beside what the running requests are *expected* to generate: their
                      remaining tokens times ``new_token_ratio``, which starts at 0.7 x
                      ``schedule_conservativeness`` and decays to a seventh of that over 600 decode steps
  retract, then trust if a decode step finds too few free blocks, it retracts the running requests that
                      have generated the fewest tokens (recomputed later, from the back of the queue) and
                      raises the ratio to what the survivors have actually used

minillm's prefix cache (chapter 7's hashed full blocks) stands in for SGLang's radix cache, which is
on by default (``disable_radix_cache=False``); its hits come in whole blocks, SGLang's (page size 1) in
tokens.
"""

from __future__ import annotations

from minillm.engines.chunked import TokenBudgetScheduler
from minillm.engines.paged import DEFAULT_BLOCK_SIZE, PagedSchedulerOutput, resolve_num_gpu_blocks
from minillm.request import Request, RequestStatus
from minillm.scheduler import check_count, check_flag

SCHEDULE_POLICIES = ("fcfs", "lpm", "lof")
# SGLang's defaults and constants [sglang-source-scheduler]
DEFAULT_CHUNKED_PREFILL_SIZE = 8192  # what SGLang picks on an H200 (it sizes it by GPU memory); -1: no chunking
DEFAULT_MAX_PREFILL_TOKENS = 16384
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096  # the most future tokens one request is counted for
LPM_MAX_QUEUE = 128  # lpm sorts a longer queue in arrival order (sorting costs too much)
IN_BATCH_PREFIX = 32  # lpm: a request with no cached prefix that shares 32 tokens with one ahead goes last


def check_schedule_policy(schedule_policy) -> None:
    if schedule_policy not in SCHEDULE_POLICIES:
        raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {schedule_policy!r}")


def check_schedule_conservativeness(schedule_conservativeness) -> None:
    value = schedule_conservativeness
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"schedule_conservativeness must be a number > 0, got {value!r}")


def check_chunked_prefill_size(chunked_prefill_size) -> None:
    if chunked_prefill_size != -1:
        check_count("chunked_prefill_size (-1: no chunking)", chunked_prefill_size)


class SGLangScheduler(TokenBudgetScheduler):
    """SGLang's scheduler as a minillm scheduler, under its option names: ``schedule_policy``,
    ``schedule_conservativeness``, ``chunked_prefill_size`` (-1: off), ``max_prefill_tokens``,
    ``max_running_requests`` (None: half the pool's tokens, at most 4,096, as SGLang sizes it),
    ``enable_mixed_chunk`` and ``disable_radix_cache``. SGLang's advice: a lower conservativeness when
    the KV cache sits under-used while requests wait, a higher one when requests are often retracted
    [sglang-docs-tuning]."""

    def __init__(
        self,
        schedule_policy: str = "fcfs",
        schedule_conservativeness: float = 1.0,
        chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL_SIZE,
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        max_running_requests: int | None = None,
        enable_mixed_chunk: bool = False,
        disable_radix_cache: bool = False,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_gpu_blocks: int | None = None,
    ):
        check_schedule_policy(schedule_policy)
        check_schedule_conservativeness(schedule_conservativeness)
        check_chunked_prefill_size(chunked_prefill_size)
        check_count("max_prefill_tokens", max_prefill_tokens)
        if max_running_requests is not None:
            check_count("max_running_requests", max_running_requests)
        check_flag("enable_mixed_chunk", enable_mixed_chunk)
        check_flag("disable_radix_cache", disable_radix_cache)
        num_gpu_blocks = resolve_num_gpu_blocks(num_gpu_blocks, block_size)
        if max_running_requests is None:
            max_running_requests = max(1, min(num_gpu_blocks * block_size // 2, 4096))
        super().__init__(
            max_num_seqs=max_running_requests,
            max_num_batched_tokens=max_prefill_tokens,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            enable_prefix_caching=not disable_radix_cache,
        )
        self.schedule_policy = schedule_policy
        self.chunked_prefill_size = None if chunked_prefill_size == -1 else chunked_prefill_size
        self.enable_mixed_chunk = enable_mixed_chunk
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min_new_token_ratio = self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        decay_range = self.init_new_token_ratio - self.min_new_token_ratio
        self.new_token_ratio_decay = decay_range / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        self.chunked_request: Request | None = None  # the one prompt being prefilled in chunks
        self.batch_is_full = False  # admission ran out of KV memory: wait until a running request leaves

    def check_request(self, request: Request) -> None:
        """SGLang admits a request only while its prompt and the tokens it may generate are fewer than
        the free KV tokens: one that needs the whole pool would wait forever."""
        need = request.num_prompt_tokens + self.expected_new_tokens(request)
        if need >= self.kv_capacity_tokens:
            raise ValueError(
                f"request {request.request_id}: {request.num_prompt_tokens} prompt tokens + max_tokens="
                f"{request.sampling_params.max_tokens} needs {need} KV cache tokens; SGLang's admission needs fewer "
                f"than the whole pool of num_gpu_blocks={self.num_gpu_blocks} x block_size={self.block_size} = "
                f"{self.kv_capacity_tokens} tokens"
            )

    # --- one step --------------------------------------------------------------------------------
    def schedule(self, now: float) -> PagedSchedulerOutput:
        """A prefill batch when one can be formed, else a decode step for every running request."""
        plan = self.new_plan()
        self.cache_running_blocks()
        if not self.running:
            self.new_token_ratio = self.init_new_token_ratio  # idle: the estimate starts over
        decoding = [r for r in self.running if r.is_decode]
        if self.add_prefills(plan, len(decoding) if self.enable_mixed_chunk else 0):
            if self.enable_mixed_chunk:
                self.add_decodes(plan, decoding)
            return self.finish_plan(plan)
        if decoding:
            self.retract_until_decodes_fit(plan, decoding)
            self.add_decodes(plan, [r for r in decoding if r.status is RequestStatus.RUNNING])
        return self.finish_plan(plan)

    def add_decodes(self, plan: PagedSchedulerOutput, decoding: list[Request]) -> None:
        for request in decoding:
            if not self.block_manager.allocate_slots(request, 1):
                break  # a mixed step whose prefills took the last blocks: the rest decode next step
            plan.scheduled.append(request)
            plan.num_scheduled_tokens[request.request_id] = 1
        if not plan.preempted_ids:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)

    # --- prefill admission -----------------------------------------------------------------------
    def add_prefills(self, plan: PagedSchedulerOutput, mixed: int) -> bool:
        """Form this step's prefill batch: the chunked prompt's next chunk, then waiting requests in
        ``schedule_policy``'s order while the prefill, chunk and memory budgets last; the first that
        does not fit stops the walk. ``mixed`` decode tokens share the budgets. True if any."""
        if (self.batch_is_full or not self.waiting) and self.chunked_request is None:
            return False
        bm = self.block_manager
        running = [r for r in self.running if r.is_decode]
        budget = PrefillBudget(
            input_tokens=self.max_num_batched_tokens - mixed,
            chunk_tokens=None if self.chunked_prefill_size is None else self.chunked_prefill_size - mixed,
            total_tokens=bm.num_free_blocks * self.block_size
            - mixed
            - sum(self.expected_new_tokens(r) for r in running) * self.new_token_ratio,
        )
        if self.chunked_request is not None:
            self.continue_chunk(plan, budget)
        num_running = len(self.running)
        for request in self.ordered_waiting():
            if len(plan.admitted_ids) >= self.max_num_seqs - num_running:
                self.batch_is_full = True
                break
            if not self.admit(request, plan, budget):
                break
        return bool(plan.scheduled)

    def continue_chunk(self, plan: PagedSchedulerOutput, budget: PrefillBudget) -> None:
        request = self.chunked_request
        left = request.num_tokens - request.num_computed_tokens
        n = min(left, int(budget.total_tokens), left if budget.chunk_tokens is None else budget.chunk_tokens)
        if n < 1 or not self.block_manager.allocate_slots(request, n):
            return
        plan.scheduled.append(request)
        plan.num_scheduled_tokens[request.request_id] = n
        budget.charge(n, self.expected_new_tokens(request) if n == left else 0)
        if n == left:
            self.chunked_request = None

    def admit(self, request: Request, plan: PagedSchedulerOutput, budget: PrefillBudget) -> bool:
        """Admit ``request`` (whole, or its first chunk) if the budgets allow; False ends the walk."""
        hit = self.reuse_cached_prefix(request)
        extend = request.num_tokens - request.num_computed_tokens
        if extend + self.expected_new_tokens(request) >= budget.total_tokens:  # out of (expected) memory
            self.forget_cached_prefix(request, hit)
            self.batch_is_full = True
            return False
        if extend >= budget.input_tokens and plan.scheduled:  # the first prompt of a batch may exceed it
            self.forget_cached_prefix(request, hit)
            return False
        chunked = budget.chunk_tokens is not None and extend > budget.chunk_tokens
        n = budget.chunk_tokens if chunked else extend  # SGLang rounds a chunk to its pages, of 1 token by default
        if n < 1 or not self.block_manager.allocate_slots(request, n):
            self.forget_cached_prefix(request, hit)
            return False
        self.count_prefix_hit(request, hit)
        self.waiting.remove(request)
        self._admit(request)
        plan.admitted_ids.append(request.request_id)
        plan.scheduled.append(request)
        plan.num_scheduled_tokens[request.request_id] = n
        if chunked:
            self.chunked_request = request
        budget.charge(n, 0 if chunked else self.expected_new_tokens(request))
        if budget.total_tokens <= 0:
            self.batch_is_full = True
        return budget.left()

    def ordered_waiting(self) -> list[Request]:
        """The waiting queue in ``schedule_policy``'s order (a sorted copy)."""
        queue = list(self.waiting)
        if self.schedule_policy == "lof":
            return sorted(queue, key=lambda r: -r.sampling_params.max_tokens)
        if self.schedule_policy == "fcfs" or not self.enable_prefix_caching or len(queue) > LPM_MAX_QUEUE:
            return queue
        bm, seen, last = self.block_manager, set(), {}
        for request in queue:  # lpm: the cached prefix of each; in-batch sharers of an uncached prefix go last
            cached = len(bm.find_cached_blocks(request.token_ids_slice(0, request.num_tokens - 1))) * self.block_size
            head = tuple(request.token_ids_slice(0, IN_BATCH_PREFIX))
            shares = cached <= IN_BATCH_PREFIX and len(head) == IN_BATCH_PREFIX and head in seen
            if cached <= IN_BATCH_PREFIX and not shares:
                seen.add(head)
            last[request.request_id] = (shares, -cached)
        return sorted(queue, key=lambda r: last[r.request_id])

    @staticmethod
    def expected_new_tokens(request: Request) -> int:
        """The tokens ``request`` may still generate, counted at most ``CLIP_MAX_NEW_TOKENS``."""
        return min(max(request.sampling_params.max_tokens - len(request.output_token_ids), 0), CLIP_MAX_NEW_TOKENS)

    # --- decode retraction -----------------------------------------------------------------------
    def retract_until_decodes_fit(self, plan: PagedSchedulerOutput, decoding: list[Request]) -> None:
        """While the decodes' next tokens need more blocks than are free, retract the request that has
        generated the fewest tokens (ties: the longest prompt), never the last; then set the ratio to
        what the remaining requests have used (SGLang's estimate after a retraction)."""
        bm = self.block_manager
        candidates = sorted(decoding, key=lambda r: (len(r.output_token_ids), -r.num_prompt_tokens))
        left = list(decoding)
        while len(left) > 1 and sum(bm.num_new_blocks(r, 1) for r in left) > bm.num_free_blocks:
            victim = candidates.pop(0)
            left.remove(victim)
            self.retract(victim, plan)
        if self.chunked_request is not None and sum(bm.num_new_blocks(r, 1) for r in left) > bm.num_free_blocks:
            self.retract(self.chunked_request, plan)  # a lone decode beside a half-read prompt: the prompt yields
        if plan.preempted_ids:
            generated = sum(len(r.output_token_ids) for r in left)
            max_new = sum(r.sampling_params.max_tokens for r in left)
            self.new_token_ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(left)) / (max_new + 1))

    def retract(self, request: Request, plan: PagedSchedulerOutput) -> None:
        """Free ``request``'s blocks (its full ones stay cached) and queue it at the back, to recompute."""
        self.running.remove(request)
        self.release_slot(request)
        self.cache_blocks(request)
        self.block_manager.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        self.waiting.append(request)
        if request is self.chunked_request:
            self.chunked_request = None
        self.num_preemptions += 1
        plan.preempted_ids.append(request.request_id)
        self.batch_is_full = False

    def free_request(self, request: Request) -> None:
        """A request that leaves frees memory: admission may try again."""
        super().free_request(request)
        self.batch_is_full = False
        if request is self.chunked_request:
            self.chunked_request = None

    def stats(self) -> dict:
        return {
            **super().stats(),
            "schedule_policy": self.schedule_policy,
            "new_token_ratio": self.new_token_ratio,
            "chunked_prefill_size": self.chunked_prefill_size or -1,
        }


class PrefillBudget:
    """What one prefill batch may still take: prompt tokens (``max_prefill_tokens``), chunk tokens
    (``chunked_prefill_size``; None: no chunking) and KV tokens left after the running requests'
    expected growth (``total_tokens``). Admitting ``n`` prompt tokens of a request that may generate
    ``new`` more charges ``n`` to each, and ``new`` to the memory too (at ratio 1)."""

    def __init__(self, input_tokens: int, chunk_tokens: int | None, total_tokens: float):
        self.input_tokens = input_tokens
        self.chunk_tokens = chunk_tokens
        self.total_tokens = total_tokens

    def charge(self, n: int, new: int) -> None:
        self.input_tokens -= n
        if self.chunk_tokens is not None:
            self.chunk_tokens -= n
        self.total_tokens -= n + new

    def left(self) -> bool:
        """Room for another request in every budget."""
        return self.total_tokens > 0 and self.input_tokens > 0 and (self.chunk_tokens is None or self.chunk_tokens > 0)
