"""The judge's wire fuzzed (issue 40, "Done when"): random, truncated, oversized and non-ASCII
hellos, and random, truncated, oversized, non-ASCII and mis-MAC'd messages after a real
handshake, from several connections at once, against a real judge process (agent/judge/judge.py,
started as a run's is) for a fixed time. The judge must say nothing of it in a traceback (its
stderr is its judge.log), keep its threads and memory bounded while it lasts, and still answer
and take a node after it.

The time is fixed and nothing is timed: a slower host sends fewer cases, never a failure. The
cases come from a seeded generator, and a failure names the seed."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time

from agent.judge import listen
from agent.judge.control import ask_judge, running_judge, start_judge, stop_judge
from agent.wire import judge as judge_wire
from tests.waits import wait_for_sync

TOKEN = "t0ken-" + "z" * 20
NODES = ["node0", "node1"]
FUZZ_S = 4.0
CLIENTS = 12
JUDGE_OWN_THREADS = 16  # its main loop, accept loop, a verdict and its asks, notifications
MAX_RSS = 256 << 20


def status(pid):
    """(threads, VmRSS bytes, VmHWM bytes) of a process, from /proc."""
    fields = {}
    with open("/proc/%d/status" % pid) as f:
        for row in f:
            key, _, value = row.partition(":")
            fields[key] = value.split()
    return int(fields["Threads"][0]), int(fields["VmRSS"][0]) << 10, \
        int(fields["VmHWM"][0]) << 10


# -- what the fuzz sends ---------------------------------------------------------------------
def junk_text(rng, n):
    """Text of ``n`` characters: ASCII, accents, CJK, emoji, lone surrogates, controls."""
    pools = ("abc{}[]\":,\\ 0123456789", "\u00e9\u00fc\u00df", "\u4e2d\u6587", "\U0001f525",
             "\ud800\udfff", "\x00\x1f\x7f\n")
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def junk_value(rng, depth=0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1 << 70, -(1 << 70), 2 ** 63, 10 ** 400, rng.randrange(-9, 9)])
    if kind == 3:
        return rng.choice([0.5, -1e308, 1e308, float("nan"), float("inf"), -0.0])
    if kind in (4, 5):
        return junk_text(rng, rng.randrange(0, 40))
    if kind in (6, 7):
        return [junk_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {junk_text(rng, rng.randrange(0, 6)): junk_value(rng, depth + 1)
            for _ in range(rng.randrange(0, 5))}


def junk_message(rng):
    """A message of a kind the judge knows (or not), its fields of any shape."""
    kind = rng.choice(["recs", "state", "res", "req", "hello", "nonce", None,
                       junk_text(rng, 5)])
    msg = {"t": kind}
    if kind == "recs":
        msg["recs"] = rng.choice([junk_value(rng), [
            {"k": rng.choice(["file", "metric", "event", "sample", junk_text(rng, 3)]),
             "f": junk_value(rng), "rank": junk_value(rng), "step": junk_value(rng),
             "what": junk_value(rng), "launch": junk_value(rng), "loss": junk_value(rng),
             "world_size": junk_value(rng), "ranks": junk_value(rng)}
            for _ in range(rng.randrange(0, 6))]])
    elif kind == "state":
        msg["state"] = rng.choice([junk_value(rng), {
            k: junk_value(rng) for k in ("state", "phase", "cause", "exit_code", "launches",
                                         "restarts", "sent", "left", "gpu")}])
    else:
        msg.update({"id": junk_value(rng), "ok": junk_value(rng), "data": junk_value(rng),
                    "op": junk_value(rng), "args": junk_value(rng)})
    for _ in range(rng.randrange(0, 3)):
        msg[junk_text(rng, 4)] = junk_value(rng)
    return msg


def raw_bytes(rng):
    """Bytes that are not what a line should be: random, invalid UTF-8, deep, huge, cut."""
    return rng.choice([
        lambda: os.urandom(rng.randrange(0, 8192)),
        lambda: b"\xff\xfe\xc3(" * rng.randrange(1, 500) + b"\n",
        lambda: b"[" * rng.randrange(500, 4000) + b"\n",
        lambda: b"{" * rng.randrange(500, 100000) + b"\n",
        lambda: b'{"t":"hello","mac":"' + b"a" * rng.randrange(0, 70000) + b'"}\n',
        lambda: b"x" * rng.randrange(4096, 1 << 20),  # oversized, no newline
        lambda: json.dumps(junk_message(rng)).encode()[:rng.randrange(0, 200)],  # cut
        lambda: (json.dumps(junk_message(rng), ensure_ascii=False) + "\n").encode(
            "utf-8", "surrogatepass"),
        lambda: b"1e99999\n" + b'"\\ud800"\n' + b"null\n" + b"\n\n\n",
    ])()


def hello(rng, judge_nonce):
    """A hello, right or wrong in each field; ``None`` where the fuzz says nothing at all."""
    node = rng.choice(NODES + ["console:ping", "console:why", "", junk_text(rng, 10),
                               "n" * 300, None, 5])
    peer_nonce = rng.choice([judge_wire.new_nonce(), judge_nonce, "", junk_text(rng, 64),
                             "A" * 64, None])
    mac = rng.choice(["\u00e9" * 64, "\ud800" * 64, "0" * 64, "g" * 64, "", None, 64,
                      junk_text(rng, 64),
                      judge_wire.hello_mac("wrong-token", judge_nonce, judge_nonce, "node0")])
    msg = {"t": rng.choice(["hello", "hello", "nonce", junk_text(rng, 3)]), "v": 2,
           "node": node, "nonce": peer_nonce, "mac": mac}
    if rng.random() < 0.3:
        del msg[rng.choice(list(msg))]
    return (json.dumps(msg, ensure_ascii=rng.random() < 0.5) + "\n").encode(
        "utf-8", "surrogatepass")


def send_quietly(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass


def one_case(rng, port):
    """One connection: a case picked by ``rng``."""
    case = rng.randrange(7)
    if case == 6:  # many at once, none saying a word: more than the judge serves
        flood = []
        for _ in range(rng.randrange(10, 60)):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        time.sleep(0.5)
        for sock in flood:
            sock.close()
        return
    if case >= 4:  # the handshake with the token, then what a peer with the token may send
        try:
            line = judge_wire.connect_peer("127.0.0.1", port, TOKEN,
                                           rng.choice(NODES + ["console:ping"]), timeout=5)
        except (OSError, judge_wire.WireError):
            return  # bounded out at the moment: a node would try again
        try:
            line.sock.settimeout(0.5)
            for _ in range(rng.randrange(1, 20)):
                if rng.random() < 0.7:
                    line.send(junk_message(rng))
                else:  # unsealed, mis-MAC'd, cut or raw: the judge closes the line
                    send_quietly(line.sock, rng.choice([
                        b"0" * 64 + b" " + json.dumps(junk_message(rng)).encode() + b"\n",
                        raw_bytes(rng)]))
        except judge_wire.WireError:
            pass
        finally:
            line.close()
        return
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return
    try:
        sock.settimeout(0.5)
        first = b""
        if rng.random() < 0.8:  # read the nonce first (or not)
            try:
                first = sock.recv(4096)
            except OSError:
                pass
        try:
            nonce = json.loads(first.split(b"\n")[0]).get("nonce") or ""
        except ValueError:
            nonce = ""
        if case == 0:
            send_quietly(sock, hello(rng, nonce))
        elif case == 1:
            data = hello(rng, nonce)
            send_quietly(sock, data[:rng.randrange(0, len(data))])  # truncated
        elif case == 2:
            send_quietly(sock, raw_bytes(rng))
        elif case == 3 and rng.random() < 0.3:  # a slow one: holds its hello slot a while
            for _ in range(rng.randrange(1, 10)):
                send_quietly(sock, b" ")
                time.sleep(0.1)
        try:
            sock.recv(4096)
        except OSError:
            pass
    finally:
        sock.close()


def test_the_judges_wire_fuzzed_for_a_while_leaves_no_traceback_and_bounded_threads(tmp_path):
    seed = random.randrange(1 << 30)
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN, "nodes": NODES,
                                  "stall_after": 60.0})
    pid, port = info["pid"], info["port"]
    bound = listen.MAX_HELLOS + listen.MAX_PEERS + 2 * len(NODES) + JUDGE_OWN_THREADS
    seen = {"threads": 0, "rss": 0, "cases": 0}
    end = time.monotonic() + FUZZ_S
    try:
        def client(i):
            rng = random.Random(seed + i)
            while time.monotonic() < end:
                one_case(rng, port)
                seen["cases"] += 1
        clients = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(CLIENTS)]
        for c in clients:
            c.start()
        while any(c.is_alive() for c in clients):
            threads, rss, _hwm = status(pid)
            seen["threads"] = max(seen["threads"], threads)
            seen["rss"] = max(seen["rss"], rss)
            time.sleep(0.05)
        for c in clients:
            c.join()
        _threads, _rss, hwm = status(pid)
        assert seen["cases"] > 0
        assert seen["threads"] <= bound, (seed, seen, bound)
        assert hwm <= MAX_RSS, (seed, seen, hwm)
        # the judge goes on: it answers, and a node with the token gets in
        assert ask_judge(run_root, "ping", timeout=30)["on_hang"] == "warn"
        line = wait_for_sync(lambda: _connect(port), 60, "a node connecting after the fuzz")
        line.close()
        with open(os.path.join(run_root, "judge", "judge.log"), errors="replace") as f:
            log = f.read()
        assert "Traceback" not in log and "Exception in thread" not in log, (seed, log[-4000:])
    finally:
        stop_judge(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def _connect(port):
    try:
        return judge_wire.connect_peer("127.0.0.1", port, TOKEN, "node0", timeout=10)
    except (OSError, judge_wire.WireError):
        return None
