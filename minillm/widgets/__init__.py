"""Widgets that look at an engine run. Every one reads only the ``RequestOutput``s and the ``Trace``,
so it shows any engine, real or simulated, the same way.

- ``slots_timeline``       who holds which batch slot at each step, who waits; step slider and play
- ``latency_timeline``     queue / prefill / decode per request; TTFT, ITL, e2e with p50 and p95
- ``draw_latency_cdfs``    TTFT and ITL distributions of several runs (two loads, two engines), p95 marked
- ``simulation_controls``  engine, max_num_seqs, arrival rate, length mix: re-runs and redraws both
- ``compare_slots``, ``compare_request_bars``, ``compare_step_times``  runs of the same requests side by side
- ``draw_packing``         one mixed step three ways: a pass per prompt, a padded rectangle, one flat batch
- ``draw_ragged_mask``     chapter 4: which keys each query of a flat batch attends to (``ragged_mask`` as data)
- ``draw_queue_over_time``, ``draw_engine_sweep``  many runs: queue growth, engines across arrival rates
- ``draw_seqs_sweep``      throughput vs latency as max_num_seqs grows, the KV memory's limit marked
- ``draw_variance_sweep``  engines' throughput as output lengths spread out (static falls behind)
- ``block_map``            the paged KV cache: blocks by owner, a request's block table, memory gauge, preemptions;
                           with prefix caching, shared blocks by holder count and free blocks still cached
- ``draw_block_tables``    chapter 5: one or two block tables as arrows, logical block -> physical block
- ``draw_cache_gains``     prefix caching: TTFT with the cache off and on, per workload, with hit rates
- ``draw_hash_chain``      prefix caching: prompts' blocks named by chained hashes, shared blocks in one colour
- ``draw_radix_tree``      prefix caching: the same prompts as SGLang's radix tree, shared prefixes as shared nodes
- ``radix_tree_steps``     the radix tree over time: arrivals insert and hold, finishes release, eviction takes leaves
- ``free_queue_steps``     the free block queue over time: hits leave its middle, frees join its tail, head evicted
- ``draw_kv_memory``       KV memory set aside vs the tokens in it, step by step (``kv_memory_use`` sums it)
- ``draw_kv_waste_by_cause`` chapter 5: KV memory as tokens, reserved, internal fragmentation (``kv_waste_by_cause``)
- ``draw_block_size_sweep`` chapter 5: waste, requests at once and throughput against the block size
- ``draw_memory_sweep``    chapter 5: KV memory -> requests at once -> throughput, one line per engine
- ``capacity_plot``        throughput and p95 latencies vs offered load, SLO lines, the capacity (``draw_capacity``)
- ``draw_capacities``      chapter 8: each engine's capacity under the same SLOs, ties within the search's tolerance
- ``draw_budget_sweep``    chapter 6: TTFT and ITL against the token budget, and the trade-off curve
- ``draw_stall``           chapter 6: decoding requests' token times, runs one above the other, longest gap marked
- ``draw_budget_throughput`` chapter 6: output tokens/s and engine steps per budget when the server is saturated
- ``draw_chunk_costs``     chapter 6: one prompt's time to first token per chunk size, and the KV its chunks re-read
- ``draw_decode_bandwidth`` chapter 5b: a decode kernel's K/V bandwidth against the batch: the case for split-KV
- ``draw_attainable``      chapter 9: the roofline itself, attainable FLOP/s against arithmetic intensity, steps on it
- ``draw_roofline``        chapter 9: a decode step's FLOPs per byte and least time against the batch size
- ``draw_step_mix``        chapter 8b: each step's prompt and decode tokens, runs one above the other
- ``draw_throughputs``     chapter 9: every system's output tok/s on one workload (``minillm bench``)

Each also displays as a plain PNG where widgets cannot run (see ``figure_view``); ``draw_slots``
and ``draw_latency`` give the same pictures as plain matplotlib figures.

Chapter pictures (plain matplotlib, from measured or simulated numbers): ``naive`` (chapter 1:
``draw_forward_pass_costs``, ``draw_token_times``) and ``batching`` (chapter 2: ``draw_step_times``,
``draw_cost_breakdown``, ``draw_left_padding``, ``draw_padding``, ``draw_head_of_line``).
"""

