"""`rankdeck hosts -i INVENTORY [--json] [--kill-strays [--yes]]`: every host of an inventory
at once, one line each: reachable, load, GPU memory in use, its strays (training processes of
no live rankdeck run), its last runs, its incidents and whether it is flagged (incidents in 2
of its last 5 runs: agent/rules/fleet.py). ``--kill-strays`` lists the login user's strays,
asks ``y`` (``--yes`` for scripts) and has each host stop them; another user's are shown,
never touched. What is asked of the hosts: console/run/fleet.py.
"""

from __future__ import annotations

import os
import sys

from inventory.loader import load_inventory
from ..errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from ..run import fleet
from ..transport import make_transport
from .output import print_json

lines, stray_words = fleet.lines, fleet.stray_words

def confirmed(prompt: str) -> bool:
    sys.stdout.write(prompt)
    sys.stdout.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


async def cmd_hosts(args) -> int:
    """0 every host answered (and every stray asked to stop is gone), 1 a stray was left,
    3 a host could not be reached."""
    inv = load_inventory(os.path.abspath(args.inventory)).resolve_local(os.getcwd())
    transport = make_transport(inv.transport, args.accept_new_host_keys)
    try:
        return await hosts_table(args, inv, transport)
    finally:
        await transport.close()


async def hosts_table(args, inv, transport) -> int:
    rows = await fleet.ask_hosts(inv, transport)
    unreachable = any(not r["reachable"] for r in rows)
    if not args.kill_strays:
        if args.json:
            print_json(rows)
        else:
            print("\n".join(lines(rows)))
        return EXIT_UNREACHABLE if unreachable else EXIT_OK
    print("\n".join(lines(rows)))
    own = [(r["name"], s) for r in rows for s in r["strays"] if s.get("own")]
    others = [(r["name"], s) for r in rows for s in r["strays"] if not s.get("own")]
    for name, s in others:
        print("left alone (not the login user's): %s %s" % (name, stray_words(s)))
    if not own:
        print("no stray of the login user to stop")
        return EXIT_UNREACHABLE if unreachable else EXIT_OK
    print("to stop (SIGTERM, then SIGKILL):")
    for name, s in own:
        print("  %s %s" % (name, stray_words(s)))
    if not args.yes and not confirmed("stop these %d process(es)? [y/N] " % len(own)):
        print("nothing stopped")
        return EXIT_OK
    done = await fleet.kill_strays(inv, transport, rows)
    left = False
    for name, answer in done.items():
        if answer.get("error"):
            left = True
            print("%s: %s" % (name, answer["error"]))
            continue
        for pid in answer.get("killed") or []:
            print("%s: stopped pid %s" % (name, pid))
        for pid in answer.get("left") or []:
            left = True
            print("%s: pid %s is still there" % (name, pid))
        for ref in answer.get("refused") or []:
            print("%s: pid %s not stopped: %s" % (name, ref.get("pid"), ref.get("why")))
    return EXIT_FAILED if left else (EXIT_UNREACHABLE if unreachable else EXIT_OK)


async def flags_at_launch(inv, args):
    """Before a launch: each flagged host of the run warned with its incidents; where the
    inventory has a spare, it is offered in the flagged host's place (taken without asking
    under ``--avoid-flagged``; asked on a terminal; else said how). The inventory to launch."""
    transport = make_transport(inv.transport, getattr(args, "accept_new_host_keys", False))
    try:
        rows = await fleet.ask_hosts(inv, transport, gpu=False)
    finally:
        await transport.close()
    pairs = fleet.spares_for_flagged(inv, rows)
    flagged = {name for name, _spare in pairs}
    for r in rows:
        if r["name"] in flagged:
            print("rankdeck: warning: %s" % fleet.flagged_words(r), file=sys.stderr)
    take = [(name, spare) for name, spare in pairs if spare]
    if take and not getattr(args, "avoid_flagged", False):
        if sys.stdin.isatty() and sys.stdout.isatty():
            take = [(n, s) for n, s in take
                    if confirmed("put spare %s in flagged %s's place? [y/N] " % (s, n))]
        else:
            for name, spare in take:
                print("rankdeck: `launch --avoid-flagged` puts spare %s in %s's place"
                      % (spare, name), file=sys.stderr)
            take = []
    for name, spare in pairs:
        if spare is None:
            print("rankdeck: no spare to take flagged %s's place: it runs" % name,
                  file=sys.stderr)
    for name, spare in take:
        print("rankdeck: spare %s takes flagged %s's place" % (spare, name), file=sys.stderr)
    # those that stay in the run: the judge proposes them for cordon on a first trouble
    args.flagged_hosts = sorted(flagged - {name for name, _spare in take})
    return fleet.swapped(inv, take) if take else inv
