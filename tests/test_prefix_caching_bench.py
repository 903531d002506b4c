"""``python -m minillm.benchmarks.prefix_caching --small``: the report's shape, and what caching must
change (fewer prefill tokens, a hit rate above 0) and must not (the tokens)."""

import json
import sys

import pytest

from minillm.benchmarks import prefix_caching

WORKLOADS = ["shared system prompt", "few-shot prompt", "multi-turn chat"]
# one worker runs this module's tests, so the report (15 s) is made once, not once per worker
pytestmark = pytest.mark.xdist_group("prefix_caching_bench")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("prefix_caching")
    argv = sys.argv
    sys.argv = ["prefix_caching", "--small", "--repeats", "1", "--out", str(out)]
    try:
        prefix_caching.main()
    finally:
        sys.argv = argv
    return json.loads((out / "prefix_caching_cpu.json").read_text())


def off_on_pairs(report):
    """Every (where, workload, figures) of the report."""
    for where in ("cpu", "simulated"):
        yield from ((where, name, r) for name, r in report[where]["results"].items())
        yield from ((f"eviction {where}", name, r) for name, r in report["eviction"][where].items())


def test_the_report_has_every_workload_at_both_scales(report):
    assert report["small"] and list(report["cpu"]["results"]) == WORKLOADS
    assert list(report["simulated"]["results"]) == WORKLOADS
    assert set(report["workloads"]) == {"cpu", "simulated"}
    assert set(report["capacity"]["max_rate"]) == set(prefix_caching.CAPACITY_MIXES)


def test_caching_computes_fewer_prefill_tokens_and_changes_no_token(report):
    for where, name, r in off_on_pairs(report):
        off, on = r["off"], r["on"]
        assert off["hit_rate"] == 0 and on["hit_rate"] > 0, (where, name)
        assert off["prefill_tokens_computed"] >= off["prompt_tokens"] == on["prompt_tokens"], (where, name)
        assert on["prefill_tokens_computed"] < off["prefill_tokens_computed"], (where, name)
        assert r["ttft_p50_speedup"] == pytest.approx(off["ttft_p50_s"] / on["ttft_p50_s"])
        assert r.get("same_tokens", True), (where, name)  # the simulator computes no tokens


def test_the_simulated_ttft_falls_and_the_capacity_rises(report):
    for name in WORKLOADS:
        r = report["simulated"]["results"][name]
        assert r["on"]["ttft_p50_s"] < r["off"]["ttft_p50_s"], name
    for mix, rates in report["capacity"]["max_rate"].items():
        assert rates["on"] >= rates["off"] > 0, mix