from minillm.widgets.batching import (
    draw_cost_breakdown,
    draw_head_of_line,
    draw_left_padding,
    draw_padding,
    draw_step_times,
)
from minillm.widgets.block_map import BlockMap, block_map, block_tables_at, draw_block_map, draw_block_tables
from minillm.widgets.budget import draw_budget_sweep, draw_budget_throughput, draw_chunk_costs, draw_stall
from minillm.widgets.capacity import CapacityPlot, capacity_plot, draw_capacities, draw_capacity
from minillm.widgets.compare import compare_request_bars, compare_step_times
from minillm.widgets.controls import SimulationControls, llm_run, simulated_run, simulation_controls
from minillm.widgets.decode_bandwidth import draw_decode_bandwidth
from minillm.widgets.free_queue import FreeQueueSteps, free_queue_steps
from minillm.widgets.kv_memory import (
    draw_block_size_sweep,
    draw_kv_memory,
    draw_kv_waste_by_cause,
    draw_memory_sweep,
    kv_memory_use,
    kv_waste_by_cause,
)
from minillm.widgets.latency import (
    LatencyTimeline,
    draw_latency,
    draw_latency_cdfs,
    draw_request_bars,
    latency_timeline,
)
from minillm.widgets.naive import draw_forward_pass_costs, draw_token_times
from minillm.widgets.packing import draw_packing, draw_ragged_mask, packing_layouts, ragged_mask
from minillm.widgets.prefix_cache import draw_cache_gains, draw_hash_chain, draw_radix_tree, hash_chain_rows
from minillm.widgets.radix_steps import RadixSteps, radix_tree_steps
from minillm.widgets.roofline import draw_attainable, draw_roofline
from minillm.widgets.slots import (
    SlotsTimeline,
    assign_slots,
    cell_grid,
    compare_slots,
    draw_slots,
    slots_timeline,
    step_info,
)
from minillm.widgets.step_mix import draw_step_mix
from minillm.widgets.sweeps import draw_engine_sweep, draw_queue_over_time, draw_seqs_sweep, draw_variance_sweep
from minillm.widgets.throughput import draw_throughputs

__all__ = [
    "SlotsTimeline",
    "slots_timeline",
    "draw_slots",
    "assign_slots",
    "cell_grid",
    "step_info",
    "LatencyTimeline",
    "latency_timeline",
    "draw_latency",
    "draw_latency_cdfs",
    "SimulationControls",
    "simulation_controls",
    "simulated_run",
    "llm_run",
    "compare_slots",
    "compare_request_bars",
    "compare_step_times",
    "draw_packing",
    "draw_ragged_mask",
    "ragged_mask",
    "packing_layouts",
    "draw_engine_sweep",
    "draw_queue_over_time",
    "draw_seqs_sweep",
    "draw_variance_sweep",
    "draw_forward_pass_costs",
    "draw_token_times",
    "draw_request_bars",
    "draw_step_times",
    "draw_cost_breakdown",
    "draw_padding",
    "draw_left_padding",
    "draw_head_of_line",
    "CapacityPlot",
    "capacity_plot",
    "draw_capacity",
    "BlockMap",
    "block_map",
    "block_tables_at",
    "draw_block_map",
    "draw_block_tables",
    "draw_cache_gains",
    "draw_hash_chain",
    "draw_radix_tree",
    "radix_tree_steps",
    "free_queue_steps",
    "FreeQueueSteps",
    "RadixSteps",
    "hash_chain_rows",
    "draw_kv_memory",
    "kv_memory_use",
    "draw_kv_waste_by_cause",
    "kv_waste_by_cause",
    "draw_block_size_sweep",
    "draw_memory_sweep",
    "draw_budget_sweep",
    "draw_budget_throughput",
    "draw_chunk_costs",
    "draw_decode_bandwidth",
    "draw_capacities",
    "draw_stall",
    "draw_attainable",
    "draw_roofline",
    "draw_step_mix",
    "draw_throughputs",
]
