"""Runs known to this laptop, under the XDG state directory, so that `ls`, `status`,
`attach`, `stop` and `restart` work after the console restarted.

One JSON file per run: the hosts and where each node's run folder is, the launch spec without
secret values, and the last status seen. Secrets are never written here.

Several consoles may write one run's record at once (`status` beside the view): each writes
a temporary file of its own and renames it over the record, so a reader sees one whole
version or the other. A record that cannot be read is named with its path: `status`,
`attach` and the other verbs of one run stop there (exit 2), `ls` skips it with a warning.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from agent.wire.protocol import run_id_ok
from inventory.model import EnvValue, Host, Inventory
from ..errors import UnknownRun


class BadRecord(UnknownRun):
    """A run's record exists but cannot be read: not JSON, cut short, or not a run record.

    Usually means the disk filled up while it was written, or the file was edited by hand;
    the message names the file, which can be removed (the run itself is on its hosts).
    """


def state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return os.path.join(base, "rankdeck", "runs")


class History:
    def __init__(self, folder: str | None = None):
        self.folder = folder or state_dir()

    def path(self, run_id: str) -> str:
        return os.path.join(self.folder, run_id + ".json")

    def save(self, record: dict) -> None:
        record = dict(record, updated=time.time())
        # one json.dumps, no indent: json.dump and indent both take the pure-Python encoder
        # (15-18 ms on the event loop every 5 s at 512 ranks, bench/tui.py; now ~2 ms)
        text = json.dumps(record, sort_keys=True, separators=(",", ":"))
        self._write(self.path(record["run_id"]), lambda f: f.write(text))

    def _write(self, path: str, dump) -> None:
        """Write ``path`` whole: into a temporary file of this writer's own (0600), then renamed.
        The folder is the user's alone (0700), one an older rankdeck made 0755 too."""
        os.makedirs(self.folder, 0o700, exist_ok=True)
        os.chmod(self.folder, 0o700)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=os.path.basename(path) + ".",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                dump(f)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def load(self, run_id: str) -> dict:
        """The record of ``run_id``; a unique prefix is enough."""
        try:
            names = [n[:-5] for n in os.listdir(self.folder) if n.endswith(".json")]
        except FileNotFoundError:
            names = []
        matches = [n for n in names if n == run_id] or [n for n in names if n.startswith(run_id)]
        if len(matches) != 1:
            hint = "; `rankdeck ls` lists them" if names else "; none recorded in %s" % (
                self.folder)
            what = "is ambiguous (%s)" % ", ".join(sorted(matches)) if matches else "is unknown"
            raise UnknownRun("run %r %s%s" % (run_id, what, hint))
        return self.read(self.path(matches[0]))

    @staticmethod
    def read(path: str) -> dict:
        """The run record in the file ``path``; BadRecord naming the file if it is not one."""
        try:
            with open(path) as f:
                record = json.load(f)
        except ValueError as err:
            raise BadRecord("%s: the run record cannot be read (%s); it was cut short or "
                            "edited: remove it (the run on the hosts is not affected)"
                            % (path, err)) from None
        except OSError as err:
            raise BadRecord("%s: cannot read the run record: %s" % (path, err.strerror or err)
                            ) from None
        wrong = whole_record_problem(record)
        if wrong == NOT_WHOLE:
            raise BadRecord("%s: not a whole run record (%s); remove it (the run on the hosts "
                            "is not affected)" % (path, NOT_WHOLE))
        if wrong:
            raise BadRecord("%s: not a run record this rankdeck reads: %s; remove it (the run "
                            "on the hosts is not affected)" % (path, wrong))
        return record

    def save_offsets(self, run_id: str, offsets: dict[str, int]) -> None:
        """The journal offsets a headless console has printed up to (for `attach`)."""
        self._write(os.path.join(self.folder, run_id + ".offsets"),
                    lambda f: json.dump(offsets, f))

    def load_offsets(self, run_id: str) -> dict[str, int]:
        try:
            with open(os.path.join(self.folder, run_id + ".offsets")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def list(self, warn=None) -> list[dict]:
        """Every readable record, newest first; ``warn(text)`` is told of each one skipped
        (default: a line on stderr)."""
        warn = warn or (lambda text: print("rankdeck: warning: %s" % text, file=sys.stderr))
        out = []
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        for name in sorted(names):
            if name.endswith(".json"):
                try:
                    out.append(self.read(os.path.join(self.folder, name)))
                except BadRecord as err:
                    warn("skipped %s" % err)
        out.sort(key=lambda r: r["created"] if isinstance(r.get("created"), (int, float))
                 else 0, reverse=True)
        return out


_TEXT, _NUM, _WHOLE, _LIST, _DICT, _NONE = str, (int, float), int, list, dict, type(None)
# what each field of a record must be (None: may be absent or null); the spec's keys are
# console/launch/spec.py LaunchSpec's fields (tests/unit/test_history.py holds them equal)
RECORD_FIELDS = {
    "created": (_NUM, _NONE), "updated": (_NUM, _NONE), "state": (_TEXT, _NONE),
    "inventory": (_TEXT, _NONE), "transport": (_TEXT, _NONE), "rdzv_host": (_TEXT, _NONE),
    "rdzv_endpoint": (_TEXT, _NONE), "run_roots": (_DICT, _NONE), "secret_env": (_LIST, _NONE),
    "spec": (_DICT, _NONE), "status": (_DICT, _NONE), "sync": (_DICT, _NONE),
    "judge": (_DICT, _NONE),
    # node surgery (console/surgery/cordon.py): spares and cordoned nodes, node-rank order, who did what
    "roles": (_DICT, _NONE), "order": (_LIST, _NONE), "nnodes": (_TEXT, _NONE),
    "surgeries": (_LIST, _NONE),
}
HOST_FIELDS = {"name": (_TEXT,), "addr": (_TEXT,), "ssh": (_TEXT, _NONE),
               "python": (_TEXT, _NONE), "workdir": (_TEXT, _NONE), "slots": (_WHOLE, _NONE),
               "gpus": (_WHOLE, _NONE), "env": (_DICT, _NONE)}
SPEC_FIELDS = {
    "script": (_TEXT,), "args": (_LIST, _NONE), "nproc_per_node": (_WHOLE, _NONE),
    "max_restarts": (_WHOLE, _NONE), "nnodes": (_TEXT, _NONE), "grace": (_NUM, _NONE),
    "metrics_regex": (_TEXT, _NONE), "env": (_DICT, _NONE), "module": (bool, _NONE),
    "sync": (_TEXT, _NONE), "sync_include": (_LIST, _NONE), "launcher": (_LIST, _NONE),
    "launch_with": (_TEXT, _NONE), "checkpoint_dir": (_TEXT, _NONE),
    "stall_after": (_NUM, _NONE), "on_hang": (_TEXT, _NONE), "on_nan": (_TEXT, _NONE),
    "on_loop": (_TEXT, _NONE), "loop_restarts": (_WHOLE, _NONE),
    "max_wall": (_NUM, _NONE),
    "notify": (_TEXT, _NONE), "notify_on": (_LIST, _NONE),
    "auto_cordon": (bool, _NONE), "cordon_within": (_NUM, _NONE), "flagged": (_LIST, _NONE), "prometheus": (_TEXT, _NONE),
    "signal_before": (_NUM, _NONE), "requeue": (bool, _NONE), "release_job": (bool, _NONE),
}


NOT_WHOLE = "no run_id or hosts"


def whole_record_problem(record) -> str | None:
    """:func:`record_problem` for any JSON value (a file's, a host's answer): ``NOT_WHOLE``
    when it is not an object with a text ``run_id`` and a list of ``hosts``."""
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str) or \
            not isinstance(record.get("hosts"), list):
        return NOT_WHOLE
    return record_problem(record)


