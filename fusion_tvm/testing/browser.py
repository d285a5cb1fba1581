"""Headless Chromium driven over the DevTools protocol on a pipe (no Python dependency): open
a page in a viewport of an exact size, evaluate a script in it, take a screenshot.

>>> with Chromium() as browser:                      # None of these when no binary is found
...     page = browser.open("plan.html", width=1400, height=1000)
...     page.evaluate("document.title")
...     png = page.screenshot()

``--dump-dom`` / ``--screenshot`` size the *window*, and new headless Chromium keeps a strip
of it for browser chrome (a 1400x1000 window has a 1400x857 viewport), so the viewport is set
here with ``Emulation.setDeviceMetricsOverride``, as a test needs it.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

#: Binaries tried, in order.
NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
#: Flags for a quiet, offline headless run (without the background-networking ones Chromium
#: floods its log with refused connections).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe")


def find_chromium() -> str | None:
    """The first Chromium or Chrome binary on PATH; None when there is none."""
    return next((p for p in map(shutil.which, NAMES) if p), None)


class BrowserError(RuntimeError):
    """Chromium exited, timed out, or answered a command with an error."""


class Chromium:
    """One headless Chromium process; a context manager (it is closed on exit)."""

    def __init__(self, binary: str | None = None, timeout: float = 60.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no chromium binary on PATH (apt-get install chromium)")
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []
        self._profile = tempfile.TemporaryDirectory(prefix="fusion_tvm_chromium_")
        to_r, self._to_w = os.pipe()  # commands: Chromium reads fd 3
        self._from_r, from_w = os.pipe()  # answers: Chromium writes fd 4

        def pipes_as_3_and_4():
            # via fresh numbers first: the pipes may themselves be fds 3 and 4. dup2 makes
            # them inheritable; Python's own fds are not (PEP 446), so close_fds=False
            # passes these two along only
            read, write = os.dup(to_r), os.dup(from_w)
            os.dup2(read, 3)
            os.dup2(write, 4)
            os.close(read)
            os.close(write)

        self.proc = subprocess.Popen(  # noqa: S603 - our own command line
            [self.binary, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=pipes_as_3_and_4, close_fds=False)  # noqa: PLW1509
        os.close(to_r)
        os.close(from_w)

    # -- protocol
    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_for(self, method: str, session: str | None = None) -> dict:
        """The next event ``method`` (of ``session``)."""
        while True:
            for k, ev in enumerate(self._events):
                if ev["method"] == method and ev.get("sessionId") == session:
                    return self._events.pop(k)
            reply = self._read()
            if "method" in reply:
                self._events.append(reply)

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_r], [], [], max(0.0, left))
            if not ready:
                raise BrowserError(f"chromium did not answer within {self.timeout:.0f} s")
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr \
                    else ""
                raise BrowserError(f"chromium exited (rc {self.proc.poll()}): {err[-1000:]}")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    # -- pages
    def open(self, url: str | os.PathLike, width: int = 1400, height: int = 1000,
             scrollbars: bool = True) -> Page:
        """A new tab of ``width`` x ``height`` CSS pixels (device scale 1) showing ``url``
        (a path is opened as a file), once its load event fired; ``scrollbars=False`` hides
        them (for a screenshot)."""
        if not str(url).startswith(("file:", "http:", "https:", "about:", "data:")):
            url = Path(url).resolve().as_uri()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session)
        if not scrollbars:
            self.send("Emulation.setScrollbarsHidden", {"hidden": True}, session)
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": str(url)}, session)
        self.wait_for("Page.loadEventFired", session)
        return Page(self, session)

    def close(self) -> None:
        """End the browser (and its profile folder)."""
        if self.proc.poll() is None:
            try:
                self.send("Browser.close")
            except (BrowserError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()
        self._profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """One tab of a :class:`Chromium`."""

    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str):
        """The JSON value of ``expression`` (a promise is awaited); a thrown error raises."""
        res = self.browser.send("Runtime.evaluate", {"expression": expression,
                                                     "returnByValue": True,
                                                     "awaitPromise": True}, self.session)
        if "exceptionDetails" in res:
            raise BrowserError(f"script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)
        return base64.b64decode(data["data"])
