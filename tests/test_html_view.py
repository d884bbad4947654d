"""The explorer page (`graphtrace view`, `graphtrace diff --html`, graphtrace.to_html) in a real headless Chromium:
the page loads from file:// with no network, a node expands, a graph box selects its call, search finds a call, and
a diff page opens on the first divergence. Pages are also checked as text (self-contained, script-safe)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import graphtrace
from graphtrace.errors import InvalidOptionError, OutputPathError
from graphtrace.model import CallNode, TensorRecord, Trace, TraceMeta
from graphtrace.render.html import to_html, trace_summary_html, write_html
from tests.browser import Browser, chromium_path
from tests.conftest import run_cli, run_reference
from tests.zoo import llama

needs_chromium = pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (make test installs it)")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama captured with op records (original/), and again with one weight of layer 1's attention changed
    (changed/)."""
    root = tmp_path_factory.mktemp("view")
    model, inputs = llama()
    graphtrace.capture(model, inputs, path=root / "original", ops=True)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight[0, 0] += 1.0
    graphtrace.capture(model, inputs, path=root / "changed", ops=True)
    return root


@pytest.fixture(scope="module")
def browser() -> Any:
    if chromium_path() is None:
        pytest.skip("chromium is not installed (make test installs it)")
    with Browser() as instance:
        yield instance


def _stats_text(x: float) -> str:
    """How the page prints a statistic (4 significant digits, as viewer.js's num())."""
    return f"{x:.4g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.3e}".replace("e-0", "e-").replace("e+0", "e+")


def _index(browser: Browser, path: str) -> int:
    """The position of call ``path@0`` in the page's data."""
    found = browser.evaluate(f"graphtrace.data.sides[0].calls.findIndex(c => c.p === {json.dumps(path)} && c.i === 0)")
    assert isinstance(found, int) and found >= 0, path
    return found


def test_page_is_self_contained(traces: Path) -> None:
    result = run_cli("view", str(traces / "original"))
    assert result.returncode == 0, result.stderr
    page = traces / "original" / "LlamaForCausalLM_trace.html"
    assert f"wrote {page}" in result.stdout
    text = page.read_text(encoding="utf-8")
    assert text.count("<script") == 2  # the data and the viewer, nothing loaded from elsewhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<link" not in text and "@import" not in text
    assert "<svg" in text and "<title>LlamaForCausalLM.model.embed_tokens@0</title>" in text  # boxes by call id


def test_module_paths_cannot_break_out_of_the_data(tmp_path: Path) -> None:
    """A trace is untrusted input: a path holding markup stays data."""
    evil = "M.</script><script>document.title='pwned'</script>"
    record = TensorRecord(shape=(2,), dtype="torch.float32")
    trace = Trace(steps=(CallNode(path=evil, type_name="X<b>", outputs=record),), meta=TraceMeta(model_class="M"))
    text = to_html(trace, graph=False)
    assert text.count("<script") == 2 and "pwned'</script>" not in text
    assert _page_data(text)["sides"][0]["calls"][0]["p"] == evil


