"""Runs known to this laptop, under the XDG state directory, so that `ls`, `status`,
`attach`, `stop` and `restart` work after the console restarted.

One JSON file per run: the hosts and where each node's run folder is, the launch spec without
secret values, and the last status seen. Secrets are never written here.
"""

from __future__ import annotations

import json
import os
import time

from inventory.model import EnvValue, Host, Inventory


def state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return os.path.join(base, "rankdeck", "runs")


class UnknownRun(Exception):
    """No run with that id (or prefix) is recorded on this laptop."""


class History:
    def __init__(self, folder: str | None = None):
        self.folder = folder or state_dir()

    def path(self, run_id: str) -> str:
        return os.path.join(self.folder, run_id + ".json")

    def save(self, record: dict) -> None:
        os.makedirs(self.folder, exist_ok=True)
        record = dict(record, updated=time.time())
        tmp = self.path(record["run_id"]) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path(record["run_id"]))

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
        with open(self.path(matches[0])) as f:
            return json.load(f)

    def save_offsets(self, run_id: str, offsets: dict[str, int]) -> None:
        """The journal offsets a headless console has printed up to (for `attach`)."""
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, run_id + ".offsets")
        with open(path + ".tmp", "w") as f:
            json.dump(offsets, f)
        os.replace(path + ".tmp", path)

    def load_offsets(self, run_id: str) -> dict[str, int]:
        try:
            with open(os.path.join(self.folder, run_id + ".offsets")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def list(self) -> list[dict]:
        out = []
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        for name in names:
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.folder, name)) as f:
                        out.append(json.load(f))
                except (OSError, ValueError):
                    continue
        out.sort(key=lambda r: r.get("created", 0), reverse=True)
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
