"""A small threaded HTTP proxy on 127.0.0.1 in front of a real ``mlflow server``, misbehaving
on demand as the things that sit in front of tracking servers do:

* ``"pass"``: forwards every request and answer unchanged;
* ``"html"``: answers ``200 text/html`` "Please sign in" (a login proxy whose session expired);
* ``"redirect"``: answers ``302 Location: /login`` (an SSO proxy);
* ``"drip_status"``: forwards, then sends the answer one byte a second from the status line;
* ``"drip_body"``: forwards, sends the status line and headers at once, then the body one
  byte a second.

``mode`` may be changed while requests run; ``requests`` counts the requests that reached the
proxy per mode, ``forwarded`` those that reached the server.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOGIN_PAGE = (b"<!DOCTYPE html><html><head><title>Sign in</title></head>"
              b"<body><h1>Please sign in</h1><form action='/login'></form></body></html>")


class BadProxy:
    def __init__(self, upstream_port: int, mode: str = "pass", drip_s: float = 1.0) -> None:
        self.upstream_port = upstream_port
        self.mode = mode
        self.drip_s = drip_s
        self.requests: Counter = Counter()
        self.forwarded = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _handle(self) -> None:
                mode = proxy.mode
                with proxy._lock:
                    proxy.requests[mode] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if mode == "html":
                    self._send_raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8"
                                   b"\r\nContent-Length: %d\r\n\r\n" % len(LOGIN_PAGE)
                                   + LOGIN_PAGE)
                    return
                if mode == "redirect":
                    self._send_raw(b"HTTP/1.1 302 Found\r\nLocation: /login?next=/api\r\n"
                                   b"Content-Length: 0\r\n\r\n")
                    return
                raw = proxy._forward(self.command, self.path, dict(self.headers), body)
                if mode == "drip_status":
                    self._drip(raw)
                elif mode == "drip_body":
                    head, _, rest = raw.partition(b"\r\n\r\n")
                    self._send_raw(head + b"\r\n\r\n")
                    self._drip(rest)
                else:
                    self._send_raw(raw)

            def _send_raw(self, data: bytes) -> None:
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True

            def _drip(self, data: bytes) -> None:
                for i in range(len(data)):
                    if proxy._stop.is_set():
                        break
                    try:
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                    except OSError:
                        break
                    time.sleep(proxy.drip_s)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _forward(self, method: str, path: str, headers: dict, body: bytes) -> bytes:
        """The server's whole answer to one request, as raw HTTP/1.1 bytes (no keep-alive)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        try:
            headers = {k: v for k, v in headers.items()
                       if k.lower() not in ("connection", "keep-alive", "host")}
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            with self._lock:
                self.forwarded += 1
            lines = [f"HTTP/1.1 {resp.status} {resp.reason}"]
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    lines.append(f"{k}: {v}")
            lines += [f"Content-Length: {len(data)}", "Connection: close"]
            return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data
        except (OSError, http.client.HTTPException):
            return b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"
        finally:
            conn.close()

    def start(self) -> BadProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
