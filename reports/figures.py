"""Plotly figures as plain data, for every page the reports write.

``plotly.graph_objects.Figure`` validates and deep-copies every property it is given (each
``update_layout`` copies the whole template again): that was most of the time a small job's report took
(about 0.7 s of 1 s in ``forensics triage``). The views build the same figures as plain dicts instead,
already in the form plotly's validation gives them (``title="x"`` as ``{"text": "x"}``, a named colour
scale as its list of stops): ``tests/test_figures.py`` checks that ``go.Figure(fig).to_plotly_json()``
equals ``fig`` for every figure of every view, so plotly.js draws exactly what it drew before.

:func:`figure_html` embeds one figure (a :class:`Figure`, or a ``go.Figure``) through ``plotly.io``
without validating it again; its JSON escapes ``<``, ``>`` and ``/``, so no label from the input can
close the ``<script>``.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import pkgutil
import shutil
from typing import Any, BinaryIO, Protocol

import orjson
from markupsafe import Markup
from plotly.colors import sequential
from plotly.offline import get_plotlyjs

__all__ = ["PLOTLY_JS_SLOT", "Figure", "PlotlyJSON", "colorscale", "figure_html", "page_figure",
           "plotly_js", "plotly_js_bytes", "plotly_white", "copy_plotly_js"]

PLOTLY_JS_SLOT = Markup("<!-- plotly.js -->")
"""Where a page template puts plotly.js: the renderer splices the library in afterwards (it is 4.8 MB;
passing it through the template engine copies it several times). No input text can make this string:
the templates escape ``<`` in text and the figures' JSON writes it as ``\\u003c``."""
CONFIG = {"displaylogo": False, "responsive": True}
DEFAULT_HEIGHT = "380px"


class PlotlyJSON(Protocol):
    """Anything plotly.js can draw: a :class:`Figure` or a ``plotly.graph_objects.Figure``."""

    def to_plotly_json(self) -> dict[str, Any]: ...


def plotly_white() -> dict[str, Any]:
    """The page's plotly template as data (a constant; never modified)."""
    return plotly_template("plotly_white")


@functools.cache
def plotly_template(name: str) -> dict[str, Any]:
    """A plotly template as data (a constant; never modified), read on first use from the JSON plotly ships:
    what ``pio.templates[name].to_plotly_json()`` makes of that JSON by validating it, which cost 0.05-0.13 s of
    CPU at every import of this module (tests/test_figures.py checks both are the same JSON). ``"plotly"`` is
    the one a ``go.Figure`` carries by default."""
    raw = pkgutil.get_data("plotly", f"package_data/templates/{name}.json")
    if raw is None:  # plotly installed without its data as files: its own reader
        import plotly.io as pio

        return pio.templates[name].to_plotly_json()
    data = json.loads(raw)
    return {"data": data["data"], "layout": data["layout"]}  # the key order of the validated template


@functools.cache
def plotly_js() -> str:
    """plotly.js, as plotly ships it (code, not input): read from the package once per process."""
    return get_plotlyjs()


def copy_plotly_js(out: BinaryIO) -> None:
    """Write :func:`plotly_js_bytes` to ``out`` from the file plotly ships, 1 MB at a time: a report does not hold
    the 4.8 MB library in memory while it is written (it was 5 of the 53.7 MB trace's peak MiB)."""
    try:
        with importlib.resources.files("plotly").joinpath("package_data/plotly.min.js").open("rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
    except (FileNotFoundError, ModuleNotFoundError):  # pragma: no cover - a plotly without the file
        out.write(plotly_js_bytes())


@functools.cache
def plotly_js_bytes() -> bytes:
    """:func:`plotly_js` as UTF-8: the file's bytes as plotly ships them (``get_plotlyjs`` decodes the same
    file), read once per process without holding a decoded 4.8 MB copy beside them."""
    data = pkgutil.get_data("plotly", "package_data/plotly.min.js")
    return data if data is not None else plotly_js().encode("utf-8")


def colorscale(name: str) -> list[list[Any]]:
    """A named plotly colour scale as the stops plotly's validator turns it into: [[0.0, c0], ..., [1.0, cn]]."""
    colors = getattr(sequential, name)
    d = len(colors) - 1
    return [[(1.0 * i) / (1.0 * d), c] for i, c in enumerate(colors)]


def _nest(props: dict[str, Any]) -> dict[str, Any]:
    """plotly's magic underscores (``xaxis_title=`` is ``xaxis={"title": ...}``) and a bare string title as
    ``{"text": ...}``, as its validators write them. No property used here has an underscore in its name."""
    out: dict[str, Any] = {}
    for key, value in props.items():
        head, *rest = key.split("_")
        for part in reversed(rest):
            value = {part: value}
        _merge(out, {head: value})
    return out


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Nested update, as ``update_layout`` does: a dict updates the dict already there."""
    for key, value in new.items():
        if isinstance(value, dict):
            value = _nest(value)
            if isinstance(into.get(key), dict):
                _merge(into[key], value)
                continue
        elif key == "title" and isinstance(value, str):
            value = {"text": value}
        into[key] = value


class Figure(dict[str, Any]):
    """``{"data": [trace, ...], "layout": {...}}``: what ``Plotly.newPlot`` takes.

    The builder methods mirror ``plotly.graph_objects.Figure``'s (``add_bar``, ``update_layout``,
    ``update_xaxes``, ...) and return the figure; they only store the values, so a mistake is not caught
    here but by the test that validates every view's figures with plotly.
    """

    def __init__(self) -> None:
        super().__init__(data=[], layout={})

    @property
    def data(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self["data"]
        return data

    @property
    def layout(self) -> dict[str, Any]:
        layout: dict[str, Any] = self["layout"]
        return layout

    def add_trace(self, trace_type: str, **props: Any) -> Figure:
        trace = _nest(props)
        trace["type"] = trace_type
        self.data.append(trace)
        return self

    def add_bar(self, **props: Any) -> Figure:
        return self.add_trace("bar", **props)

    def add_scatter(self, **props: Any) -> Figure:
        return self.add_trace("scatter", **props)

    def add_heatmap(self, **props: Any) -> Figure:
        return self.add_trace("heatmap", **props)

    def update_layout(self, **props: Any) -> Figure:
        _merge(self.layout, _nest(props))
        return self

    def update_xaxes(self, **props: Any) -> Figure:
        return self.update_layout(xaxis=props)

    def update_yaxes(self, **props: Any) -> Figure:
        return self.update_layout(yaxis=props)

    def add_shape(self, **props: Any) -> Figure:
        self.layout.setdefault("shapes", []).append(_nest(props))
        return self

    def add_annotation(self, **props: Any) -> Figure:
        self.layout.setdefault("annotations", []).append(_nest(props))
        return self

    def to_plotly_json(self) -> dict[str, Any]:
        """The figure itself (it is the JSON), as ``go.Figure.to_plotly_json`` gives."""
        return self


def page_figure(fig: PlotlyJSON) -> dict[str, Any]:
    """What the page draws: ``fig``'s data and layout on the ``plotly_white`` template (``fig`` is not changed)."""
    data = fig.to_plotly_json()
    return {"data": data.get("data", []), "layout": {**data.get("layout", {}), "template": plotly_white()}}


