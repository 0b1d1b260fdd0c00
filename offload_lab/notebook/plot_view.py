"""A plotly figure in a notebook page that a new figure redraws in place.

:class:`PlotView` is an ``anywidget`` holding one figure as its JSON. Setting a new figure
sends that JSON in one message and the page redraws the plot it shows with plotly.js's
``Plotly.react``, which keeps the plot element and only redraws what changed. plotly's own
``FigureWidget`` does the same job with a two-way sync of every trace: the page echoes each
update back to the kernel as deltas and the kernel answers, which on a small machine costs
more than the redraw itself; and each ``FigureWidget`` carries its own copy of plotly.js
(about 5 MB) in the widget state a saved notebook keeps. The dashboard only ever sends
figures one way, so it uses this.

plotly.js (the copy the installed plotly ships) is held once per kernel, by one
:class:`PlotlyLibrary` widget that every view refers to: the page loads it with the first view
it draws, and a notebook saved with its widget state keeps one copy, however many figures it
shows (so the saved dashboard still draws after a kernel restart). The page sets :attr:`PlotView.drawn` once it has drawn the plot, so the kernel
knows a page shows the widget (a headless run never sets it); a click on a point calls the
callbacks given to :meth:`PlotView.on_click`.

    >>> import plotly.graph_objects as go
    >>> view = PlotView(go.Figure(go.Bar(x=[1, 2], y=[3, 4])))
    >>> view.drawn, len(view.data), '"type":"bar"' in view.figure_json
    (0, 1, True)
    >>> view.show(go.Figure(layout={"height": 300}))
    >>> len(view.data), '"height":300' in view.figure_json
    (0, True)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as W
import plotly
import plotly.io as pio
import traitlets
from plotly.callbacks import Points

__all__ = ["PlotView", "PlotlyLibrary", "PLOT_CONFIG", "plotly_js", "library"]

#: plotly.js's config for the plots, as for the figures' static HTML
PLOT_CONFIG = {"displaylogo": False, "responsive": True}

# The page's side. plotly.js is loaded once per page, from the library widget's source (a
# module that sets globalThis.Plotly). Draws are serialised: a figure that arrives while one is drawn is drawn
# next (the latest one only). A plot drawn in a hidden tab is sized for no width; it is resized
# once its box has one.
_VIEW_JS = """
const LOADING = "__offloadLabPlotly";
function plotly(model) {
  if (globalThis.Plotly) return Promise.resolve(globalThis.Plotly);
  if (!globalThis[LOADING]) {
    globalThis[LOADING] = (async () => {
      const ref = String(model.get("library") || "");
      const lib = await model.widget_manager.get_model(ref.replace(/^IPY_MODEL_/, ""));
      const url = URL.createObjectURL(new Blob([lib.get("source")], { type: "text/javascript" }));
      try { await import(url); } finally { URL.revokeObjectURL(url); }
      return globalThis.Plotly;
    })().catch((e) => { globalThis[LOADING] = null; throw e; });
  }
  return globalThis[LOADING];
}

