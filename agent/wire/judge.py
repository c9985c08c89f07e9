"""The judge's wire: newline-delimited JSON over TCP between the run's judge (agent/judge/judge.py)
and each node's supervisor (agent/supervisor/judge_link.py), and the handshake that proves a peer holds
the run's judge token.

The judge listens on the rendezvous address, on the cluster's network, so a connection must
prove itself: the judge sends a random nonce, the peer answers with HMAC-SHA256(token, nonce
+ node name); the token itself never crosses the network. The token is made by the console
at launch, sent to each host inside the SSH channel (as the run's secrets are) and kept in the
run folder (0600, in a 0700 folder) so that a supervisor started again later finds it.
:class:`NodeLine` is the judge's side of one node's connection: requests out, each answer
matched to its request by id.

Standard library only; runs on Python >= 3.9.
"""

import hashlib
import hmac
import json
import os
import socket
import threading

MAX_LINE = 8 << 20  # a why report of 1,024 ranks with their stacks fits
TOKEN_FILE = "judge.token"
HELLO_TIMEOUT = 10.0

_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


class WireError(Exception):
    """The peer broke the protocol, failed the handshake or went away."""


def mac(token, nonce, node):
    return hmac.new(token.encode(), (nonce + "\n" + node).encode(), hashlib.sha256).hexdigest()


def new_nonce():
    return os.urandom(16).hex()


class Line:
    """One connection, read and written a JSON object a line. ``send`` may be called from
    any thread, ``read`` from one; ``close`` from any, also while another thread waits in
    ``read`` (it then sees the end of the stream: a socket is shut down, not a buffered file
    closed under its reader, which would block the closer)."""

    def __init__(self, sock):
        self.sock = sock
        self._buf = bytearray()
        self._wlock = threading.Lock()

    def send(self, obj):
        data = (_encode(obj) + "\n").encode("ascii")
        with self._wlock:
            try:
                self.sock.sendall(data)
            except OSError as exc:
                raise WireError("send failed: %s" % exc)

    def read(self):
        """The next object, or None at the end of the stream; WireError if it is not one."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                break
            if len(self._buf) > MAX_LINE:
                raise WireError("a line over %d bytes" % MAX_LINE)
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError as exc:
                raise WireError("read failed: %s" % exc)
            if not chunk:
                if self._buf:
                    raise WireError("the stream ended inside a line")
                return None
            self._buf += chunk
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        try:
            obj = json.loads(line)
        except ValueError:
            raise WireError("a line that is not JSON")
        if not isinstance(obj, dict):
            raise WireError("a line that is not an object")
        return obj

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def accept_peer(sock, token):
    """Server side of the handshake on a new connection: (Line, node name) or WireError."""
    sock.settimeout(HELLO_TIMEOUT)
    line = Line(sock)
    nonce = new_nonce()
    line.send({"t": "nonce", "nonce": nonce})
    hello = line.read()
    if not hello or hello.get("t") != "hello" or not isinstance(hello.get("node"), str) \
            or not isinstance(hello.get("mac"), str):
        raise WireError("no hello")
    if not hmac.compare_digest(hello["mac"], mac(token, nonce, hello["node"])):
        raise WireError("a hello without the run's token")
    sock.settimeout(None)
    line.send({"t": "welcome"})
    return line, hello["node"]


def connect_peer(addr, port, token, node, timeout=HELLO_TIMEOUT):
    """Client side: a Line to the judge at ``addr:port``, the handshake done; OSError or
    WireError otherwise."""
    sock = socket.create_connection((addr, port), timeout=timeout)
    try:
        line = Line(sock)
        first = line.read()
        if not first or first.get("t") != "nonce" or not isinstance(first.get("nonce"), str):
            raise WireError("the judge sent no nonce")
        line.send({"t": "hello", "node": node, "mac": mac(token, first["nonce"], node)})
        if (line.read() or {}).get("t") != "welcome":
            raise WireError("the judge refused this node's hello")
        sock.settimeout(None)
        return line
    except BaseException:
        sock.close()
        raise


def ask(addr, port, token, op, timeout, args=None, hello_timeout=HELLO_TIMEOUT):
    """A console's one request to the judge at ``addr:port`` (``console:OP``): its answer
    (``{"ok", "data"}``, or None when the judge closed the line); OSError or WireError."""
    line = connect_peer(addr, port, token, "console:" + op, timeout=hello_timeout)
    try:
        line.sock.settimeout(timeout)
        line.send({"t": "req", "id": 1, "op": op, "args": args or {}})
        return line.read()
    finally:
        line.close()


def read_token(run_root):
    """The run's judge token kept on this host, or None."""
    try:
        with open(os.path.join(run_root, TOKEN_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def keep_token(run_root, token):
    """Keep the token in the run folder, owner-only (a supervisor started later reads it)."""
    os.makedirs(run_root, 0o700, exist_ok=True)
    path = os.path.join(run_root, TOKEN_FILE)
    # a name of this process's own: the nodes of one host share the run folder and start at once
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(tmp, path)


class NodeLine:
    """A node's connection, on the judge: requests out, answers in."""

    def __init__(self, node, line):
        self.node = node
        self.line = line
        self.ids = iter(range(1, 1 << 62))
        self.pending = {}
        self.lock = threading.Lock()

    def request(self, op, args, timeout):
        """The node's answer ``data``; raises WireError (with the reason)."""
        done = threading.Event()
        slot = {}
        with self.lock:
            req_id = next(self.ids)
            self.pending[req_id] = (done, slot)
        try:
            self.line.send({"t": "req", "id": req_id, "op": op, "args": args})
            if not done.wait(timeout):
                raise WireError("%s: %s got no answer within %.0f s"
                                           % (self.node, op, timeout))
        finally:
            with self.lock:
                self.pending.pop(req_id, None)
        if "error" in slot:
            raise WireError("%s: %s" % (self.node, slot["error"]))
        return slot.get("data") or {}

    def answered(self, msg):
        with self.lock:
            waiter = self.pending.get(msg.get("id"))
        if waiter is not None:
            done, slot = waiter
            if msg.get("ok"):
                slot["data"] = msg.get("data") if isinstance(msg.get("data"), dict) else {}
            else:
                slot["error"] = str(msg.get("error"))[:500]
            done.set()

    def fail_all(self, why):
        with self.lock:
            for done, slot in self.pending.values():
                slot["error"] = why
                done.set()
