"""Drive a real headless Chromium through the Chrome DevTools Protocol (CDP), for browser tests
that must click, type and look (tests/helpers/browser.py only loads a page and dumps its DOM).

    with Browser() as page:                 # a fresh profile, closed and removed on exit
        page.goto("http://127.0.0.1:8888/lab?token=...")
        page.wait_for("document.querySelector('.jp-Notebook') !== null", timeout=120)
        page.click(x, y); page.type_text("abc"); page.press("Enter")
        page.errors                         # console errors, exceptions, error log entries

Chromium picks its own debugging port (`--remote-debugging-port=0`) and writes it to
DevToolsActivePort in the profile, so no port is guessed. Every request to a host other than the
loopback interface goes to a closed port: nothing leaves the machine. Uses only the installed
`websocket-client` package.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

from browser import CHROMIUM_FLAGS, chromium, chromium_env

# Loopback bypasses the proxy by default; anything else is sent to a port nothing listens on.
_NO_NETWORK = ["--proxy-server=http://127.0.0.1:9"]


class CDPError(RuntimeError):
    """A CDP command failed, or a condition was not met in time."""


class Browser:
    """One headless Chromium with one page, driven over CDP; use it as a context manager so
    that the browser and its profile are always removed, whatever the test does."""

    def __init__(self, width: int = 1400, height: int = 1000):
        self.size = (width, height)
        self.events: list[dict] = []
        self._id = 0
        self._proc: subprocess.Popen | None = None
        self._profile: str | None = None
        self._ws: websocket.WebSocket | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Browser":
        for attempt in (1, 2):
            try:
                self._start()
                return self
            except _NotStarted:
                self.close()  # a Chromium that died or hung at start-up (both seen under a
                if attempt == 2:  # loaded suite): one fresh launch, then the failure stands
                    raise
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="diagkit-chromium-")
        w, h = self.size
        self._proc = subprocess.Popen(
            [chromium(), *CHROMIUM_FLAGS, *_NO_NETWORK, f"--user-data-dir={self._profile}",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--window-size={w},{h}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=chromium_env(self._profile))
        port_file = Path(self._profile) / "DevToolsActivePort"
        try:
            _poll(lambda: self._alive() and port_file.exists() and port_file.read_text().strip(),
                  60, "Chromium did not open its debugging port")
        except CDPError as exc:  # alive but silent: as good as dead, launched afresh
            raise _NotStarted(str(exc)) from exc
        port = int(port_file.read_text().split()[0])
        pages = _poll(lambda: [t for t in _json(f"http://127.0.0.1:{port}/json/list")
                               if t.get("type") == "page"], 30, "Chromium shows no page")
        self._ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                               suppress_origin=True)
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=w, height=h,
                  deviceScaleFactor=1, mobile=False)

    def _alive(self) -> bool:
        """True while the browser runs; raises `_Exited` (never retried by `_poll`) once it
        has ended by itself."""
        code = self._proc.poll()
        if code is not None:
            raise _Exited(f"Chromium exited with code {code} before opening its debugging port")
        return True

    def close(self) -> None:
        """Close the socket, end the browser (kill if it lingers), remove the profile."""
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
            self._ws = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=15)
            self._proc = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    # ------------------------------------------------------------------ protocol
    def send(self, method: str, timeout: float = 60, **params) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._id += 1
        mine = self._id
        self._ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            self._ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                message = json.loads(self._ws.recv())
            except websocket.WebSocketTimeoutException:
                raise CDPError(f"{method}: no answer within {timeout} s") from None
            if message.get("id") == mine:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def pump(self, seconds: float = 0.2) -> None:
        """Read the events that arrive within `seconds` (console messages are events)."""
        self._ws.settimeout(seconds)
        try:
            while True:
                message = json.loads(self._ws.recv())
                if "method" in message:
                    self.events.append(message)
        except websocket.WebSocketTimeoutException:
            pass

    def evaluate(self, expression: str, timeout: float = 60):
        """The value of a JS expression (promises awaited), or CDPError with JS's own message."""
        result = self.send("Runtime.evaluate", timeout=timeout, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"JS error in {expression[:80]!r}: {text}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60, what: str | None = None):
        """Poll a JS expression until it is truthy; return its value. A slow machine only
        makes this wait longer, never fail early."""
        return _poll(lambda: self.evaluate(expression), timeout,
                     f"not met within {timeout} s: {what or expression}", interval=0.25)

    # ------------------------------------------------------------------ input
    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def reload(self) -> None:
        self.send("Page.reload", ignoreCache=True)

    def click(self, x: float, y: float, *, ctrl: bool = False) -> None:
        """A real left click (move, press, release) at page coordinates; `ctrl` holds Control,
        which toggles an option of a multiple select."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            moving = kind == "mouseMoved"    # with no button held: a move, not a drag
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y,
                      button="none" if moving else "left", modifiers=2 if ctrl else 0,
                      clickCount=0 if moving else 1)

    def type_text(self, text: str) -> None:
        """Insert text at the focus as one input event, as an IME or a paste would."""
        self.send("Input.insertText", text=text)

    def press(self, key: str) -> None:
        """Press and release a named key ('Enter', 'Tab', 'Backspace', 'ArrowDown')."""
        codes = {"Enter": 13, "Tab": 9, "Backspace": 8, "Escape": 27, "ArrowDown": 40,
                 "ArrowUp": 38}
        for kind in ("rawKeyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=key,
                      windowsVirtualKeyCode=codes[key], nativeVirtualKeyCode=codes[key])
            if key == "Enter" and kind == "rawKeyDown":   # Enter also types a character
                self.send("Input.dispatchKeyEvent", type="char", key=key, text="\r")

    def clear_field(self) -> None:
        """Empty the focused text field as a user would: select all, then Backspace."""
        self.send("Input.dispatchKeyEvent", type="rawKeyDown", key="a", code="KeyA",
                  windowsVirtualKeyCode=65, modifiers=2, commands=["selectAll"])
        self.send("Input.dispatchKeyEvent", type="keyUp", key="a", code="KeyA",
                  windowsVirtualKeyCode=65, modifiers=2)
        self.press("Backspace")

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the viewport to `path` (JupyterLab scrolls inside it)."""
        data = self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    # ------------------------------------------------------------------ what went wrong
    @property
    def errors(self) -> list[str]:
        """Every console error, uncaught exception and error-level log entry so far."""
        self.pump(0.1)
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                found.append("exception: " + str(d.get("exception", {}).get("description")
                                                 or d.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                found.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        return found


def _json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class _NotStarted(RuntimeError):
    """The browser did not come up: it hung without opening its debugging port."""


class _Exited(_NotStarted):
    """The browser process ended by itself while it was being waited for."""


def _poll(probe, timeout: float, message: str, interval: float = 0.2):
    """probe() until it returns something truthy (errors count as 'not yet')."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (OSError, ValueError, CDPError) as exc:
            last = exc
        time.sleep(interval)
    raise CDPError(message + (f" (last error: {last})" if last else ""))