@needs_chromium
def test_expand_click_a_box_and_see_the_call(traces: Path, browser: Browser, tmp_path: Path) -> None:
    trace = graphtrace.load(str(traces / "original"))
    page = write_html(trace, tmp_path / "trace.html")
    browser.open(page)
    assert browser.evaluate("document.documentElement.dataset.ready") is not None
    assert browser.console_errors == []

    # The decoder layers are folded into one row; expanding it shows the layers, lazily.
    assert (
        browser.evaluate("[...document.querySelectorAll('.row .name')].some(e => e.textContent === 'layers.1')")
        is False
    )
    fold = browser.evaluate("document.querySelector('.row.fold .name').textContent")
    assert fold == "layers.0–2"  # the zoo Llama has 3 identical layers
    browser.click(".row.fold")
    names = browser.evaluate("[...document.querySelectorAll('.row .name')].map(e => e.textContent)")
    assert "layers.0" in names and "layers.1" in names

    # Clicking the graph box of an o_proj (the graph folds identical layers: the box stands for layer 0's) selects
    # that call and shows its output statistics.
    drawn = browser.evaluate(
        "[...document.querySelectorAll('#graph g.node[data-k]')]"
        ".map(g => graphtrace.data.sides[0].calls[+g.dataset.k].p)"
    )
    target = next(path for path in drawn if path.endswith("self_attn.o_proj"))
    browser.click(f"#graph g.node[data-k='{_index(browser, target)}']")
    heading = browser.evaluate("document.querySelector('#details h3').textContent")
    assert heading == target
    record = next(r for _, r in trace.find(target).output_tensors())
    assert record.stats is not None
    cells = browser.evaluate(
        "[...document.querySelectorAll('#details table')[1].querySelectorAll('td')].map(td => td.textContent)"
    )
    assert cells[:3] == ["output", f"[{', '.join(map(str, record.shape))}]", "float32"]
    assert cells[3] == _stats_text(record.stats.mean) and cells[4] == _stats_text(record.stats.std)
    assert browser.evaluate("document.querySelector('.row.selected .name').textContent") == "o_proj"
    assert browser.evaluate("document.querySelectorAll('#graph g.selected').length") == 1

    # A module's op records are listed with it.
    with_ops = browser.evaluate(
        "(() => { const calls = graphtrace.data.sides[0].calls; "
        "return calls.findIndex(c => c.c && c.c.some(j => calls[j].k === 'op')) })()"
    )
    assert with_ops >= 0
    browser.evaluate(f"graphtrace.select(0, {with_ops}, true)")
    assert "op records" in browser.evaluate("document.getElementById('details').textContent")
    assert browser.console_errors == []


@needs_chromium
def test_search_reveals_a_call(traces: Path, browser: Browser, tmp_path: Path) -> None:
    page = write_html(graphtrace.load(str(traces / "original")), tmp_path / "trace.html", graph=False)
    browser.open(page)
    assert "graph was not drawn" in browser.evaluate("document.getElementById('graph').textContent")
    browser.click("#search")
    browser.type_text("layers.1.*up_proj")
    browser.press("Enter")
    assert browser.evaluate("document.querySelector('#details h3').textContent") == (
        "LlamaForCausalLM.model.layers.1.mlp.up_proj"
    )
    assert browser.evaluate("document.querySelector('.row.selected .name').textContent") == "up_proj"
    assert browser.console_errors == []


