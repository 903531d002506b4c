"""One palette for every widget, so a colour means the same thing everywhere: orange is always
prefill, blue always decode. (Okabe-Ito colours: they stay distinct for colour-blind readers.)"""

from __future__ import annotations

from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

# What a request (or the slot it holds) is doing during one engine step.
EMPTY = "empty"  # no request: the slot is free, or the request has not arrived / has finished
WAITING = "waiting"  # arrived, not holding a slot: in the queue
PREFILL = "prefill"  # its prompt (or a chunk of it) runs this step
DECODE = "decode"  # it runs one decode token this step
IDLE = "idle"  # holds a slot but computes nothing useful: padding, or waiting for the rest of its batch

STATES = (EMPTY, WAITING, PREFILL, DECODE, IDLE)  # a state's index is its code in a cell grid

COLORS = {
    EMPTY: "#ffffff",
    WAITING: "#cc79a7",  # reddish purple
    PREFILL: "#e69f00",  # orange
    DECODE: "#0072b2",  # blue
    IDLE: "#c8c8c8",  # grey
}

TEXT_ON = {EMPTY: "black", WAITING: "black", PREFILL: "black", DECODE: "white", IDLE: "black"}

HIGHLIGHT = "#000000"  # the current step's outline
P50 = "#000000"  # median marker
P95 = "#d55e00"  # tail marker (vermillion)

LABELS = {WAITING: "waiting in queue", PREFILL: "prefill", DECODE: "decode", IDLE: "idle (slot held, no work)"}


def rgb_table():
    """RGB rows indexed by state code, for turning a grid of codes into an image."""
    return [to_rgb(COLORS[s]) for s in STATES]


def legend_handles(states=(PREFILL, DECODE, IDLE, WAITING)):
    return [Patch(facecolor=COLORS[s], edgecolor="#666666", label=LABELS[s]) for s in states]
