"""A small Chrome DevTools Protocol client for the browser tests (aiohttp websockets).

Starts headless Chromium with ``--remote-debugging-port=0``, reads the port it chose from
``DevToolsActivePort`` in its profile, and speaks CDP over one browser websocket in
"flattened" session mode, so a page and its out-of-process iframes (Chromium isolates
sandboxed iframes such as MLflow's HTML artifact viewer) are each one ``sessionId``.

    with Browser(exe, tmp_path / "profile") as browser:
        page = browser.open(url)
        page.wait_for("document.querySelector('iframe') !== null")
        value = page.evaluate_in_frames(expr, url_prefix="blob:")
        page.screenshot(path)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp


class CdpError(RuntimeError):
    """A CDP command failed or the browser did not answer in time."""


class Browser:
    """Headless Chromium driven over CDP; use as a context manager."""

    def __init__(self, exe: str, profile: Path, *, width: int = 1400, height: int = 1100,
                 timeout_s: float = 60.0) -> None:
        self.exe, self.profile = exe, Path(profile)
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self._loop = asyncio.new_event_loop()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.events: list[dict[str, Any]] = []
        self._proc: subprocess.Popen | None = None

    # --- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Browser:
        self.profile.mkdir(parents=True, exist_ok=True)
        log = open(self.profile / "chromium.log", "wb")  # handed to the child
        self._proc = subprocess.Popen(
            [self.exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise CdpError("chromium did not open its DevTools port: "
                               + (self.profile / "chromium.log").read_text()[-2000:])
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        self._run(self._connect(f"ws://127.0.0.1:{port.strip()}{path.strip()}"))
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self._run(self._close())
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._loop.close()

    async def _connect(self, ws_url: str) -> None:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(ws_url, max_msg_size=0, timeout=10)
        self._reader = asyncio.ensure_future(self._read())

    async def _close(self) -> None:
        self._reader.cancel()
        await self._ws.close()
        await self._http.close()

    async def _read(self) -> None:
        async for msg in self._ws:
            data = json.loads(msg.data)
            fut = self._pending.pop(data.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(data)
            elif "method" in data:
                self.events.append(data)

    def _run(self, coro):
        return self._loop.run_until_complete(asyncio.wait_for(coro, self.timeout_s))

    # --- commands --------------------------------------------------------------------
    async def _send(self, method: str, params: dict | None, session: str | None) -> dict:
        msg_id = next(self._ids)
        fut = self._loop.create_future()
        self._pending[msg_id] = fut
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self._ws.send_str(json.dumps(msg))
        reply = await fut
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """One CDP command; returns its result or raises :class:`CdpError`."""
        return self._run(self._send(method, params, session))

    def pump(self, seconds: float) -> None:
        """Let events arrive for ``seconds``."""
        self._run(asyncio.sleep(seconds))

    def open(self, url: str) -> Page:
        """A new tab at ``url`` (attached, with out-of-process iframes auto-attached)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"]
        page = Page(self, session)
        for method in ("Page.enable", "Runtime.enable"):
            self.send(method, session=session)
        self.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False,
                                           "flatten": True}, session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                   "mobile": False}, session)
        self.send("Page.navigate", {"url": url}, session)
        return page


class Page:
    """One tab, addressed by its flattened CDP session."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def evaluate(self, expression: str, *, session: str | None = None,
                 context_id: int | None = None) -> Any:
        """Value of a JS expression (returned by value) in the page or a frame."""
        params: dict[str, Any] = {"expression": expression, "returnByValue": True,
                                  "awaitPromise": True}
        if context_id is not None:
            params["contextId"] = context_id
        res = self.browser.send("Runtime.evaluate", params, session or self.session)
        if "exceptionDetails" in res:
            raise CdpError(f"JS error: {res['exceptionDetails'].get('text')} in {expression}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Poll ``expression`` in the page until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            with contextlib.suppress(CdpError):  # the page may be navigating
                value = self.evaluate(expression)
                if value:
                    return value
            self.browser.pump(0.25)
        raise CdpError(f"timed out after {timeout_s:.0f} s waiting for {expression} "
                       f"(last value {value!r})")

    def _frame_sessions(self) -> list[str]:
        """Sessions of out-of-process iframes attached under this page."""
        return [e["params"]["sessionId"] for e in self.browser.events
                if e.get("method") == "Target.attachedToTarget"
                and e.get("sessionId") == self.session
                and e["params"]["targetInfo"].get("type") == "iframe"]

    def _child_frames(self) -> list[dict]:
        tree = self.browser.send("Page.getFrameTree", session=self.session)["frameTree"]
        out, todo = [], list(tree.get("childFrames", []))
        while todo:
            node = todo.pop()
            out.append(node["frame"])
            todo.extend(node.get("childFrames", []))
        return out

    def evaluate_in_frames(self, expression: str, url_prefix: str = "") -> list[Any]:
        """``expression`` evaluated inside every iframe whose URL starts with ``url_prefix``,
        whether the iframe lives in the page's process (an isolated world is created in
        it) or in its own (its auto-attached session). Opaque-origin sandboxed iframes are
        out of reach of the page's own JS; CDP reaches them."""
        values = []
        for frame in self._child_frames():
            if not frame.get("url", "").startswith(url_prefix):
                continue
            with contextlib.suppress(CdpError):  # out-of-process: handled below
                ctx = self.browser.send("Page.createIsolatedWorld",
                                        {"frameId": frame["id"], "worldName": "gpuopt-test"},
                                        self.session)["executionContextId"]
                values.append(self.evaluate(expression, context_id=ctx))
        for session in self._frame_sessions():
            with contextlib.suppress(CdpError):  # a detached frame
                url = self.evaluate("location.href", session=session) or ""
                if url.startswith(url_prefix):
                    values.append(self.evaluate(expression, session=session))
        return values

    def screenshot(self, path: Path) -> None:
        """PNG of the viewport (iframes included, as a person sees it)."""
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)
        Path(path).write_bytes(base64.b64decode(data["data"]))

    def html(self) -> str:
        """The page's current DOM as HTML."""
        return self.evaluate("document.documentElement.outerHTML")