async function render({ model, el }) {
  const gd = document.createElement("div");
  el.appendChild(gd);
  let Plotly;
  try { Plotly = await plotly(model); }
  catch (e) { gd.textContent = "plotly.js could not be loaded: " + e; return; }
  let busy = false, again = false, width = 0, heard = false;
  async function draw() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      do {
        again = false;
        const fig = JSON.parse(model.get("figure_json") || "{}");
        await Plotly.react(gd, fig.data || [], fig.layout || {}, CONFIG);
        gd.dataset.figures = String(Number(gd.dataset.figures || 0) + 1);  // figures drawn here
      } while (again);
      if (!heard) {
        heard = true;
        gd.on("plotly_click", (ev) => model.send({ kind: "click", points: ev.points.map(
          (p) => ({ curve: p.curveNumber, index: p.pointIndex ?? p.pointNumber })) }));
      }
      if (!model.get("drawn")) { model.set("drawn", 1); model.save_changes(); }
    } finally { busy = false; }
  }
  const sized = new ResizeObserver(() => {
    const w = gd.clientWidth;
    if (w && w !== width) { width = w; if (gd._fullLayout) Plotly.Plots.resize(gd); }
  });
  sized.observe(gd);
  model.on("change:figure_json", draw);
  draw();
  return () => { sized.disconnect(); model.off("change:figure_json", draw); Plotly.purge(gd); };
}
export default { render };
""".replace("CONFIG", json.dumps(PLOT_CONFIG))


@functools.lru_cache(maxsize=1)
def plotly_js() -> bytes:
    """The plotly.js the installed plotly ships (its figures' static HTML inlines the same)."""
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


class PlotlyLibrary(W.Widget):
    """plotly.js, held once per kernel for every :class:`PlotView` (a model with no view)."""

    _model_name = traitlets.Unicode("WidgetModel").tag(sync=True)
    _model_module = traitlets.Unicode("@jupyter-widgets/base").tag(sync=True)
    _model_module_version = traitlets.Unicode(W.__jupyter_widgets_base_version__).tag(sync=True)
    #: plotly.js's source
    source = traitlets.Unicode().tag(sync=True)


_LIBRARY: list[PlotlyLibrary] = []


def library() -> PlotlyLibrary:
    """This kernel's :class:`PlotlyLibrary` (made on first use; again if it was closed)."""
    if not _LIBRARY or _LIBRARY[0].comm is None:
        _LIBRARY[:] = [PlotlyLibrary(source=plotly_js().decode("utf-8"))]
    return _LIBRARY[0]


class PlotView(anywidget.AnyWidget):
    """One plotly figure in the page; :meth:`show` replaces it and the page redraws in place."""

    _esm = traitlets.Unicode(_VIEW_JS).tag(sync=True)
    #: the figure on display, as plotly JSON
    figure_json = traitlets.Unicode("{}").tag(sync=True)
    #: set by the page once it has drawn the figure
    drawn = traitlets.Int(0).tag(sync=True)
    #: where the page finds plotly.js
    library = traitlets.Instance(PlotlyLibrary).tag(sync=True, **W.widget_serialization)

    def __init__(self, fig: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("library", library())
        super().__init__(**kwargs)
        self.figure: Any = None
        self._clicks: list[Callable[[Any, Points], Any]] = []
        self.on_msg(self._from_page)
        if fig is not None:
            self.show(fig)

    def show(self, fig: Any) -> None:
        """Display ``fig`` (a plotly figure): one message with its JSON, nothing if unchanged."""
        self.figure = fig
        self.figure_json = pio.to_json(fig, validate=False)

    @property
    def data(self) -> tuple:
        """The traces of the figure on display."""
        return tuple(self.figure.data) if self.figure is not None else ()

    def on_click(self, callback: Callable[[Any, Points], Any]) -> None:
        """Call ``callback(trace, points)`` (plotly's ``Points``) for a click on a point, as
        ``FigureWidget``'s ``trace.on_click`` does, once per trace clicked."""
        self._clicks.append(callback)

    def _from_page(self, _widget: Any, content: Any, _buffers: Any) -> None:
        kind = content.get("kind") if isinstance(content, dict) else None
        if kind == "click":
            self._clicked(content.get("points"))

    def _clicked(self, points: Any) -> None:
        # what a page sends is checked: a point of no trace on display is ignored
        data = self.data
        picked: dict[int, list[int]] = {}
        for p in points if isinstance(points, list) else []:
            curve, index = (p.get("curve"), p.get("index")) if isinstance(p, dict) else (None, None)
            if (isinstance(curve, int) and isinstance(index, int) and 0 <= curve < len(data)
                    and 0 <= index < len(data[curve].x if data[curve].x is not None else ())):
                picked.setdefault(curve, []).append(index)
        for curve, inds in picked.items():
            trace = data[curve]
            pts = Points(point_inds=inds, xs=[trace.x[i] for i in inds],
                         ys=[trace.y[i] for i in inds] if trace.y is not None else [],
                         trace_name=trace.name, trace_index=curve)
            for callback in self._clicks:
                callback(trace, pts)
