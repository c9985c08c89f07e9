"""What each CLI verb does: the table console/verbs/cli.py dispatches on. Every verb is an
``async def cmd_<verb>(args) -> exit code``: those that start a new run (launch, submit, demo,
and check before one) in console/verbs/launch.py, hosts (the inventory's hosts as a fleet)
in console/verbs/hosts.py, those on a run recorded on this laptop
(attach, watch, status, logs, report, goodput, actions, stacks, why, stop, restart,
cordon, uncordon, ls) in console/verbs/recorded.py; export in console/verbs/export.py.

A verb builds a RunController (a new run, or a recorded one from History), uses it inside
``async with`` (which closes every connection, never the run: the one owner of its
lifetime), and shows the run in the TUI (console/tui) or headless (console/verbs/headless.py),
then leaves it (``RunController.leave``; console/verbs/output.py ``follow``).
"""

from __future__ import annotations

from .export import cmd_export
from .hosts import cmd_hosts
from .launch import cmd_check, cmd_demo, cmd_launch, cmd_submit
from .recorded import (
    cmd_actions, cmd_attach, cmd_cordon, cmd_goodput, cmd_logs, cmd_ls, cmd_report, cmd_restart,
    cmd_stacks, cmd_status, cmd_stop, cmd_uncordon, cmd_watch, cmd_why
)

COMMANDS = {
    "launch": cmd_launch, "demo": cmd_demo, "check": cmd_check, "attach": cmd_attach,
    "status": cmd_status, "export": cmd_export, "report": cmd_report, "logs": cmd_logs, "stop": cmd_stop,
    "restart": cmd_restart, "cordon": cmd_cordon, "uncordon": cmd_uncordon,
    "submit": cmd_submit,
    "stacks": cmd_stacks, "why": cmd_why, "ls": cmd_ls,
    "hosts": cmd_hosts, "watch": cmd_watch, "actions": cmd_actions, "goodput": cmd_goodput,
}
