"""The judge's link authenticates both ways (agent/wire/judge.py): a node believes only a judge
that proves the run's token, and every message after the handshake carries a MAC over its
direction's count, so one changed, replayed, reordered or dropped on the path closes the line.
And the judge before a hello checks (agent/judge/listen.py): a bounded number of connections,
a deadline and a size for the whole hello, no traceback for a hello of any shape, an accept
loop that outlives a thread that cannot start.

Real sockets and real judges (a process, or a ``Judge`` in this process where a constant of
the wire is shortened); the one fake is a thread that cannot start (a thread limit cannot be
reached here without starving the machine's other tests)."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from agent.judge.control import ask_judge, running_judge, start_judge, stop_judge
from agent.judge.judge import Judge
from agent.store.tcpstore import listen_socket
from agent.supervisor.judge_link import JudgeLink
from agent.surgery.spare_hold import RunEnd
from agent.wire import judge as judge_wire
from tests.waits import wait_for_sync

TOKEN = "t0ken-" + "y" * 20


# -- a listener without the token ----------------------------------------------------------
class Impostor:
    """Listens where a judge would and speaks its words, without the token: a nonce, then a
    welcome (a MAC it cannot make, so random), then ``then`` as the judge's next lines."""

    def __init__(self, then):
        self.sock = listen_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.then = then
        self.conns = 0
        self.heard = []  # every line the peers sent after their hello
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        line = judge_wire.Line(conn)
        try:
            line.send({"t": "nonce", "nonce": judge_wire.new_nonce(), "v": 2})
            line.read()  # the hello
            line.send({"t": "welcome", "mac": os.urandom(32).hex()})
            for msg in self.then:
                line.send(msg)
            while True:
                got = line.read()
                if got is None:
                    return
                self.heard.append(got)
        except judge_wire.WireError:
            return
        finally:
            line.close()

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def test_a_node_tells_a_listener_without_the_token_nothing_and_obeys_it_in_nothing(tmp_path):
    node_dir = tmp_path / "run" / "node0"
    node_dir.mkdir(parents=True)
    asked = []
    impostor = Impostor([{"t": "req", "id": 1, "op": "why", "args": {}}])
    link = JudgeLink({"addr": "127.0.0.1", "port": impostor.port, "token": TOKEN}, "node0",
                     str(node_dir), lambda: {}, lambda: asked.append("why") or {"ranks": []},
                     lambda _text: None)
    link.start()
    try:
        # tried, refused, tried again (a link that believed the welcome would stay)
        wait_for_sync(lambda: impostor.conns >= 2, 30, "the link trying the listener again")
    finally:
        link.close()
        impostor.close()
    assert asked == [] and impostor.heard == [], (asked, impostor.heard)


def test_a_spare_is_not_told_the_run_is_over_by_a_listener_without_the_token(tmp_path):
    impostor = Impostor([{"t": "res", "id": 1, "ok": True, "data": {"over": True}}])
    try:
        run_end = RunEnd({"addr": "127.0.0.1", "port": impostor.port, "token": TOKEN},
                         str(tmp_path))
        with pytest.raises(judge_wire.WireError, match="did not prove"):
            run_end.ask()
    finally:
        impostor.close()


# -- a man in the middle between a node and the real judge ---------------------------------
HANDSHAKE = {"to_judge": 1, "to_node": 2}  # lines each way before the sealed ones: hello; nonce, welcome


class Proxy:
    """Passes one connection's lines between a peer and the judge at ``port``; after the
    handshake each way's sealed lines go through ``mangle[way](index, line)`` (a list of lines
    to pass on). ``judge_closed`` is set once the judge's side ends."""

    def __init__(self, port, **mangle):
        self.sock = listen_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.judge_port = port
        self.mangle = mangle
        self.judge_closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        down, _ = self.sock.accept()
        up = socket.create_connection(("127.0.0.1", self.judge_port))
        threading.Thread(target=self._pump, args=(down, up, "to_judge"), daemon=True).start()
        self._pump(up, down, "to_node")

    def _pump(self, src, dst, way):
        held, n = b"", 0
        try:
            while True:
                chunk = src.recv(1 << 16)
                if not chunk:
                    break
                held += chunk
                while b"\n" in held:
                    line, held = held.split(b"\n", 1)
                    line += b"\n"
                    sealed = n - HANDSHAKE[way]
                    n += 1
                    out = [line] if sealed < 0 or way not in self.mangle \
                        else self.mangle[way](sealed, line)
                    for piece in out:
                        dst.sendall(piece)
        except OSError:
            pass
        finally:
            if way == "to_node":
                self.judge_closed.set()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Reorder:
    def __init__(self):
        self.first = None

    def __call__(self, i, line):
        if i == 0:
            self.first = line
            return []
        return [line, self.first] if i == 1 else [line]


