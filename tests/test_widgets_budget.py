"""``draw_budget_sweep``: chapter 6's TTFT / ITL trade-off picture."""

import matplotlib

matplotlib.use("Agg")

from minillm.widgets import draw_budget_sweep  # noqa: E402


def test_the_budget_sweep_draws_each_budget_and_the_unbudgeted_run():
    rows = [
        {"budget": b, "ttft_p95": t, "itl_p95": i, "itl_max": m}
        for b, t, i, m in ((16, 0.9, 0.005, 0.007), (256, 0.25, 0.03, 0.035), (None, 0.3, 0.02, 0.13))
    ]
    fig = draw_budget_sweep(rows, title="t")
    left, right = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in left.get_xticklabels()] == ["16", "256", "no budget"]
    assert left.lines[0].get_xdata().tolist() == [16, 256, 1024]  # no budget: four times the largest
    assert [a.get_text() for a in right.texts] == ["16", "256", "no budget"]
    # The trade-off plots the longest gap, the stall a budget protects against, against TTFT.
    assert right.lines[0].get_xdata().tolist() == [7.0, 35.0, 130.0]
    assert right.lines[0].get_ydata().tolist() == [900.0, 250.0, 300.0]
