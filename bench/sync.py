"""Code to the hosts: `--sync` (console/launch/sync.py + agent/sync/place.py) next to `rsync -az`.

A tree of 2,000 files / about 50 MB (40 folders; 1,950 text files of about 8 KB, 50 binary
files of about 0.7 MB), sent to 4 hosts at once, three cases, median of ``--repeat`` runs:

- first: the hosts' workdirs are empty;
- unchanged: nothing changed since the last sync;
- one changed: one text file edited.

rankdeck's time is the manifest (list + sha256 of the tree, once for all hosts) plus
``sync_node`` on every host at once; the manifest is also shown apart. rsync runs once per host,
4 at a time, ``rsync -az --delete SRC/ DEST/``.

Modes:

- ``--mode local`` (default, no root): each "host" is a folder on this machine and its agent
  is agent/sync/place.py in this process, every request and answer encoded and decoded with
  agent/wire/protocol.py and run on a thread (as ``serve`` runs requests). rsync copies locally.
- ``--mode ssh`` (root; real sshd hosts from tests/e2e/sshhosts.py): rankdeck over NodeLink on
  an SshTransport (the connection is opened first and shown apart: a launch has it already);
  rsync with ``-e 'ssh -F <the hosts' ssh_config>'`` to the same hosts. Needs serve to answer
  the ``sync_*`` ops.

    .venv/bin/python bench/sync.py [--mode local|ssh] [--repeat 3] [--hosts 4]

Needs rsync on PATH (``apt-get install -y rsync``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "e2e")]

from agent.wire import protocol  # noqa: E402
from agent.sync import place as agent_sync  # noqa: E402
from console.launch.sync import build_manifest, sync_node  # noqa: E402

WORDS = ("step loss lr rank node tensor grad optimizer batch epoch model data "
         "import torch def return self class for in if else print").split()


def make_tree(root: str, files: int = 2000, big: int = 50, seed: int = 7) -> int:
    """The benchmark tree; returns its size in bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        folder = os.path.join(root, "pkg%02d" % (i % 40))
        os.makedirs(folder, exist_ok=True)
        if i < big:
            data = rng.randbytes(700 * 1024) if hasattr(rng, "randbytes") else os.urandom(700 * 1024)
            name = "weights_%04d.bin" % i
        else:
            line_count = rng.randint(120, 220)
            data = "\n".join(" ".join(rng.choice(WORDS) for _ in range(8))
                             for _ in range(line_count)).encode() + b"\n"
            name = "mod_%04d.py" % i
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def edit_one(root: str, n: int) -> None:
    with open(os.path.join(root, "pkg07", "mod_0087.py"), "ab") as f:
        f.write(b"# edit %d\n" % n)


class InProcessAgent:
    """agent/sync/place.py behind ``call(op, args)``, through the wire encoding, on threads."""

    def __init__(self):
        self.transfers = agent_sync.Transfers()

    async def __call__(self, op, args):
        msg = protocol.decode(protocol.encode({"t": "req", "id": 1, "op": op, "args": args}))
        data = await asyncio.to_thread(agent_sync.request, self.transfers, msg["op"],
                                       msg["args"])
        return protocol.decode(protocol.encode({"t": "res", "id": 1, "ok": True,
                                                "data": data}))["data"]


# -- targets: where the hosts are and how each tool reaches them -----------------------------
class LocalTargets:
    """Folders on this machine; rankdeck through InProcessAgent."""

    def __init__(self, base: str, count: int):
        self.names = ["node%d" % i for i in range(count)]
        self.base = base
        self.agents = {n: InProcessAgent() for n in self.names}

    async def open(self) -> float:
        return 0.0

    def workdir(self, name: str) -> str:
        return os.path.join(self.base, "rankdeck-" + name)

    def call(self, name: str):
        return self.agents[name]

    def rsync_argv(self, name: str, src: str) -> list[str]:
        dest = os.path.join(self.base, "rsync-" + name)
        return ["rsync", "-az", "--delete", src + "/", dest + "/"]

    def clear(self) -> None:
        for n in self.names:
            for d in (self.workdir(n), os.path.join(self.base, "rsync-" + n)):
                shutil.rmtree(d, ignore_errors=True)

    async def close(self) -> None:
        pass