MANGLES = {
    "replayed": lambda i, line: [line, line] if i == 0 else [line],
    "changed": lambda i, line: [line.replace(b'"rank":0', b'"rank":1')],
    "dropped": lambda i, line: [] if i == 0 else [line],
    "reordered": Reorder,
}


@pytest.fixture
def judge(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0"],
                                  "stall_after": 60.0})
    yield run_root, info
    stop_judge(run_root)
    wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


@pytest.mark.parametrize("how", sorted(MANGLES))
def test_a_node_message_changed_or_replayed_on_the_path_closes_the_judges_line(judge, how):
    _run_root, info = judge
    mangle = MANGLES[how]() if how == "reordered" else MANGLES[how]
    proxy = Proxy(info["port"], to_judge=mangle)
    line = judge_wire.connect_peer("127.0.0.1", proxy.port, TOKEN, "node0")
    try:
        line.send({"t": "recs", "recs": [{"k": "file", "f": 1, "rank": 0}]})
        line.send({"t": "recs", "recs": [{"k": "file", "f": 2, "rank": 0}]})
        wait_for_sync(proxy.judge_closed.is_set, 20, "the judge closing a %s message's line"
                      % how)
    finally:
        line.close()


def test_a_judge_request_replayed_on_the_path_is_refused_by_the_node(judge):
    run_root, info = judge
    proxy = Proxy(info["port"], to_node=MANGLES["replayed"])
    line = judge_wire.connect_peer("127.0.0.1", proxy.port, TOKEN, "node0")
    asked, ended = [], []

    def node():
        try:
            while True:
                msg = line.read()
                if msg is None:
                    ended.append("end")
                    return
                asked.append(msg.get("op"))
                line.send({"t": "res", "id": msg["id"], "ok": True, "data": {"ranks": []}})
        except judge_wire.WireError as exc:
            ended.append(str(exc))
    threading.Thread(target=node, daemon=True).start()
    ask_judge(run_root, "why")  # the judge asks node0, through the proxy
    wait_for_sync(lambda: ended, 30, "node0's line ending")
    assert asked == ["why"] and "MAC" in ended[0], (asked, ended)


def test_a_sealed_line_from_another_connection_does_not_check(judge):
    _run_root, info = judge
    first = judge_wire.connect_peer("127.0.0.1", info["port"], TOKEN, "node0")
    second = judge_wire.connect_peer("127.0.0.1", info["port"], TOKEN, "node0")
    try:
        # what the first would send as its first message, sent raw on the second
        sealed = first._mac(first._send_key, 0, b'{"t":"recs","recs":[]}')
        second.sock.sendall(sealed.encode() + b' {"t":"recs","recs":[]}\n')
        second.sock.settimeout(20)
        assert second.read() is None  # the judge closed it
    finally:
        first.close()
        second.close()


def test_a_hello_of_the_old_handshake_is_refused(judge):
    _run_root, info = judge
    sock = socket.create_connection(("127.0.0.1", info["port"]), timeout=20)
    line = judge_wire.Line(sock)
    try:
        nonce = line.read()["nonce"]
        import hashlib
        import hmac
        old = hmac.new(TOKEN.encode(), (nonce + "\nnode0").encode(), hashlib.sha256).hexdigest()
        line.send({"t": "hello", "node": "node0", "mac": old})
        assert line.read() is None
    finally:
        line.close()


# -- the judge before a hello checks -------------------------------------------------------
def hello_of(mac, node="node0"):
    return (json.dumps({"t": "hello", "v": 2, "node": node, "nonce": judge_wire.new_nonce(),
                        "mac": mac}) + "\n").encode()


def test_a_hello_with_a_non_ascii_mac_is_refused_without_a_traceback(judge):
    run_root, info = judge
    for mac in ("\u00e9" * 64, "\ud800" * 64, "A" * 64, 7):
        sock = socket.create_connection(("127.0.0.1", info["port"]), timeout=20)
        line = judge_wire.Line(sock)
        line.read()  # the nonce
        sock.sendall(hello_of(mac))
        assert line.read() is None, mac
        line.close()
    # the judge goes on: a node with the token connects, a console's ping is answered
    judge_wire.connect_peer("127.0.0.1", info["port"], TOKEN, "node0").close()
    assert ask_judge(run_root, "ping")["on_hang"] == "warn"
    with open(os.path.join(run_root, "judge", "judge.log")) as f:
        log = f.read()
    assert "Traceback" not in log, log