def record_problem(record: dict) -> str | None:
    """What is wrong with a run record's shape, in words, or None (the fields the verbs read;
    keys this version does not know are left alone, except in the spec, which is rebuilt)."""
    problem = _fields_problem(record, RECORD_FIELDS, "")
    if problem:
        return problem
    if not run_id_ok(record["run_id"]):
        return "run_id %r is not a run id (letters, digits, '.', '_' and '-')" % (
            record["run_id"][:40],)
    for i, host in enumerate(record["hosts"]):
        if not isinstance(host, dict):
            return "hosts[%d] is not an object" % i
        problem = _fields_problem(host, HOST_FIELDS, "hosts[%d]." % i)
        if problem:
            return problem
    spec = record.get("spec") or {}
    unknown = sorted(k for k in spec if k not in SPEC_FIELDS)
    if unknown:
        return "spec has the unknown key %r (written by another rankdeck?)" % unknown[0][:40]
    problem = _fields_problem(spec, SPEC_FIELDS, "spec.")
    if problem:
        return problem
    for key in ("run_roots", "status"):
        if not all(isinstance(k, str) for k in (record.get(key) or {})):
            return "%s has a key that is not text" % key
    nodes = (record.get("status") or {}).get("nodes")
    if nodes is not None and not (isinstance(nodes, list) and all(
            isinstance(n, dict) and isinstance(n.get("name"), str)
            and isinstance(n.get("ranks", []), list)
            and all(isinstance(r, dict) for r in n.get("ranks", [])) for n in nodes)):
        return "status.nodes is not a list of nodes with a name and ranks"
    return None


def _fields_problem(obj: dict, fields: dict, where: str) -> str | None:
    for key, types in fields.items():
        value = obj.get(key)
        required = _NONE not in types
        if (value is None and not required) or (
                isinstance(value, types) and not (isinstance(value, bool) and bool not in types)):
            continue
        return "%s%s is %s" % (where, key, "missing" if value is None else
                               "%.40r, not %s" % (value, _kind(types)))
    return None


def _kind(types: tuple) -> str:
    first = types[0]
    return {str: "text", int: "a whole number", list: "a list", dict: "an object",
            bool: "true or false"}.get(first, "a number")


def host_record(host: Host) -> dict:
    return {"name": host.name, "ssh": host.ssh, "addr": host.addr, "python": host.python,
            "workdir": host.workdir, "slots": host.slots, "gpus": host.gpus,
            "env": {k: v.shown() for k, v in host.env.items()}}


def inventory_from_record(record: dict) -> Inventory:
    """The run's hosts as an Inventory (secret env values are not kept, shown as ****)."""
    hosts = [Host(name=h["name"], addr=h["addr"], ssh=h.get("ssh"), python=h.get("python", ""),
                  workdir=h.get("workdir", "~"), slots=h.get("slots", 1), gpus=h.get("gpus", 0),
                  env={k: EnvValue(v, v == "****") for k, v in h.get("env", {}).items()})
             for h in record["hosts"]]
    return Inventory(path=record.get("inventory", ""), hosts=hosts,
                     transport=record.get("transport", "ssh"))


def seen_text(record: dict, now: float) -> str:
    """When the state a record keeps was last seen (a console saved it: ``updated``), in
    words: ``seen 5 min ago``; ``never seen`` for a record without the time. ``rankdeck ls``
    shows the record, not the run now: a run may have ended or gone since (`status` asks)."""
    updated = record.get("updated", record.get("created"))
    if not isinstance(updated, (int, float)) or isinstance(updated, bool):
        return "never seen"
    ago = max(0.0, now - updated)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if ago >= size:
            return "seen %d %s ago" % (ago // size, unit)
    return "seen just now"
