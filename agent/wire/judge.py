"""The judge's wire: newline-delimited JSON over TCP between the run's judge (agent/judge/judge.py)
and each node's supervisor (agent/supervisor/judge_link.py), the handshake by which each side
proves to the other that it holds the run's judge token, and the MAC on every message after it.

The judge listens on the rendezvous address, on the cluster's network, so neither side may
take the other on trust (docs/SECURITY.md, "The run's judge"). The handshake
(:func:`accept_peer`, :func:`connect_peer`):

1. the judge sends a fresh random nonce ``Nj``;
2. the peer sends its own fresh nonce ``Np``, its name and HMAC(token, "hello", Nj, Np, node);
3. the judge checks it and answers HMAC(token, "welcome", Nj, Np, node), which the peer
   checks: a listener without the token cannot make it, whatever it replays.

Both then derive a session key, HMAC(token, "session", Nj, Np, node), and from it one key per
direction. Every later message is a sealed line, ``<mac> <json>``: the MAC (HMAC-SHA256, hex)
covers the direction's count of messages so far and the JSON's bytes, so a message changed,
replayed (on this connection or another) or reordered fails to check, and the line is closed
at once. The token itself never crosses the network. It is made by the console at launch, sent
to each host inside the SSH channel (as the run's secrets are) and kept in the run folder
(0600, in a 0700 folder) so that a supervisor started again later finds it.

Before a hello checks, the judge reads at most :data:`MAX_HELLO` bytes in :data:`HELLO_TIMEOUT`
seconds all told (agent/judge/listen.py bounds how many such connections it serves at once).
:class:`NodeLine` is the judge's side of one node's connection: requests out, each answer
matched to its request by id. Nothing here encrypts: what is said can be read on the path.

Standard library only; runs on Python >= 3.9.
"""

import hashlib
import hmac
import json
import os
import re
import socket
import threading
import time

MAX_LINE = 8 << 20  # a why report of 1,024 ranks with their stacks fits
MAX_HELLO = 4096  # a line before the handshake is done: a nonce, a hello or a welcome
TOKEN_FILE = "judge.token"
HELLO_TIMEOUT = 10.0  # the whole handshake, not each read of it
VERSION = 2  # of the handshake: 1 had no nonce of the peer's, no welcome MAC, no sealed lines
MAX_NODE = 256  # characters of a peer's name

_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")  # a nonce, a MAC (ASCII only: str.isalnum is not)
_MAC_LEN = 64


class WireError(Exception):
    """The peer broke the protocol, failed the handshake or went away."""


def _hmac(key, *parts):
    """HMAC-SHA256 of ``parts`` joined by newlines (strings; a name's lone surrogates kept)."""
    data = "\n".join(parts).encode("utf-8", "surrogatepass")
    return hmac.new(key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass"),
                    data, hashlib.sha256)


def hello_mac(token, judge_nonce, peer_nonce, node):
    """What the peer proves with: HMAC(token, "hello", Nj, Np, node), hex."""
    return _hmac(token, "hello", judge_nonce, peer_nonce, node).hexdigest()


def welcome_mac(token, judge_nonce, peer_nonce, node):
    """What the judge proves with: HMAC(token, "welcome", Nj, Np, node), hex."""
    return _hmac(token, "welcome", judge_nonce, peer_nonce, node).hexdigest()


def session_keys(token, judge_nonce, peer_nonce, node):
    """(to the judge, to the node): the two directions' keys of one connection."""
    session = _hmac(token, "session", judge_nonce, peer_nonce, node).digest()
    return _hmac(session, "node->judge").digest(), _hmac(session, "judge->node").digest()


def new_nonce():
    return os.urandom(32).hex()


def _is_hex64(value):
    return isinstance(value, str) and _HEX64.match(value) is not None