@pytest.fixture
def in_process(tmp_path):
    """A Judge of node0 in this process, listening (constants of the wire patched by tests)."""
    judge = Judge({"token": TOKEN, "nodes": ["node0"]}, str(tmp_path))
    sock = listen_socket("127.0.0.1", 0)
    threading.Thread(target=judge.serve, args=(sock,), daemon=True).start()
    yield judge, sock.getsockname()[1]
    judge.stop.set()
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def closed_by_judge(sock, timeout=20.0):
    """True once the judge ends the connection (EOF or a reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(1 << 16):
                return True
    except ConnectionError:
        return True
    except socket.timeout:
        return False


def test_a_hello_dribbled_a_byte_at_a_time_is_cut_at_the_hello_deadline(in_process,
                                                                         monkeypatch):
    monkeypatch.setattr(judge_wire, "HELLO_TIMEOUT", 1.0)
    _judge, port = in_process
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    line = judge_wire.Line(sock)
    line.read()  # the nonce
    sock.settimeout(0.3)  # a read that waits 0.3 s between bytes: the judge's end shows
    cut = False
    for _ in range(100):  # 30 s of bytes, each well within a per-read timeout of 1 s
        try:
            sock.sendall(b"{")
            if sock.recv(1) == b"":
                cut = True
                break
        except socket.timeout:
            continue
        except OSError:
            cut = True
            break
    sock.close()
    assert cut, "the judge still read a hello dribbled for 30 s"


def test_a_hello_far_over_its_size_is_cut_at_once(in_process, monkeypatch):
    monkeypatch.setattr(judge_wire, "HELLO_TIMEOUT", 120.0)
    _judge, port = in_process
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    judge_wire.Line(sock).read()
    try:
        sock.sendall(b"x" * (64 << 10))  # no newline
    except OSError:
        pass
    assert closed_by_judge(sock), "the judge still reads a 64 KiB hello"
    sock.close()


def test_connections_that_never_say_hello_are_bounded_and_a_node_gets_in_after(in_process,
                                                                               monkeypatch):
    monkeypatch.setattr(judge_wire, "HELLO_TIMEOUT", 120.0)
    judge, port = in_process
    before = threading.active_count()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(150)]
    try:
        # every one answered: the nonce (a thread serves it) or an end at once (refused)
        for s in socks:
            s.settimeout(20)
            assert s.recv(1) in (b"", b"{")
        # a thread each for at most MAX_HELLOS (32) of them, however many come
        grown = threading.active_count() - before
        assert grown <= 40, grown
    finally:
        for s in socks:
            s.close()
    # their threads see their ends, and a node with the token gets in
    line = wait_for_sync(lambda: _connect_or_none(port), 30, "node0 connecting after the flood")
    wait_for_sync(lambda: "node0" in judge.lines, 30, "node0's line")
    line.close()


def _connect_or_none(port):
    try:
        return judge_wire.connect_peer("127.0.0.1", port, TOKEN, "node0", timeout=5)
    except (OSError, judge_wire.WireError):
        return None


def test_the_accept_loop_outlives_threads_that_cannot_start(in_process, monkeypatch):
    judge, port = in_process
    real_start = threading.Thread.start
    refused = []

    def start(self):  # the thread limit reached, for the judge's peers only
        target = getattr(self, "_target", None)
        if getattr(target, "__self__", None) is judge and len(refused) < 3:
            refused.append(target)
            raise RuntimeError("can't start new thread")
        return real_start(self)
    monkeypatch.setattr(threading.Thread, "start", start)
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        assert closed_by_judge(sock), "a connection with no thread to serve it left open"
        sock.close()
    assert len(refused) == 3
    line = judge_wire.connect_peer("127.0.0.1", port, TOKEN, "node0", timeout=10)
    wait_for_sync(lambda: "node0" in judge.lines, 30, "node0's line")
    line.close()



def test_a_node_answers_a_bounded_number_of_the_judges_requests_at_once(tmp_path):
    """Even a judge with the token gets a thread for at most MAX_ASKS requests at a time on a
    node: the rest are answered ``busy`` at once."""
    node_dir = tmp_path / "run" / "node0"
    node_dir.mkdir(parents=True)
    server = listen_socket("127.0.0.1", 0)
    release, inside = threading.Event(), []

    def why(signals=True):  # a report that takes until the test lets it go
        inside.append(1)
        release.wait(60)
        return {"ranks": []}
    link = JudgeLink({"addr": "127.0.0.1", "port": server.getsockname()[1], "token": TOKEN},
                     "node0", str(node_dir), lambda: {}, why, lambda _text: None)
    link.start()
    conn, _ = server.accept()
    line, node = judge_wire.accept_peer(conn, TOKEN)
    line.sock.settimeout(30)
    try:
        assert node == "node0"
        for i in range(1, 21):
            line.send({"t": "req", "id": i, "op": "why", "args": {}})
        busy = []
        while len(busy) < 12:
            msg = line.read()
            assert msg is not None
            if msg.get("t") == "res":
                assert not msg["ok"] and "busy" in msg["error"], msg
                busy.append(msg["id"])
        assert len(inside) <= 8, len(inside)
        release.set()
        answered = []
        while len(answered) < 20 - len(busy):
            msg = line.read()
            if msg and msg.get("t") == "res":
                assert msg["ok"], msg
                answered.append(msg["id"])
        assert sorted(busy + answered) == list(range(1, 21))
    finally:
        release.set()
        link.close()
        line.close()
        server.close()
