"""`launch --dry-run`: each node's command line as its agent would start it, starting nothing.

One block per node, in node-rank order: the command line, a line of ``^`` under each word
that differs from node to node, the environment the launcher adds (and ``--env``), and the
DeepSpeed hostfile. Secrets (the inventory's and ``--env`` values of secret names) are masked
in every line, in each word before it is quoted for the shell (:func:`shown_word`): quoted,
a secret with a quote in it is no longer itself, and masking the quoted line would miss it.
The rendezvous store's port is chosen when a run starts: shown as ``<port>``.
"""

from __future__ import annotations

import secrets
import shlex

from inventory.model import Inventory
from .env import launch_secrets
from ..lines.sanitize import MASK, Masker
from .spec import LaunchSpec, NodeCommand, node_commands, run_root

PORT = "<port>"
RUN_ID = "<run-id>"


def plan(inv: Inventory, spec: LaunchSpec) -> dict[str, NodeCommand]:
    """Every node's command, as a launch would build it (TemplateError as a launch would)."""
    endpoint = "%s:%s" % (inv.hosts[0].addr, PORT)
    return node_commands(list(inv.hosts), spec, RUN_ID, endpoint,
                         lambda h: run_root(h, RUN_ID))


def differing(commands: dict[str, NodeCommand]) -> set[int]:
    """Positions of the argv words that are not the same on every node (every position from
    the first difference on when the commands are not of one length)."""
    argvs = [c.argv for c in commands.values()]
    longest = max(len(a) for a in argvs)
    if len({len(a) for a in argvs}) > 1:
        first = next((i for i in range(longest)
                      if len({a[i] if i < len(a) else None for a in argvs}) > 1), longest)
        return set(range(first, longest))
    return {i for i in range(longest) if len({a[i] for a in argvs}) > 1}


def shown_word(word: str, masker: Masker) -> str:
    """``word`` quoted for the shell with its secrets masked: masked before it is quoted
    (``it's`` quoted is ``'it'"'"'s'``, which no longer holds the secret), ``****`` put in
    after, so that a word that is only a secret shows as ``****``."""
    hole = "rdmask" + secrets.token_hex(8)  # characters quoting leaves as they are
    return shlex.quote(masker.mask(word, hole)).replace(hole, MASK)


def marked_lines(argv: list[str], marks: set[int], shown) -> list[str]:
    """The command line and, under it, ``^`` beneath each marked word (``shown``: a word as
    it is printed, masked: the marks stand under what is shown)."""
    words = [shown(w) for w in argv]
    line = " ".join(words)
    under = " ".join(("^" if i in marks else " ") * len(w) for i, w in enumerate(words))
    return [line, under.rstrip()] if under.strip() else [line]


def render(inv: Inventory, spec: LaunchSpec) -> str:
    """The dry run's text: every node's command, the differences marked, secrets masked."""
    commands = plan(inv, spec)
    masker = Masker(sorted(set(inv.secrets) | set(launch_secrets(inv, spec.env))))
    marks = differing(commands) if len(commands) > 1 else set()
    named = sorted({w for c in commands.values() for i, w in enumerate(c.argv[:-1])
                    if i + 1 in marks and w.startswith("-")})
    launcher = "a raw launcher argv" if spec.launcher else spec.launch_with
    out = ["launch --dry-run: %d node%s, launcher %s; nothing was started" % (
        len(commands), "" if len(commands) == 1 else "s", launcher),
        "the rendezvous store's port is chosen at start (%s); the run id is new then (%s)"
        % (PORT, RUN_ID)]
    if len(commands) > 1:
        out.append("differs per node (^): %s" % (", ".join(named) or "nothing"))
    for rank, (node, cmd) in enumerate(commands.items()):
        out += ["", "%s (node rank %d):" % (node, rank)]
        out += ["  " + masker.mask(line) for line in marked_lines(
            cmd.argv, marks, lambda w: shown_word(w, masker))]
        env = dict(cmd.env, **spec.env)
        if env:
            out.append("  env: " + masker.mask(" ".join(
                "%s=%s" % (k, shown_word(v, masker)) for k, v in sorted(env.items()))))
        if cmd.hostfile is not None:
            out.append("  hostfile (written by the agent beside the run): "
                       + masker.mask(cmd.hostfile.strip().replace("\n", "; ")))
    return "\n".join(out)


def recorded_lines(inv: Inventory, spec: LaunchSpec, masker: Masker, source: str,
                   names: list[str] | None = None) -> list[str]:
    """What a verb that drives a run would start on ``names`` (None: every node), as the
    run's record says, for a record copied from its host ``source`` (`rankdeck watch -i`):
    a host's record is untrusted, so its command is shown, quoted as the dry run quotes it
    and masked by ``masker``, before it runs."""
    hosts = [h for h in inv.hosts if names is None or h.name in names]
    out = ["the record of this run came from its host %s, not from this laptop; what it "
           "starts is what that record says (launcher %s, script %s):" % (
               source, "a raw argv" if spec.launcher else spec.launch_with, spec.script)]
    try:
        commands = plan(inv, spec)
    except Exception:  # noqa: BLE001 (a launcher that cannot express it: the parts shown)
        commands = {h.name: NodeCommand([spec.script] + list(spec.args), {}) for h in hosts}
    for h in hosts:
        cmd = commands.get(h.name)
        if cmd is None:
            continue
        out.append("  %s (%s, python %s, in %s):" % (h.name, h.ssh or h.addr, h.python or
                                                      "python3", h.workdir))
        out += ["    " + line for line in marked_lines(
            cmd.argv, set(), lambda word: shown_word(word, masker))]
        env = dict(cmd.env, **spec.env)
        if env:
            out.append("    env: " + masker.mask(" ".join(
                "%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items()))))
    if spec.notify:
        out.append("  and the judge runs --notify %s" % mask(shlex.quote(spec.notify)))
    return out
