"""How fast the explorer page (`graphtrace view`) opens on a big trace, in a real headless Chromium.

Goal (issue 16): a trace of thousands of calls (a 0.85B-parameter model's depth) opens in well under two seconds and
stays responsive: the tree is built lazily, so load time grows with the JSON, not with the DOM.

    python benchmarks/viewer_load.py [--layers 48] [--ops]

Prints: calls, page size, the time Python takes to write the page (graph included), and in the browser the time
from navigation to the page's script having built the first view (``ready``, its own ``performance.now()``), the
wall time to the load event, a search over every path, and revealing + selecting the deepest last call.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import graphtrace  # noqa: E402
from graphtrace.render.html import write_html  # noqa: E402
from tests.browser import Browser  # noqa: E402
from tests.zoo import llama  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--ops", action="store_true", help="record op records too (many more calls)")
    parser.add_argument("--steps", type=int, default=1, help="forward calls recorded (tracing() around several)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = llama(layers=args.layers)
    with graphtrace.tracing(model, values="none", ops=args.ops) as session:
        with torch.no_grad():
            for _ in range(args.steps):
                model(**inputs)
    trace = session.trace
    assert trace is not None
    calls = sum(1 for _ in trace.walk())
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "trace.html"
        started = time.perf_counter()
        write_html(trace, page)
        build = time.perf_counter() - started
        with Browser() as browser:
            loads, readies = [], []
            for _ in range(3):
                started = time.perf_counter()
                browser.open(page)
                loads.append(time.perf_counter() - started)
                readies.append(float(browser.evaluate("document.documentElement.dataset.ready")))
            assert browser.console_errors == [], browser.console_errors
            search = browser.evaluate(
                "(() => { const t = performance.now(); const input = document.getElementById('search'); "
                "input.value = 'layers.*.mlp.down_proj'; "
                "input.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'})); "
                "return performance.now() - t })()"
            )
            reveal = browser.evaluate(
                "(() => { const calls = graphtrace.data.sides[0].calls; let k = 0; "
                "calls.forEach((c, i) => { if (c.p.split('.').length > calls[k].p.split('.').length) k = i }); "
                "const t = performance.now(); graphtrace.select(0, k, true); return performance.now() - t })()"
            )
            rows = browser.evaluate("document.querySelectorAll('.row').length")
    print(f"llama {args.layers} layers{' with ops' if args.ops else ''}, {args.steps} step(s): {calls} calls")
    print(f"  page {page_size(trace):.0f} KB, written by Python in {build:.2f} s (call graph through dot included)")
    print(
        f"  browser: ready {min(readies):.0f} ms after navigation (best of 3; {', '.join(f'{r:.0f}' for r in readies)})"
    )
    print(f"  browser: load event {min(loads) * 1000:.0f} ms wall (best of 3)")
    print(f"  select the deepest call (reveal through folded layers): {reveal:.1f} ms; {rows} rows in the DOM after")
    print(f"  search over every path, reveal and select the first hit: {search:.1f} ms")


def page_size(trace: graphtrace.Trace) -> float:
    with tempfile.TemporaryDirectory() as folder:
        return write_html(trace, Path(folder) / "p.html").stat().st_size / 1024


if __name__ == "__main__":
    main()
