"""Regenerate docs/viewer.png, docs/viewer_diff.png and docs/diff_page.png: the explorer page of a tiny Llama's trace,
of its diff against a copy with one weight changed, and of a 1.0001x bug (one MLP weight of layer 1 scaled by 1.0001)
at its first divergence, at 1400 pixels, in headless Chromium (needs Debian's chromium and websocket-client).

    python examples/viewer_screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import graphtrace  # noqa: E402
from graphtrace.render.html import write_html  # noqa: E402
from tests.browser import Browser  # noqa: E402
from tests.zoo import llama  # noqa: E402


def main() -> None:
    model, inputs = llama(layers=4)
    original = graphtrace.capture(model, inputs, ops=True)
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight[0, 0] += 1.0
    changed = graphtrace.capture(model, inputs, ops=True)
    with tempfile.TemporaryDirectory() as folder, Browser(1440, 900) as browser:
        trace_page = write_html(original, Path(folder) / "trace.html")
        diff_page = write_html(graphtrace.compare(original, changed), Path(folder) / "diff.html")
        browser.open(trace_page)
        mlp = browser.evaluate("graphtrace.data.sides[0].calls.findIndex(c => c.p.endsWith('layers.1.mlp'))")
        browser.evaluate(f"graphtrace.select(0, {mlp}, true)")
        browser.screenshot(ROOT / "docs" / "viewer.png")
        browser.open(diff_page)  # opens on the first divergence
        browser.screenshot(ROOT / "docs" / "viewer_diff.png")
        assert not browser.console_errors, browser.console_errors
    scaled_bug(ROOT / "docs" / "diff_page.png")
    print("wrote docs/viewer.png, docs/viewer_diff.png, docs/diff_page.png")


def scaled_bug(picture: Path) -> None:
    """The diff page of a 1.0001x bug at its first divergence: the A | B | Δ table prints the statistics with as many
    digits as it takes to tell them apart."""
    model, inputs = llama()
    with tempfile.TemporaryDirectory() as folder, Browser(1400, 900) as browser:
        original, port = Path(folder) / "original", Path(folder) / "port"
        graphtrace.capture(model, inputs, path=original, values="safetensors")
        with torch.no_grad():
            model.model.layers[1].mlp.up_proj.weight.mul_(1.0001)
        graphtrace.capture(model, inputs, path=port, values="safetensors")
        browser.open(write_html(graphtrace.compare(original, port), Path(folder) / "diff.html"))
        browser.screenshot(picture)
        assert not browser.console_errors, browser.console_errors


if __name__ == "__main__":
    main()