@needs_chromium
def test_diff_page_opens_on_the_first_divergence(traces: Path, browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "diff.html"
    result = run_cli("diff", str(traces / "original"), str(traces / "changed"), "--html", str(page))
    assert result.returncode == 1, result.stderr
    assert f"wrote {page}" in result.stderr
    browser.open(page)
    assert browser.console_errors == []
    culprit = "LlamaForCausalLM.model.layers.1.self_attn.o_proj"
    banner = browser.evaluate("document.querySelector('#details .banner').textContent")
    assert banner.startswith("FIRST DIVERGENCE — diverges while its inputs agree")
    selected = browser.evaluate(
        "[...document.querySelectorAll('.row.selected')].map(r => [r.dataset.side, "
        "graphtrace.data.sides[+r.dataset.side].calls[+r.dataset.k].p])"
    )
    assert selected == [["0", culprit], ["1", culprit]]  # both sides, aligned
    assert browser.evaluate("document.querySelector('.row.first').classList.contains('st-diverged')")
    assert browser.evaluate("document.querySelectorAll('#graph g.st-diverged').length") >= 1
    # Calls before the culprit agree; calls after it diverge downstream.
    assert browser.evaluate("document.querySelectorAll('.row.st-equal').length") > 0


def test_notebook_fragments(traces: Path) -> None:
    trace = graphtrace.load(str(traces / "original"))
    fragment = trace._repr_html_()
    assert fragment == trace_summary_html(trace)
    assert "coverage" in fragment and "<svg" in fragment and "<script" not in fragment
    assert "<a " not in fragment and "xlink:href" not in fragment
    comparison = graphtrace.compare(str(traces / "original"), str(traces / "changed"))
    html = comparison._repr_html_()
    assert "first divergence" in html and "model.layers.1.self_attn.o_proj@0" in html
    assert "<script" not in html


def test_an_unwritable_page_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    trace = Trace(steps=(CallNode(path="M", type_name="M"),), meta=TraceMeta(model_class="M"))
    (tmp_path / "page.html").mkdir()  # a directory where the page should go: the rename fails
    with pytest.raises(OutputPathError, match=r"cannot write .*page\.html \(\d[\d,]* bytes\)"):
        write_html(trace, tmp_path / "page.html", graph=False)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temporary file left behind


def test_view_of_a_trace_written_by_transformers(tmp_path: Path) -> None:
    model, inputs = llama()
    run_reference(model, lambda: model(**inputs), tmp_path / "reference")
    result = run_cli("view", str(tmp_path / "reference"), "-o", str(tmp_path / "ref.html"))
    assert result.returncode == 0, result.stderr
    assert "LlamaForCausalLM.model.layers.0.mlp.down_proj" in (tmp_path / "ref.html").read_text(encoding="utf-8")


def _page_data(text: str) -> Any:
    found = re.search(r'<script type="application/json" id="graphtrace-data">(.*?)</script>', text, re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_diff_page_marks_calls_without_a_counterpart() -> None:
    from graphtrace.demo import DemoConfig, demo_inputs, demo_model

    four = graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")
    three = graphtrace.capture(demo_model(DemoConfig(num_layers=3)), demo_inputs(), strategy="eager")
    comparison = graphtrace.compare(four, three)
    data = _page_data(to_html(comparison, graph=False))
    only_a = {call["p"] for call in data["sides"][0]["calls"] if call.get("x")}
    assert only_a == {item.call.path for item in comparison.only_in_a} and "DemoTransformer.layers.3" in only_a
    assert not any(call.get("x") for call in data["sides"][1]["calls"])
    assert len(data["pairs"]) == len(comparison.calls)
    for pair in data["pairs"]:  # each pair points at the same call on both sides
        a, b = data["sides"][0]["calls"][pair["ka"]], data["sides"][1]["calls"][pair["kb"]]
        assert (f"{a['p']}@{a['i']}", f"{b['p']}@{b['i']}") == (pair["a"], pair["b"])


@needs_chromium
def test_arrow_keys_walk_the_tree(traces: Path, browser: Browser, tmp_path: Path) -> None:
    page = write_html(graphtrace.load(str(traces / "original")), tmp_path / "trace.html", graph=False)
    browser.open(page)

    def selected() -> str:
        return str(browser.evaluate("document.querySelector('#details h3').textContent"))

    assert selected() == "LlamaForCausalLM"  # the root is selected on load
    browser.key("ArrowDown")
    assert selected() == "LlamaForCausalLM.model"
    browser.key("ArrowDown")
    assert selected() == "LlamaForCausalLM.model.embed_tokens"
    browser.key("ArrowLeft")  # a leaf: up to its parent
    assert selected() == "LlamaForCausalLM.model"
    browser.key("ArrowLeft")  # collapse it: the next row down is the root's next child
    browser.key("ArrowDown")
    assert selected() == "LlamaForCausalLM.lm_head"  # the root's next child (its logits slice is a view: no op)
    assert browser.console_errors == []


def test_to_html_names_what_it_takes() -> None:
    with pytest.raises(InvalidOptionError, match="takes a Trace or a Comparison, got str"):
        graphtrace.to_html("some/dir")  # type: ignore[arg-type]


@needs_chromium
def test_a_fallback_reads_as_a_note_with_its_reason_one_click_away(
    traces: Path, browser: Browser, tmp_path: Path
) -> None:
    browser.open(write_html(graphtrace.load(str(traces / "original")), tmp_path / "trace.html", graph=False))
    header = browser.evaluate("document.querySelector('header .meta').textContent")
    assert header.endswith("torch.fx verified 41 of 45 module calls (91%)")
    browser.evaluate(f"graphtrace.select(0, {_index(browser, 'LlamaForCausalLM.model.layers.0.self_attn')}, true)")
    assert browser.evaluate("document.querySelector('.row.selected .badge.wrap').textContent") == "wrapped"
    assert "fallback" not in browser.evaluate("document.body.innerText")
    banner = "document.querySelector('#details .banner.wrapped')"
    assert browser.evaluate(f"{banner}.textContent").startswith(
        "recorded by wrapping forward: the model passes a cache object"
    )
    reason = f"{banner}.querySelector('code')"
    assert browser.evaluate(f"{reason}.checkVisibility()") is False  # folded away until asked for
    browser.click("#details .banner.wrapped summary")
    assert browser.evaluate(f"{reason}.checkVisibility()") is True
    assert (
        browser.evaluate(f"{reason}.textContent") == "Refused: calls DynamicCache.update, which a replay would repeat"
    )
    assert browser.console_errors == []


@needs_chromium
def test_parameter_counts_in_the_tree_and_the_details(traces: Path, browser: Browser, tmp_path: Path) -> None:
    browser.open(write_html(graphtrace.load(str(traces / "original")), tmp_path / "trace.html", graph=False))
    layer = _index(browser, "LlamaForCausalLM.model.layers.1")
    browser.evaluate(f"graphtrace.select(0, {layer}, true)")
    assert browser.evaluate("document.querySelector('.row.selected .params').textContent") == "9.28K params"
    assert "9,280 parameters" in browser.evaluate("document.querySelector('#details .sub').textContent")
    assert browser.console_errors == []


@needs_chromium
def test_arrow_keys_walk_the_search_hits_and_enter_picks_one(traces: Path, browser: Browser, tmp_path: Path) -> None:
    browser.open(write_html(graphtrace.load(str(traces / "original")), tmp_path / "trace.html", graph=False))
    browser.click("#search")
    browser.type_text("layers.1.*proj")
    browser.key("ArrowDown")  # lists the hits (typed since), the first active
    browser.key("ArrowDown")
    browser.key("ArrowDown")
    browser.key("ArrowUp")
    hits = browser.evaluate("[...document.querySelectorAll('.results .hit')].map(e => e.textContent)")
    assert len(hits) == 7 and hits[1] == "LlamaForCausalLM.model.layers.1.self_attn.k_proj"
    assert browser.evaluate("document.querySelector('.results .hit.active').textContent") == hits[1]
    browser.press("Enter")
    assert browser.evaluate("document.querySelector('#details h3').textContent") == hits[1]
    assert browser.evaluate("document.querySelector('.row.selected .name').textContent") == "k_proj"
    assert browser.console_errors == []


@needs_chromium
def test_a_trace_with_nan_opens_on_the_call_that_made_it(browser: Browser, tmp_path: Path) -> None:
    model, inputs = llama()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    trace = graphtrace.capture(model, inputs, path=tmp_path / "nan")
    culprit = "LlamaForCausalLM.model.layers.1.mlp.down_proj"
    assert trace.first_nonfinite() is trace.find(culprit)
    browser.open(write_html(trace, tmp_path / "nan.html", graph=False))
    assert browser.evaluate("document.querySelector('#details h3').textContent") == culprit
    assert browser.evaluate("document.querySelector('.row.selected .name').textContent") == "down_proj"
    link = "header a.nan-link"
    assert browser.evaluate(f"document.querySelector('{link}').textContent") == (
        "first NaN/Inf: model.layers.1.mlp.down_proj"
    )
    browser.evaluate("graphtrace.select(0, 0, true)")  # elsewhere; the header's link leads back
    browser.click(link)
    assert browser.evaluate("document.querySelector('#details h3').textContent") == culprit
    assert browser.console_errors == []


def test_a_diff_page_is_titled_by_its_directories(traces: Path) -> None:
    comparison = graphtrace.compare(str(traces / "original"), str(traces / "changed"))
    data = _page_data(to_html(comparison, graph=False))
    assert data["title"] == "original vs changed"  # not "LlamaForCausalLM vs LlamaForCausalLM"


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A six-layer Llama with statistics only (original/), and again with one MLP weight of layer 3 scaled by 1.0001
    (port/): a bug that four digits do not show."""
    root = tmp_path_factory.mktemp("scaled")
    model, inputs = llama(layers=6)
    graphtrace.capture(model, inputs, path=root / "original", values="none")
    with torch.no_grad():
        model.model.layers[3].mlp.up_proj.weight.mul_(1.0001)
    graphtrace.capture(model, inputs, path=root / "port", values="none")
    return root


@needs_chromium
def test_the_first_divergence_shows_a_b_and_their_difference_in_digits_that_differ(
    scaled: Path, browser: Browser, tmp_path: Path
) -> None:
    comparison = graphtrace.compare(scaled / "original", scaled / "port")
    first = comparison.first_divergence
    assert first is not None and first.a.path.endswith("layers.3.mlp.up_proj")
    browser.open(write_html(comparison, tmp_path / "diff.html", graph=False))
    table = "document.querySelector('#details table.abd')"
    rows = browser.evaluate(
        f"[...{table}.querySelectorAll('tr')].map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent))"
    )
    output = next(i for i, row in enumerate(rows) if row and row[0].startswith("outputs"))
    shown = [rows[output][1:5], *(row[:4] for row in rows[output + 1 : output + 4])]
    record_a, record_b = (dict(call.output_tensors())[""] for call in (first.a, first.b))
    assert record_a.stats is not None and record_b.stats is not None
    same_at_four = 0
    values = [
        [getattr(stats, name) for name in ("mean", "std", "min", "max")] for stats in (record_a.stats, record_b.stats)
    ]
    for (stat, a, b, delta), x, y in zip(shown, *values, strict=True):
        assert stat in ("mean", "std", "min", "max")
        assert float(a) == pytest.approx(x, rel=1e-3) and float(b) == pytest.approx(y, rel=1e-3)
        if x != y:  # as many digits as it takes: they differ in print, and the difference is there
            assert a != b and float(delta) == pytest.approx(y - x, rel=1e-2)
        same_at_four += f"{x:.4g}" == f"{y:.4g}" != f"{x:.17g}"
    assert same_at_four >= 1  # what four digits, as the page printed them before, showed as equal
    assert browser.console_errors == []


@needs_chromium
def test_a_diverging_block_is_never_folded_among_identical_ones(scaled: Path, browser: Browser, tmp_path: Path) -> None:
    comparison = graphtrace.compare(scaled / "original", scaled / "port")
    browser.open(write_html(comparison, tmp_path / "diff.html", graph=False))
    folds = browser.evaluate(
        "[...document.querySelectorAll('.tree[data-side=\"0\"] .row.fold')].map(r => r.textContent)"
    )
    assert folds == ["▸layers.0–2LlamaDecoderLayer ×3 identical blocks, all agree"]  # layers 3-5 depart: unfolded
    names = browser.evaluate(
        "[...document.querySelectorAll('.tree[data-side=\"0\"] .row .name')].map(e => e.textContent)"
    )
    assert {"layers.3", "layers.4", "layers.5"} <= set(names)
    assert browser.console_errors == []


@needs_chromium
def test_the_diff_page_fits_1400_pixels(scaled: Path, browser: Browser, tmp_path: Path) -> None:
    """Nothing is cut at the width the page was tried at: every tree row's name and marks, the table's columns."""
    browser.open(write_html(graphtrace.compare(scaled / "original", scaled / "port"), tmp_path / "diff.html"))
    assert browser.evaluate("window.innerWidth") == 1400
    browser.evaluate("document.querySelectorAll('.row').forEach(r => r.click())")  # open every row that has calls
    clipped = browser.evaluate(
        "[...document.querySelectorAll('.tree .row')].filter(r => r.offsetParent !== null).flatMap(r => {"
        " const pane = r.closest('.pane').getBoundingClientRect();"
        " return [...r.querySelectorAll('.name, .badge')].filter(e => e.getBoundingClientRect().right > pane.right"
        "  || e.scrollWidth > e.clientWidth + 1).map(e => e.textContent) })"
    )
    assert clipped == []
    details = browser.evaluate(
        "[document.getElementById('details').scrollWidth, document.getElementById('details').clientWidth]"
    )
    assert details[0] <= details[1]
    assert browser.console_errors == []
