"""Figures inside widgets, with a static PNG fallback.

Widgets only come alive next to a running kernel. Where none runs (GitHub's notebook viewer,
``jupyter nbconvert``, a notebook opened without its widget state) a plain widget shows as
``VBox(...)`` text or nothing at all. So every widget here:

* draws its matplotlib figure into an ``ipywidgets.Image`` as PNG bytes: the live widget is just
  controls plus a picture, re-rendered whenever a control changes;
* puts a PNG next to the widget in its display bundle (``_repr_mimebundle_``). Jupyter shows the
  live widget; a viewer that cannot render widgets picks the ``image/png`` instead, so a saved
  notebook still shows the figure as it was when the cell ran.

``show_static()`` displays only the PNG, for a picture you want to keep exactly as it is now.
"""

from __future__ import annotations

import base64
import html
import io

import ipywidgets as widgets
from matplotlib.figure import Figure

DPI = 90


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


class StaticFallback:
    """Display as ``self.widget`` where widgets work, as ``self.static_png()`` where they do not."""

    widget: widgets.Widget

    def static_png(self) -> bytes:
        raise NotImplementedError

    def show_static(self) -> None:
        """Display the current picture as a PNG only: it survives any notebook viewer."""
        from IPython.display import Image, display

        display(Image(data=self.static_png()))

    def _repr_mimebundle_(self, **kwargs):
        bundle = dict(self.widget._repr_mimebundle_(**kwargs))
        bundle["image/png"] = base64.b64encode(self.static_png()).decode("ascii")
        return bundle


class FigureView(StaticFallback):
    """Controls above one figure. Subclasses draw into ``self.fig`` and call ``refresh()``."""

    def __init__(self, fig: Figure, controls=()):
        self.fig = fig  # a plain Figure, not pyplot's: it never pops up on its own
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%", height="auto"))
        self.widget = widgets.VBox([*controls, self.image])

    def refresh(self) -> None:
        """Show the figure's current state in the widget."""
        self.image.value = figure_png(self.fig)

    def static_png(self) -> bytes:
        return self.image.value or figure_png(self.fig)


class EventSteps(FigureView):
    """A slider over a list of events: the picture after each, and a caption on what the last one
    did. Subclasses draw step ``k`` into ``self.ax`` in ``draw(k)``, which returns the caption; the
    slider opens at ``start`` (the picture a saved notebook keeps)."""

    def __init__(self, num_events: int, start: int, figsize: tuple[float, float]):
        self.slider = widgets.IntSlider(min=0, max=num_events, value=start, description="event")
        self.caption = widgets.HTML()
        fig = Figure(figsize=figsize)
        self.ax = fig.add_subplot()
        super().__init__(fig, [self.slider, self.caption])
        self.slider.observe(lambda change: self.show(), names="value")
        self.show()

    def draw(self, step: int) -> str:
        raise NotImplementedError

    def show(self) -> None:
        self.ax.clear()
        self.caption.value = html.escape(self.draw(self.slider.value))
        self.refresh()