class SshTargets(LocalTargets):
    """Real sshd hosts in network namespaces; rankdeck over NodeLink, rsync over ssh."""

    def __init__(self, base: str, count: int):
        from sshhosts import create_hosts, missing_requirements

        why = missing_requirements()
        if why:
            raise SystemExit("ssh mode: " + why)
        super().__init__(base, count)
        self.env = create_hosts(count)
        self.links = {}
        self.generation = 0

    async def open(self) -> float:
        from console.run.link import NodeLink
        from console.transport.ssh import SshTransport

        inv = self.env.inventory()
        self.transport = SshTransport(ssh_config=self.env.ssh_config,
                                      known_hosts=self.env.known_hosts,
                                      client_keys=[self.env.client_key])
        hosts = getattr(inv, "hosts", inv)
        start = time.perf_counter()
        for h in hosts[:len(self.names)]:
            self.links[h.name] = NodeLink(h, self.transport, None, "", reconnect=False)
        await asyncio.gather(*(link.connect() for link in self.links.values()))
        elapsed = time.perf_counter() - start
        try:
            await self.links[self.names[0]].request("sync_check", workdir="/", tree="")
        except Exception as exc:  # noqa: BLE001 - say why and stop
            raise SystemExit("ssh mode: the agent does not answer sync_check (%s); wire "
                             "agent/sync/place.py into serve first" % exc)
        return elapsed

    def call(self, name: str):
        link = self.links[name]
        return lambda op, args: link.request(op, **args)

    # Paths on the hosts are relative to the login home (private to each host); a "first"
    # round uses fresh folders instead of emptying the old ones.
    def workdir(self, name: str) -> str:
        return "bench-sync-rankdeck-%d" % self.generation

    def rsync_argv(self, name: str, src: str) -> list[str]:
        return ["rsync", "-az", "--delete", "-e", "ssh -F %s" % self.env.ssh_config,
                src + "/", "%s:bench-sync-rsync-%d/" % (name, self.generation)]

    def clear(self) -> None:
        self.generation += 1

    async def close(self) -> None:
        for link in self.links.values():
            await link.close()
        await self.transport.close()
        self.env.close()


# -- one round of each tool ------------------------------------------------------------------
async def rankdeck_round(targets, src: str) -> tuple[float, float, int]:
    """(total seconds, manifest seconds, files sent on the first host)."""
    start = time.perf_counter()
    manifest = await asyncio.to_thread(build_manifest, src)
    hashed = time.perf_counter()
    results = await asyncio.gather(*(sync_node(targets.call(n), manifest, targets.workdir(n))
                                     for n in targets.names))
    return time.perf_counter() - start, hashed - start, results[0].files_sent


def rsync_round(targets, src: str) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen(targets.rsync_argv(n, src), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for n in targets.names]
    for p in procs:
        _out, err = p.communicate()
        if p.returncode:
            raise SystemExit("rsync failed (%d): %s" % (p.returncode, err.decode()[-500:]))
    return time.perf_counter() - start


async def run(mode: str, repeat: int, count: int) -> int:
    if shutil.which("rsync") is None:
        print("rsync not found: apt-get install -y rsync", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="rankdeck-bench-sync-")
    os.environ["XDG_CACHE_HOME"] = os.path.join(base, "cache")  # the laptop's hash cache
    targets = None
    try:
        src = os.path.join(base, "src")
        size = make_tree(src)
        targets = (SshTargets if mode == "ssh" else LocalTargets)(base, count)
        connect = await targets.open()
        rows = {}
        edits = 0
        for case in ("first", "unchanged", "one changed"):
            ours, hashing, theirs, sent = [], [], [], 0
            for _ in range(repeat):
                if case == "first":
                    targets.clear()
                elif case == "one changed":
                    edits += 1
                    edit_one(src, edits)
                total, manifest_s, sent = await rankdeck_round(targets, src)
                ours.append(total)
                hashing.append(manifest_s)
                theirs.append(rsync_round(targets, src))
            rows[case] = (statistics.median(ours), statistics.median(hashing),
                          statistics.median(theirs), sent)
        print("sync bench (%s): %d hosts, 2000 files, %.1f MB, median of %d; rankdeck's "
              "connection opened beforehand in %.2f s" % (mode, count, size / 1e6, repeat,
                                                         connect))
        print("%-12s %12s %12s %10s %8s %10s" % ("case", "rankdeck s", "manifest s", "rsync s",
                                                 "ratio", "files sent"))
        for case, (o, h, t, sent) in rows.items():
            print("%-12s %12.3f %12.3f %10.3f %8.2f %10d" % (case, o, h, t, o / t, sent))
        return 0
    finally:
        if targets is not None:
            await targets.close()
        shutil.rmtree(base, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("local", "ssh"), default="local")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=4)
    args = ap.parse_args(argv)
    return asyncio.run(run(args.mode, args.repeat, args.hosts))


if __name__ == "__main__":
    sys.exit(main())
