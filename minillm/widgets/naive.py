"""Chapter 1's pictures: what one forward pass costs, and what the KV cache saves.

    from minillm.widgets import draw_forward_pass_costs, draw_token_times
    draw_forward_pass_costs([8, 32, 128], prefill_s, decode_s, where="this machine's CPU")
    draw_token_times(16, times_without_cache, times_with_cache)

Both take plain lists of seconds (whatever measured them) and return the matplotlib Figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from minillm.widgets import palette

MS = 1e3


def label_log_axis(ax, values) -> None:
    """On a log x axis, ticks exactly at ``values``, written as plain integers, and no minor labels
    (matplotlib's default minor labels such as ``2x10^1`` crowd each other)."""
    values = sorted(set(values))
    ax.xaxis.set_major_locator(plt.FixedLocator(values))
    ax.xaxis.set_major_formatter(plt.FixedFormatter([f"{v:g}" for v in values]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def plain_log_y(ax) -> None:
    """On a log y axis, ticks at 1, 2 and 5 times powers of ten, written as plain numbers (``0.5``,
    ``20``), not ``5x10^-1``."""
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


def draw_forward_pass_costs(ns, prefill_s, decode_s, *, where: str = "", model: str = "") -> plt.Figure:
    """Left: the time of one forward pass against ``n`` — a prefill of ``n`` tokens and one decode
    step with ``n`` tokens cached. Right: the same per token (the prefill's time / n). Lines carry
    ``gid`` ``prefill`` / ``decode`` (left) and ``prefill-per-token`` / ``decode-per-token``."""
    ns = np.asarray(ns, dtype=float)
    pre, dec = np.asarray(prefill_s) * MS, np.asarray(decode_s) * MS
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax1.plot(ns, pre, "o-", color=palette.COLORS[palette.PREFILL], gid="prefill", label="prefill of n tokens")
    ax1.plot(
        ns, dec, "s-", color=palette.COLORS[palette.DECODE], gid="decode", label="one decode step, n tokens cached"
    )
    ax1.set(ylabel="ms per forward pass", title="Time of one forward pass")
    ax2.plot(
        ns,
        pre / ns,
        "o-",
        color=palette.COLORS[palette.PREFILL],
        gid="prefill-per-token",
        label="prefill: its time / n",
    )
    ax2.plot(
        ns,
        dec,
        "s-",
        color=palette.COLORS[palette.DECODE],
        gid="decode-per-token",
        label="decode: the time of its one token",
    )
    ax2.set(ylabel="ms per token", title="Cost per token")
    for ax in (ax1, ax2):
        ax.set(xscale="log", yscale="log", xlabel="n (tokens)")
        label_log_axis(ax, ns)
        plain_log_y(ax)
        ax.legend(fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(_source(model, where), fontsize=10)
    fig.tight_layout()
    return fig


def draw_token_times(prompt_len: int, without_cache_s, with_cache_s, *, where: str = "", model: str = "") -> plt.Figure:
    """Left: the time of each generated token, without and with the KV cache, against the length of
    the sequence it extends. Right: the running total. The first token of each includes the prefill.
    Lines carry ``gid`` ``without-cache`` / ``with-cache`` (left) and ``...-total`` (right)."""
    without, with_ = np.asarray(without_cache_s) * MS, np.asarray(with_cache_s) * MS
    seq_len = prompt_len + np.arange(len(without))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    styles = {
        "without-cache": ("without KV cache (recompute everything)", "tab:red"),
        "with-cache": ("with the KV cache (the engine)", palette.COLORS[palette.DECODE]),
    }
    for (gid, (label, color)), ys in zip(styles.items(), (without, with_)):
        ax1.plot(prompt_len + np.arange(len(ys)), ys, color=color, lw=1, gid=gid, label=label)
        ax2.plot(np.arange(1, len(ys) + 1), np.cumsum(ys), color=color, gid=f"{gid}-total", label=label)
    ax1.set(
        xlabel="tokens in the sequence",
        ylabel="ms for the next token",
        title="Time per generated token",
        xlim=(seq_len[0], seq_len[-1]),
    )
    ax1.set_ylim(bottom=0)
    ax2.set(xlabel="tokens generated", ylabel="ms since the start", title="Total time")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(True, alpha=0.3)
    fig.suptitle(_source(model, where) + "; the first point of each curve includes the prefill", fontsize=10)
    fig.tight_layout()
    return fig


def _source(model: str, where: str) -> str:
    return f"{model} on {where} (measured)" if model or where else "measured"
