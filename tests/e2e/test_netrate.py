"""The agent's network figures against a sender of known rate between two test hosts.

node0 sends TCP payload to node1 at a paced 80 Mbit/s for 6 s; the agent's HostSampler,
run inside each host's network namespace, measures eth0 over 3 s in the middle of it. The
Gbit/s it reports must be within 10 % of the sender's rate, on both ends (headers add about
4 % on top of the payload with 1500-byte frames, so the pass band is wide enough for them and
narrow enough to catch a bytes/bits or 2x slip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RATE_BPS = 10_000_000  # payload bytes a second: 80 Mbit/s
SEND_S = 6.0
WINDOW_S = 3.0
PORT = 5071

RECEIVER = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
conn, _ = srv.accept()
while conn.recv(1 << 16):
    pass
"""

SENDER = """
import socket, sys, time
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk = b"x" * 65536
start, sent = time.monotonic(), 0
while time.monotonic() - start < seconds:
    due = (time.monotonic() - start) * rate  # paced: never ahead of rate x elapsed
    if sent + len(chunk) <= due:
        conn.sendall(chunk)
        sent += len(chunk)
    else:
        time.sleep(0.002)
conn.close()
"""

SAMPLER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from agent.host.stats import HostSampler
sampler = HostSampler()
time.sleep(float(sys.argv[2]))
sampler.sample()
time.sleep(float(sys.argv[3]))
print(json.dumps(sampler.sample()["net"]))
"""


def in_host(hosts, name: str, script: str, *args) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", hosts[name].ns, sys.executable, "-c",
                             script, *map(str, args)], stdout=subprocess.PIPE, text=True)


def eth0(net_json: str) -> dict:
    return next(i for i in json.loads(net_json) if i["iface"] == "eth0")


def test_gbits_match_a_sender_of_known_rate(ssh_hosts):
    receiver = in_host(ssh_hosts, "node1", RECEIVER, ssh_hosts["node1"].addr, PORT)
    procs = [receiver]
    try:
        assert receiver.stdout.readline().strip() == "ready"
        procs.append(in_host(ssh_hosts, "node0", SENDER, ssh_hosts["node1"].addr, PORT,
                             RATE_BPS, SEND_S))
        # both samplers skip the first 1.5 s (connection set-up, the pace settling)
        rx = in_host(ssh_hosts, "node1", SAMPLER, REPO, 1.5, WINDOW_S)
        tx = in_host(ssh_hosts, "node0", SAMPLER, REPO, 1.5, WINDOW_S)
        procs += [rx, tx]
        received = eth0(rx.communicate(timeout=30)[0])
        sent = eth0(tx.communicate(timeout=30)[0])
        assert procs[1].wait(timeout=30) == 0
    finally:
        for proc in procs:  # only what this test started, by its own handle
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    expected = RATE_BPS * 8 / 1e9
    assert 0.9 * expected <= received["rx_gbps"] <= 1.1 * expected, (received, expected)
    assert 0.9 * expected <= sent["tx_gbps"] <= 1.1 * expected, (sent, expected)
    # the other direction carries only ACKs
    assert received["tx_gbps"] < 0.1 * expected and sent["rx_gbps"] < 0.1 * expected
