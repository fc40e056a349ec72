"""The SVG charts (report/svg.py, drawn by templates/chart.html): every text they print is
escaped, so a run's names cannot open an element, end an attribute or break the page."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from pytest_osmosis.report.svg import bar_chart, histogram, line_chart, time_chart

HOSTILE = 'it\'s "q" </title><b>bold</b> & é 日本'
NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    """Every text and attribute value of *svg*, which must parse as XML on its own."""
    root = ET.fromstring(svg)
    texts: list[str] = []
    for element in root.iter():
        texts.append(element.text or "")
        texts.extend(element.attrib.values())
    return texts


CHARTS = {
    "bar": lambda s: bar_chart(
        s,
        s,
        [(s, 0.5, "pass", s), ("2", 1.0, "fail", "ok")],
        x_label=s,
        y_label=s,
        marker=(1.0, s),
        pct=True,
    ),
    "histogram": lambda s: histogram(s, s, [0.1, 0.9], x_label=s, unit=s, threshold=0.5),
    "line": lambda s: line_chart(s, s, [(1, 0.5), (2, 0.75)], x_label=s, y_label=s, note=s),
    "time": lambda s: time_chart(s, s, [(s, [(0.0, 0.5, s, s), (60.0, 1.0, s, None)])], y_label=s),
    "empty": lambda s: bar_chart(s, s, [], x_label=s, y_label=s),
}


@pytest.mark.parametrize("kind", sorted(CHARTS))
def test_every_text_of_a_chart_is_escaped(kind: str) -> None:
    svg = CHARTS[kind](HOSTILE)
    assert "<b>" not in svg
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; é 日本" in svg
    texts = _texts(svg)  # a lost escape is a parse error or a text cut in two
    assert HOSTILE in texts
    assert not any("bold" in t and t != HOSTILE and HOSTILE not in t for t in texts)


def test_each_text_slot_reaches_the_chart() -> None:
    """Each string given lands where it belongs, once escaped (the test above checks all)."""
    svg = time_chart("n<", "l&", [("title>", [(0.0, 0.5, "hover'", 'a"b.html')])], y_label="y<")
    root = ET.fromstring(svg)
    assert root.get("data-plot") == "n<" and root.get("aria-label") == "l&"
    assert root.find(f"{NS}title") is not None and root.findtext(f"{NS}title") == "l&"
    [link] = root.iter(f"{NS}a")
    assert link.get("href") == 'a"b.html' and link.findtext(f"{NS}circle/{NS}title") == "hover'"
    legend = [e.text for e in root.iter(f"{NS}text") if e.get("class") == "legend-entry s0"]
    assert legend == ["\u25cf title>"]
    assert 'href="a&#34;b.html"' in svg
