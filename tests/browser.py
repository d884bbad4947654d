"""A real headless Chromium driven over the Chrome DevTools Protocol (websocket-client), for the explorer page tests.

Debian's ``chromium`` is started with a fresh profile and no background networking; it listens on a loopback port
that it chooses itself. Pages are opened from ``file://``. Nothing here downloads anything.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One Chromium process and one page, driven synchronously: ``open``, ``evaluate``, ``click``, ``screenshot``."""

    def __init__(self, width: int = 1400, height: int = 860) -> None:
        import websocket  # websocket-client, a test dependency

        program = chromium_path()
        if program is None:
            raise RuntimeError("chromium is not installed (make test installs it: apt-get install -y chromium)")
        self._profile = tempfile.mkdtemp(prefix="graphtrace-chromium-")
        self.process = subprocess.Popen(
            [program, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        port = self._port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
            targets = json.load(response)
        page = next(target for target in targets if target["type"] == "page")
        self._ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.console_errors: list[str] = []

    def _port(self) -> int:
        assert self.process.stderr is not None
        for line in self.process.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
            if "DevTools listening on ws://" in line:
                return int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        raise RuntimeError(f"chromium exited ({self.process.wait()}) before it listened for DevTools")

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one command and wait for its answer; events met on the way are looked at, not kept."""
        self._next_id += 1
        ident = self._next_id
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params or {}}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self._event(message)

    def _event(self, message: dict[str, Any]) -> str | None:
        method = message.get("method")
        if method == "Runtime.exceptionThrown":
            details = message["params"]["exceptionDetails"]
            self.console_errors.append(str(details.get("exception", {}).get("description", details.get("text"))))
        elif method == "Runtime.consoleAPICalled" and message["params"]["type"] == "error":
            self.console_errors.append(" ".join(str(a.get("value")) for a in message["params"]["args"]))
        return method

    def open(self, path: Path) -> None:
        """Navigate to a local file and return once its load event fired (the page's script has run by then)."""
        self.call("Page.navigate", {"url": path.resolve().as_uri()})
        while self._event(json.loads(self._ws.recv())) != "Page.loadEventFired":
            pass

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the middle of the element ``selector`` finds."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "e.scrollIntoView({block: 'center', inline: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.x + r.width / 2, r.y + r.height / 2] })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def key(self, key: str) -> None:
        """Press and release a named key (``"ArrowDown"``) on the page."""
        codes = {"ArrowLeft": 37, "ArrowUp": 38, "ArrowRight": 39, "ArrowDown": 40, "Enter": 13}
        for kind in ("rawKeyDown", "keyUp"):
            self.call(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": codes.get(key, 0)},
            )

    def press(self, key: str) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": 13})

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
