"""`c` on a node row: the cordon preview (console/surgery/surgery.py) in a ConfirmScreen, and on
`y` the surgery itself (console/surgery/cordon.py), its outcome as a notification."""

from __future__ import annotations

from ..surgery.cordon import cordon, unreachable
from .confirm import ConfirmScreen


def open_cordon(app, node: str | None) -> None:
    """Preview cordoning ``node`` (the nodes table's row) on ``app``; a refused plan is only
    shown (nothing is done), an accepted one is carried out after `y`."""
    if not node:
        app.notify("no node selected: pick one in the nodes table", severity="warning")
        return
    plan = app.ctl.cordon_plan(node)
    refusal = plan.refusal or unreachable(app.ctl, plan)
    if refusal:
        app.notify(refusal, title="cordon %s: not possible, nothing was done" % node,
                   severity="error", timeout=20)
        return
    screen = ConfirmScreen("Cordon node %s?" % node, "\n".join(plan.lines()[1:]),
                           "Cordon node")

    async def carry_out() -> None:
        app.notify("cordoning %s..." % node, timeout=3)
        try:
            entry = await cordon(app.ctl, plan)
        except Exception as exc:  # an agent's error: tell the user, keep the console up
            app.notify("cordon %s failed: %s" % (node, exc), severity="error", timeout=30)
            return
        done = entry["outcome"] == "done"
        app.notify("%s: %s" % (entry["what"], entry["outcome"]), title="cordon %s" % node,
                   severity="information" if done else "error", timeout=8 if done else 30)

    app.push_screen(screen, lambda yes: app.run_worker(carry_out(), group="control")
                    if yes else None)