class Line:
    """One connection, read and written a JSON object a line; once sealed (:meth:`seal`), each
    line carries its MAC and a bad one closes it. ``send`` may be called from any thread, ``read``
    from one; ``close`` from any, also while another thread waits in ``read`` (it then sees the
    end of the stream: a socket is shut down, not a buffered file closed under its reader,
    which would block the closer)."""

    def __init__(self, sock):
        self.sock = sock
        self._buf = bytearray()
        self._wlock = threading.Lock()
        self._send_key = self._read_key = None
        self._sent = self._read = 0  # messages so far, each direction: in every MAC

    def seal(self, send_key, read_key):
        """From now on every line is MAC'd with these keys (the handshake's)."""
        with self._wlock:
            self._send_key, self._read_key = send_key, read_key
            self._sent = self._read = 0

    def send(self, obj):
        data = _encode(obj).encode("ascii")
        with self._wlock:
            if self._send_key is not None:
                data = self._mac(self._send_key, self._sent, data).encode("ascii") + b" " + data
                self._sent += 1
            try:
                self.sock.sendall(data + b"\n")
            except OSError as exc:
                raise WireError("send failed: %s" % exc)

    @staticmethod
    def _mac(key, count, data):
        return hmac.new(key, count.to_bytes(8, "big") + data, hashlib.sha256).hexdigest()

    def read(self, limit=MAX_LINE, deadline=None):
        """The next object, or None at the end of the stream; WireError if it is not one, if
        it is longer than ``limit`` bytes, if ``deadline`` (time.monotonic()) passes first, or
        (sealed) if its MAC does not check: then the line is closed too."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                break
            if len(self._buf) > limit:
                raise WireError("a line over %d bytes" % limit)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WireError("no complete line in time")
                try:
                    self.sock.settimeout(left)
                except OSError as exc:
                    raise WireError("read failed: %s" % exc)
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError as exc:
                raise WireError("read failed: %s" % exc)
            if not chunk:
                if self._buf:
                    raise WireError("the stream ended inside a line")
                return None
            self._buf += chunk
        if end > limit:
            raise WireError("a line over %d bytes" % limit)
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        if self._read_key is not None:
            line = self._unseal(line)
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise WireError("a line that is not JSON")
        if not isinstance(obj, dict):
            raise WireError("a line that is not an object")
        return obj

    def _unseal(self, line):
        mac, data = line[:_MAC_LEN], line[_MAC_LEN + 1:]
        good = line[_MAC_LEN:_MAC_LEN + 1] == b" " and hmac.compare_digest(
            mac, self._mac(self._read_key, self._read, data).encode("ascii"))
        if not good:
            self.close()
            raise WireError("a message whose MAC does not check (changed, replayed or out of "
                            "order): the line is closed")
        self._read += 1
        return data

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def accept_peer(sock, token):
    """Server side of the handshake on a new connection: (sealed Line, node name) or
    WireError; at most :data:`MAX_HELLO` bytes a line, :data:`HELLO_TIMEOUT` s in all."""
    deadline = time.monotonic() + HELLO_TIMEOUT
    sock.settimeout(HELLO_TIMEOUT)
    line = Line(sock)
    nonce = new_nonce()
    line.send({"t": "nonce", "nonce": nonce, "v": VERSION})
    hello = line.read(MAX_HELLO, deadline)
    if not hello or hello.get("t") != "hello":
        raise WireError("no hello")
    node, peer_nonce, proof = hello.get("node"), hello.get("nonce"), hello.get("mac")
    if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE or not _is_hex64(proof) \
            or not _is_hex64(peer_nonce):
        raise WireError("a hello of another version or shape (this judge speaks version %d)"
                        % VERSION)
    if peer_nonce == nonce or not hmac.compare_digest(
            proof, hello_mac(token, nonce, peer_nonce, node)):
        raise WireError("a hello without the run's token")
    line.send({"t": "welcome", "mac": welcome_mac(token, nonce, peer_nonce, node)})
    to_judge, to_node = session_keys(token, nonce, peer_nonce, node)
    line.seal(to_node, to_judge)
    sock.settimeout(None)
    return line, node


def connect_peer(addr, port, token, node, timeout=HELLO_TIMEOUT):
    """Client side: a sealed Line to the judge at ``addr:port``, the handshake done (the judge
    proved it holds the token); OSError or WireError otherwise."""
    deadline = time.monotonic() + timeout
    sock = socket.create_connection((addr, port), timeout=timeout)
    try:
        line = Line(sock)
        first = line.read(MAX_HELLO, deadline)
        if not first or first.get("t") != "nonce" or not _is_hex64(first.get("nonce")):
            raise WireError("the judge sent no nonce of this version (%d)" % VERSION)
        nonce = new_nonce()
        line.send({"t": "hello", "v": VERSION, "node": node, "nonce": nonce,
                   "mac": hello_mac(token, first["nonce"], nonce, node)})
        welcome = line.read(MAX_HELLO, deadline) or {}
        if welcome.get("t") != "welcome":
            raise WireError("the judge refused this node's hello")
        proof = welcome.get("mac")
        if first["nonce"] == nonce or not _is_hex64(proof) or not hmac.compare_digest(
                proof, welcome_mac(token, first["nonce"], nonce, node)):
            raise WireError("the listener at %s:%s did not prove it holds the run's judge "
                            "token: not the run's judge" % (addr, port))
        to_judge, to_node = session_keys(token, first["nonce"], nonce, node)
        line.seal(to_judge, to_node)
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
        req_id = msg.get("id")
        if not isinstance(req_id, int):
            return
        with self.lock:
            waiter = self.pending.get(req_id)
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
