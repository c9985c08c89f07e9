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

from inventory.model import EnvValue, Host, Inventory
from .errors import UnknownRun


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
        """Write ``path`` whole: into a temporary file of this writer's own, then renamed."""
        os.makedirs(self.folder, exist_ok=True)
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
        if not isinstance(record, dict) or not isinstance(record.get("run_id"), str) or \
                not isinstance(record.get("hosts"), list):
            raise BadRecord("%s: not a whole run record (no run_id or hosts); remove it (the "
                            "run on the hosts is not affected)" % path)
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