def figure_html(fig: PlotlyJSON, div_id: str) -> Markup:
    """One figure as a <div> and its <script>; plotly.js itself is inlined once, in <head>. The markup is
    ``plotly.io.to_html``'s for these options, written here: importing ``plotly.io``'s JSON and HTML writers
    imports narwhals and plotly's validators (0.06-0.09 s of CPU per run), which an unvalidated figure never
    uses. A figure orjson does not take as it is (plotly would clean it first) goes through ``plotly.io``."""
    page = page_figure(fig)
    div = _plotly_div(page, div_id)
    if div is None:
        import plotly.io as pio

        # validate=False: the views' figures are already in validated form (tests/test_figures.py)
        div = pio.to_html(page, validate=False, include_plotlyjs=False, full_html=False, include_mathjax=False,
                          div_id=div_id, default_height=DEFAULT_HEIGHT, config=dict(CONFIG))
    return Markup(div)


# plotly.io's JSON writer (orjson engine): orjson's text with what could end a <script> or a JS string escaped
_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
_SWAP = (("<", "\\u003c"), (">", "\\u003e"), ("/", "\\u002f"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))
# plotly.io.to_html's markup (plotly/io/_html.py), for a figure without frames, plotly.js or MathJax
_SCRIPT = """\
                if (document.getElementById("{id}")) {{\
                    Plotly.newPlot(\
                        "{id}",\
                        {data},\
                        {layout},\
                        {config}\
                    ){then_addframes}{then_animate}{then_post_script}\
                }}"""
_DIV = """\
<div style="height:{height}; width:{width};">\
        {mathjax_script}\
        {load_plotlyjs}\
            <div id="{id}" class="plotly-graph-div" \
style="height:100%; width:100%;"></div>\
            <script>\
                window.PLOTLYENV=window.PLOTLYENV || {{}};\
                {script};\
            </script>\
        </div>"""


def _plotly_json(value: Any) -> str | None:
    """``plotly.io.json.to_json_plotly(value)`` when orjson takes ``value`` as it is, else None."""
    try:
        text = orjson.dumps(value, option=_JSON_OPTIONS).decode()
    except TypeError:
        return None
    for unsafe, safe in _SWAP:
        if unsafe in text:
            text = text.replace(unsafe, safe)
    return text


def _css_size(value: Any) -> str:
    """A number is pixels, anything else (``100%``) as it is."""
    try:
        float(value)
    except (ValueError, TypeError):
        return str(value)
    return f"{value}px"


def _plotly_div(page: dict[str, Any], div_id: str) -> str | None:
    """``plotly.io.to_html(page, ...)`` as :func:`figure_html` calls it; None when orjson cannot write the page."""
    data, layout = _plotly_json(page.get("data", [])), _plotly_json(page.get("layout", {}))
    if data is None or layout is None or page.get("frames"):
        return None
    layout_dict = page.get("layout", {})
    template = layout_dict.get("template", {}).get("layout", {})
    width = _css_size(layout_dict.get("width", template.get("width", "100%")))
    height = _css_size(layout_dict.get("height", template.get("height", DEFAULT_HEIGHT)))
    script = _SCRIPT.format(id=div_id, data=data, layout=layout, config=json.dumps(dict(CONFIG)), then_addframes="",
                            then_animate="", then_post_script="")
    return _DIV.format(mathjax_script="", load_plotlyjs="", height=height, width=width, id=div_id,
                       script=script).strip()
