"""``launch --prometheus [ADDR:]PORT``: the run's judge serves the run's figures in Prometheus's
text format at ``http://ADDR:PORT/metrics`` for as long as it lives (docs/PROMETHEUS.md).

Standard library only, a thread of the judge (agent/judge/judge.py starts and ends it): one
listening socket on the address the spec names (``spec.prometheus``: ``addr``, ``port``,
``hosts``, node name -> address for the ``host`` label), bounded as the judge's own listener
is: at most :data:`MAX_SCRAPES` connections at once (one beyond is closed unanswered), a
request of at most :data:`MAX_REQUEST` bytes read within :data:`REQUEST_S` seconds, ``GET``
(and ``HEAD``) of ``/metrics`` only, one answer a connection. What it serves is read from the
judge's view and figures under the judge's lock (agent/judge/figures.py) and written by
agent/rules/prom_text.py, every label value masked.

Unauthenticated, as Prometheus's endpoints are: whoever reaches the address reads the run's
names and figures (docs/SECURITY.md, "Prometheus metrics").
"""

import os
import socket
import threading
import time

from ..rules.prom_text import CONTENT_TYPE, encode, render
from .figures import families

MAX_SCRAPES = 4  # connections in hand at once
MAX_REQUEST = 8192  # bytes of request line and headers
REQUEST_S = 5.0  # to send the request, and again to take the answer
ACCEPT_PAUSE = 0.1
PATH = "/metrics"


def listen_spec(spec):
    """``(addr, port, hosts)`` from the judge's spec, or None when it asks for no metrics."""
    prom = spec.get("prometheus")
    if not isinstance(prom, dict):
        return None
    addr, port = prom.get("addr"), prom.get("port")
    if not isinstance(addr, str) or not addr or isinstance(port, bool) or \
            not isinstance(port, int) or not 0 <= port <= 65535:
        return None
    hosts = prom.get("hosts") if isinstance(prom.get("hosts"), dict) else {}
    return addr, port, {k: v for k, v in hosts.items() if isinstance(v, str)}


def url(addr, port):
    return "http://%s:%d%s" % ("[%s]" % addr if ":" in addr else addr, port, PATH)


class MetricsServer:
    """The endpoint: ``render()`` -> the exposition's bytes; :meth:`close` ends it."""

    def __init__(self, sock, render_bytes):
        self.sock = sock
        self.render = render_bytes
        self.stop = threading.Event()
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)
        self.thread = threading.Thread(target=self._accept, name="prometheus", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def close(self):
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _peer = self.sock.accept()
            except OSError:
                if self.stop.is_set():
                    return
                self.stop.wait(ACCEPT_PAUSE)
                continue
            if not self.slots.acquire(blocking=False):
                conn.close()
                continue
            try:
                threading.Thread(target=self._one, args=(conn,), name="prometheus-scrape",
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had: this scrape is refused, not the rest
                self.slots.release()
                conn.close()
                self.stop.wait(ACCEPT_PAUSE)

    def _one(self, conn):
        try:
            self.answer(conn)
            _linger(conn)
        except OSError:
            pass
        finally:
            conn.close()
            self.slots.release()

    def answer(self, conn):
        """One request on ``conn``, answered; a slow or oversized one is cut off."""
        head = _read_head(conn)
        if head is None:
            return _send(conn, 431, b"request too large or too slow\n")
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _send(conn, 400, b"bad request\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _send(conn, 405, b"GET /metrics only\n", [("Allow", "GET, HEAD")])
        if target != PATH.encode():
            return _send(conn, 404, b"the metrics are at /metrics\n")
        try:
            body = self.render()
        except Exception as exc:  # a bug: said to the scraper and the judge's log, no crash
            print("prometheus: the metrics could not be written: %r" % exc, flush=True)
            return _send(conn, 500, b"the metrics could not be written\n")
        _send(conn, 200, body, [("Content-Type", CONTENT_TYPE)], head_only=method == b"HEAD")


def _read_head(conn):
    """The request's line and headers (bytes to the blank line), or None when they pass
    MAX_REQUEST bytes or REQUEST_S seconds."""
    deadline = time.monotonic() + REQUEST_S
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > MAX_REQUEST:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except socket.timeout:
            return None
        if not chunk:
            return None if not data else data
        data += chunk
    return data if len(data) <= MAX_REQUEST else None


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error"}


def _linger(conn):
    """After the answer: no more from this side, and what the client still sends (the rest
    of an oversized request) read and dropped, a little and briefly, so that closing does not
    reset the connection before the client has read the answer."""
    conn.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + 1.0
    for _ in range(16):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        conn.settimeout(left)
        try:
            if not conn.recv(4096):
                return
        except socket.timeout:
            return


def _send(conn, status, body, headers=(), head_only=False):
    lines = ["HTTP/1.1 %d %s" % (status, REASONS[status]), "Content-Length: %d" % len(body),
             "Connection: close"]
    lines += ["%s: %s" % h for h in headers] or ["Content-Type: text/plain; charset=utf-8"]
    conn.settimeout(REQUEST_S)
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head_only else body))


def serve_metrics(judge, run_root):
    """Start the run's endpoint when the judge's spec asks for one: the server, or None.
    ``judge.prometheus`` says where it serves (``url``) or why it could not listen
    (``error``); the judge's ``started`` event and its ``state.json`` carry it (every console
    shows it); the run goes on either way."""
    want = listen_spec(judge.spec)
    if want is None:
        return None
    addr, port, hosts = want
    from ..store.tcpstore import listen_socket  # here: only a run with metrics needs it
    try:
        sock = listen_socket(addr, port)
    except OSError as exc:
        judge.prometheus = {"error": "cannot listen on %s: %s" % (url(addr, port), exc)}
        return None
    run = os.path.basename(os.path.normpath(run_root))

    def render_bytes():
        with judge.lock:  # the run's goodput: the judge's reducer, read at each scrape
            good = judge.goodput.report(judge.over is not None)
            fams = families(run, judge.view, judge.figures, hosts, judge.masker.mask_text,
                            good)
        return encode(render(fams))

    judge.prometheus = {"url": url(addr, sock.getsockname()[1])}
    return MetricsServer(sock, render_bytes).start()


def prometheus_said(info):
    """What the judge's ``started`` event adds to its text about the endpoint."""
    if not info:
        return ""
    if info.get("url"):
        return "; Prometheus metrics at %s (no authentication: docs/SECURITY.md)" % info["url"]
    return "; no Prometheus metrics: %s" % info.get("error")
