"""Issue 29: random and hostile input, a fixed seed and a fixed number of cases (not a timing
loop). What a host sends (agent messages), what the user writes (inventories) and what is
left on disk (history records) each fail with their own clear error or are taken; never
another exception, and the console's memory stays bounded however long the input goes on.

- agent messages: valid shapes with hostile values (huge, negative, NaN and infinite numbers,
  wrong types, deep nesting, long strings, escape bytes), sometimes cut or with bytes changed,
  through ``agent_messages.parse`` and then into RunState as NodeLink feeds it: only
  ProtocolError; ``status`` and its table read what was taken;
- inventories: the examples' YAML, TOML and hostfile text mutated: only InventoryError;
- history records: a valid record's fields replaced with hostile values: only BadRecord.
"""

from __future__ import annotations

import json
import os
import random
import tracemalloc

from agent.wire.protocol import ProtocolError
from console.run import messages as agent_messages
from console.records.history import BadRecord, History
from console.model.state import RunState
from console.model.summary import status_table
from inventory.loader import load_inventory
from inventory.model import InventoryError

SEED = 29
MESSAGES = 1500
INVENTORIES = 600
RECORDS = 600
NODES = [("node0", "10.0.0.1"), ("node1", "10.0.0.2")]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Memory: RunState keeps bounded buffers (events 2,000; lines by a byte budget; ranks, files
# and torchrun starts per node by its slots: console/model/ownership.py), and the largest message
# made here is a few hundred KiB of JSON (decoded: a few MiB at once). 2 nodes of 8 default
# slots keep at most 2 x 32 ranks; what grows with the number of messages is the bug. The
# bound is that state at its caps (measured 6 MiB at the peak) with room for a slower
# collector, below what thousands of ranks claimed one by one keep.
PEAK_MAX = 32 << 20

HOSTILE_TEXT = ["\x1b]52;c;cm0gLXJmIH4=\x07", "\x1b[2J", "\x9b31m", "\x1b]0;t\x1b\\",
                "\u202e", "\x00", "\ud800", "[bold]x[/]", "\r\n", "%s%n", "../../etc/passwd"]


def hostile_number(rng: random.Random):
    return rng.choice([0, -1, 1, 2 ** 20, 2 ** 62, 2 ** 63, -2 ** 63, 10 ** 400, 1e308, -1e308,
                       float("nan"), float("inf"), float("-inf"), 0.5, -0.0, True, 3,
                       rng.randint(-10 ** 6, 10 ** 6), rng.random() * 1e6])


def hostile_text(rng: random.Random) -> str:
    pieces = [rng.choice(HOSTILE_TEXT) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.05:
        pieces.append("x" * rng.choice([4097, 70000]))
    return "".join(pieces) + rng.choice(["", "step5", "/ckpt/a", "stopped"])


def hostile_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if roll < 0.4:
        return hostile_number(rng)
    if roll < 0.7:
        return hostile_text(rng)
    if roll < 0.75 and depth < 3:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if roll < 0.8 and depth < 3:
        return {hostile_text(rng): hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if roll < 0.82:
        return json.loads("[" * 50 + "]" * 50)
    return rng.choice([None, {}, [], "", False])


def perturb(rng: random.Random, obj: dict, rate: float = 0.3) -> dict:
    """``obj`` with some fields given hostile values, some dropped, one extra."""
    out = {}
    for key, value in obj.items():
        roll = rng.random()
        if roll < rate:
            out[key] = hostile_value(rng)
        elif roll < rate + 0.05:
            continue
        else:
            out[key] = value
    if rng.random() < 0.1:
        out[hostile_text(rng)] = hostile_value(rng)
    return out


def record(rng: random.Random) -> list:
    fid = rng.randint(1, 40)
    rank = rng.randint(0, 70) if rng.random() < 0.7 else rng.randint(0, 2 ** 20 - 1)
    kind = rng.choice(["file", "data", "metric", "ckpt", "ckpt_done", "resumed", "ckpt_gone",
                       "event", "sample"])
    meta = {"k": kind, "f": fid, "ts": 1.7e9 + rng.random() * 100, "j": rng.randint(0, 1 << 30)}
    if kind == "file":
        meta.update(rank=rank, local_rank=rank % 8, world_size=rng.choice([8, 64, 2 ** 20]),
                    attempt=rng.randint(0, 50), instance=rng.choice(["a", "b", hostile_text(rng)]),
                    stream=rng.choice(["stdout", "stderr"]), path=hostile_text(rng), pid=1234)
    elif kind == "data":
        meta["o"] = rng.randint(0, 1 << 20)
        return [perturb(rng, meta, 0.1), hostile_text(rng) + "\n" + hostile_text(rng)]
    elif kind == "metric":
        meta.update(step=rng.randint(0, 10 ** 6), loss=hostile_number(rng),
                    lr=hostile_number(rng), step_time=hostile_number(rng))
    elif kind in ("ckpt", "ckpt_done", "resumed", "ckpt_gone"):
        meta.update(step=rng.randint(0, 100), path=hostile_text(rng), bytes=hostile_number(rng),
                    seconds=hostile_number(rng), complete=rng.random() < 0.5,
                    missing=[hostile_text(rng)])
    elif kind == "event":
        what = rng.choice(["launched", "restarting", "worker_failed", "killed", "stopping",
                           "ended", "stalled", "verdict", hostile_text(rng)])
        meta.update(what=what, rank=rank, exit_code=hostile_number(rng),
                    state=rng.choice(["exited", "failed", "stopped", "gone"]),
                    cause={"message": hostile_text(rng), "rank": rank},
                    report={"sigterm": [1], "left": hostile_value(rng)}, text=hostile_text(rng))
    else:
        meta.update(tick=rng.randint(0, 100), period=rng.choice([1.0, 0, -1, float("nan")]),
                    ranks=[{"rank": r, "pid": 100 + r, "cpu_s": hostile_number(rng),
                            "fr": [["0", rng.randint(0, 9), rng.randint(0, 10 ** 9)]]}
                           for r in range(rng.randint(0, 4))])
    return [perturb(rng, meta, 0.15)]


def message(rng: random.Random) -> dict:
    kind = rng.choice(["journal", "journal", "journal", "state", "gpu", "res", "hello"])
    if kind == "journal":
        count = rng.choice([1, 5, 40, 200])
        return perturb(rng, {"t": "journal", "end": rng.randint(0, 1 << 40),
                             "recs": [record(rng) for _ in range(count)]}, 0.05)
    if kind == "state":
        return {"t": "state", "state": perturb(rng, {
            "state": rng.choice(["running", "failed", "lost", "exploded"]),
            "restarts": hostile_number(rng), "max_restarts": 3, "exit_code": hostile_number(rng),
            "cause": {"message": hostile_text(rng)},
            "phase": {"state": hostile_text(rng), "round": hostile_number(rng)}})}
    if kind == "gpu":
        gpu = perturb(rng, {"index": 0, "util": hostile_number(rng), "name": hostile_text(rng),
                            "mem_used": hostile_number(rng), "xid": hostile_number(rng),
                            "throttle": [hostile_text(rng)], "ecc_uncorrected": 1})
        return {"t": "gpu", "snap": {"gpus": [gpu] * rng.randint(0, 8)},
                "host": perturb(rng, {"cpu_pct": hostile_number(rng),
                                      "net_rx_gbps": hostile_number(rng),
                                      "ib": [{"port": hostile_text(rng)}]})}
    return perturb(rng, {"t": kind, "id": hostile_number(rng), "ok": rng.random() < 0.5,
                         "data": hostile_value(rng)})


def line_of(rng: random.Random, msg: dict) -> bytes:
    line = json.dumps(msg).encode()  # NaN and Infinity as Python writes them
    roll = rng.random()
    if roll < 0.05:
        line = line[:rng.randint(0, len(line))]
    elif roll < 0.1 and line:
        at = rng.randrange(len(line))
        line = line[:at] + bytes([rng.randint(0, 255)]) + line[at + 1:]
    return line + b"\n"


def feed(state: RunState, node: str, msg: dict) -> None:
    """What NodeLink._dispatch does with a checked message."""
    kind = msg.get("t")
    if kind == "journal":
        state.apply_records(node, msg.get("recs", []), msg.get("end", 0))
    elif kind == "state":
        state.apply_supervisor_state(node, msg.get("state"))
    elif kind == "gpu":
        state.apply_telemetry(node, msg.get("snap"), msg.get("host"))


def test_hostile_agent_messages_give_protocol_errors_only_in_bounded_memory():
    rng = random.Random(SEED)
    state = RunState("fuzz", NODES)
    refused = taken = 0
    tracemalloc.start()
    try:
        for case in range(MESSAGES):
            line = line_of(rng, message(rng))
            try:
                msg = agent_messages.parse(line)
                feed(state, rng.choice(NODES)[0], msg)
                taken += 1
            except ProtocolError as exc:
                assert str(exc), "a protocol error says why"
                refused += 1
            except Exception as exc:  # the failing case, to replay it by its number
                raise AssertionError("case %d: %r from %r" % (case, exc, line[:300])) from exc
            if case % 250 == 0:
                status_table(state.status())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused > MESSAGES // 10 and taken > MESSAGES // 10, (refused, taken)
    assert len(state.ranks) <= 64 and all(len(ns.files) <= 64 + 8
                                          for ns in state.nodes.values())
    print("peak %.1f MiB, %d taken, %d refused" % (peak / 2 ** 20, taken, refused))
    assert peak < PEAK_MAX, "peak %.1f MiB" % (peak / 2 ** 20)


def mutate_text(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        at = rng.randrange(len(lines) + 1)
        if roll < 0.3 and lines:
            del lines[min(at, len(lines) - 1)]
        elif roll < 0.5 and lines:
            lines.insert(at, rng.choice(lines))
        elif roll < 0.8:
            lines.insert(at, rng.choice([
                "  - {name: x, addr: 10.0.0.9, slots: %s}\n" % rng.choice(["-1", "1e9", "9" * 5000,
                                                                            "nan", "[]"]),
                "slots = %s\n" % rng.choice(["-1", "inf", '"8"', "{}", "9" * 5000]),
                "node9 slots=%s\n" % rng.choice(["0", "-1", "x", "9" * 5000, ""]),
                "%s\n" % hostile_text(rng), "[[hosts]]\n", "hosts:\n", "  - &a [*a]\n",
                "\t- x\n", "[" * 1000 + "\n", "{a: " * 200 + "\n", "env: {A: ${NOPE}}\n"]))
        elif lines:
            line = lines[min(at, len(lines) - 1)]
            cut = rng.randrange(len(line) + 1)
            lines[min(at, len(lines) - 1)] = line[:cut] + hostile_text(rng) + line[cut:]
    return "".join(lines)


def test_mutated_inventories_give_inventory_errors_only(tmp_path):
    rng = random.Random(SEED)
    examples = {ext: open(os.path.join(REPO, "inventory", name)).read() for ext, name in (
        (".yaml", "cluster.example.yaml"), (".toml", "cluster.example.toml"),
        ("", "hostfile.example"))}
    errors = 0
    for case in range(INVENTORIES):
        ext = rng.choice(sorted(examples))
        path = tmp_path / ("inv%d%s" % (case, ext))
        path.write_text(mutate_text(rng, examples[ext]), errors="surrogatepass")
        try:
            load_inventory(path, environ={"HOME": "/home/u"})
        except InventoryError as exc:
            assert str(exc) and "Traceback" not in str(exc)
            errors += 1
        except Exception as exc:
            raise AssertionError("case %d (%s): %r from:\n%s" % (
                case, ext, exc, path.read_text(errors="replace")[:2000])) from exc
        path.unlink()
    assert errors > INVENTORIES // 10, errors


def valid_record() -> dict:
    return {"run_id": "20260101-000000-abcdef012345", "created": 1.7e9, "state": "running",
            "inventory": "/x/hosts.yaml", "rdzv_endpoint": "10.0.0.1:29400",
            "hosts": [{"name": "node0", "addr": "10.0.0.1", "ssh": None, "python": "",
                       "workdir": "~", "slots": 8, "gpus": 8, "env": {}}],
            "spec": {"script": "train.py", "args": ["--steps", "5"], "nproc_per_node": None,
                     "max_restarts": 3, "nnodes": None, "grace": 10.0, "env": {},
                     "stall_after": 60.0, "on_hang": "warn", "on_nan": "warn"},
            "run_roots": {"node0": "~/.rankdeck/runs/x"},
            "status": {"nodes": [{"name": "node0", "ranks": [{"rank": 0}]}]}}


def test_hostile_history_records_give_bad_record_only(tmp_path):
    rng = random.Random(SEED)
    kept = 0
    for case in range(RECORDS):
        rec = perturb(rng, valid_record(), 0.1)
        for key in ("hosts", "spec", "status"):
            if isinstance(rec.get(key), dict):
                rec[key] = perturb(rng, rec[key], 0.2)
            elif isinstance(rec.get(key), list) and rec[key] and isinstance(rec[key][0], dict):
                rec[key] = [perturb(rng, rec[key][0], 0.2)]
        path = tmp_path / ("rec%d.json" % case)
        text = json.dumps(rec)
        if rng.random() < 0.1:
            text = text[:rng.randint(0, len(text))]
        path.write_text(text)
        try:
            History.read(str(path))
            kept += 1
        except BadRecord as exc:
            assert str(path) in str(exc)
        except Exception as exc:
            raise AssertionError("case %d: %r from %s" % (case, exc, text[:2000])) from exc
        path.unlink()
    assert 0 < kept < RECORDS, kept
