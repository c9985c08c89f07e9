"""rankdeck's command line: launch, submit, demo, attach, watch, status, export, logs, stop, restart,
cordon, uncordon, stacks, why, actions, goodput, check, hosts, ls. Only the arguments and the exit
code of an error live here; what a verb does is in the modules commands.py (the verb table)
names, the exit codes in errors.py (0 success, 1 the run failed, 2 bad input or usage, 3 could
not reach a host).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import sys

from inventory.checks import MAX_SLOTS
from inventory.model import LAUNCHERS, InventoryError
from ..model.buffers import BUDGET_MB
from .commands import COMMANDS
from ..records.export import FORMATS
from ..errors import EXIT_INTERRUPTED, EXIT_USAGE, LaunchError, UnknownRun, UsageError


def bounded(kind: type, low: float, high: float = math.inf, low_open: bool = False):
    """An argparse type: a ``kind`` number in [low, high] ((low, high] with ``low_open``)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a %s" % (
                text, "whole number" if kind is int else "number")) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError("%s is not a finite number" % text)
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            edge = "above %g" % low if low_open else "at least %g" % low
            raise argparse.ArgumentTypeError("%s must be %s%s" % (
                text, edge, "" if high == math.inf else " and at most %g" % high))
        return value
    return parse


SECONDS = bounded(float, 0, low_open=True)
FDS_WANTED = 16384  # open files the console asks for: a socket per host, with room to spare


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rankdeck", description="Launch and watch multi-node "
                                "torchrun training from a terminal.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def run_opts(sp, tui=True):
        sp.add_argument("--stall-after", type=SECONDS, default=None, metavar="SECONDS",
                        help="a rank is stalled after max(SECONDS, 5 x its median step time) "
                        "without a step (default: the run's own, set at launch; 60)")
        if tui:
            sp.add_argument("--no-tui", action="store_true", help="print `[node r] line` "
                            "streams and a summary instead of the live view")
        sp.add_argument("--accept-new-host-keys", action="store_true",
                        help="record unknown SSH host keys instead of refusing them")
        sp.add_argument("--line-budget", type=bounded(int, 16), default=BUDGET_MB,
                        metavar="MB", help="memory for the log lines kept in this console "
                        "(default %d); ranks not on screen keep few, older lines come back "
                        "from the hosts when you scroll" % BUDGET_MB)

    la = sub.add_parser("launch", help="start a run on every host of an inventory")
    la.add_argument("-i", "--inventory", required=True, help="inventory file (YAML, TOML or "
                    "a DeepSpeed hostfile)")
    la.add_argument("--nproc-per-node", type=bounded(int, 1, MAX_SLOTS),
                    help="processes per node (default: the host's slots)")
    la.add_argument("--nnodes", help="N or MIN:MAX for an elastic run (default: all hosts)")
    la.add_argument("--max-restarts", type=bounded(int, 0), default=3,
                    help="torchrun --max-restarts")
    la.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for every rank (repeatable)")
    la.add_argument("--metrics-regex", help="regex with named groups step, loss, lr, "
                    "step_time, tok_s for your own log format")
    la.add_argument("--checkpoint-dir", metavar="DIR", help="a folder on the hosts (relative "
                    "to the workdir) where the trainer saves; each new entry is shown as a "
                    "checkpoint, for trainers that print nothing when they save")
    la.add_argument("--grace", type=bounded(float, 0), default=10.0,
                    help="seconds between SIGTERM and SIGKILL when stopping")
    la.add_argument("--on-hang", choices=("warn", "restart", "stop"), default="warn",
                    help="what the run's judge on the hosts does when a hang's verdict names "
                    "a rank, console or not: warn (default), restart that node (within "
                    "--max-restarts), or stop the run")
    la.add_argument("--on-nan", choices=("warn", "stop"), default="warn",
                    help="what the run's judge does when a rank's loss turns inf or NaN: warn "
                    "(default: an event, the rank marked) or stop the run; a metric line with a "
                    "step, or two in a row without (docs/METRICS.md)")
    la.add_argument("--on-loop", choices=("warn", "stop", "rollback"), default="stop",
                    help="what the run's judge does when a node restarted --loop-restarts "
                    "times in a row never passes the step it failed at: stop the run "
                    "(default), rollback (every node restarts from the checkpoint before the "
                    "newest, once; docs/JUDGE.md) or warn")
    la.add_argument("--loop-restarts", type=bounded(int, 0), metavar="N", default=3,
                    help="restarts without progress that make a loop (default 3; 0: never)")
    la.add_argument("--max-wall", type=SECONDS, metavar="SECONDS",
                    help="the judge stops the run after this long")
    la.add_argument("--notify", metavar="CMD", help="a shell command the judge runs on its "
                    "host for each event picked by --notify-on, the event as JSON on stdin "
                    "(default: the inventory's notify:; docs/JUDGE.md)")
    la.add_argument("--notify-on", metavar="KINDS", help="comma-separated: stall, verdict, "
                    "failed, succeeded, stopped, restarted, diverged, cordon, loop (default: all)")
    la.add_argument("--prometheus", metavar="[ADDR:]PORT", help="the run's judge serves "
                    "Prometheus metrics at http://ADDR:PORT/metrics while the run lives, "
                    "console or not; ADDR defaults to the rendezvous host's address; no "
                    "authentication (default: the inventory's prometheus:; "
                    "docs/PROMETHEUS.md)")
    la.add_argument("--launcher", choices=LAUNCHERS, default=None,
                    help="what starts each node's ranks (default: the inventory's launcher:, "
                    "else torchrun; docs/LAUNCHERS.md)")
    la.add_argument("--dry-run", action="store_true", help="print each node's command line, "
                    "the differences marked and secrets masked; start nothing")
    la.add_argument("--detach", action="store_true", help="return once every node started")
    la.add_argument("--preflight", choices=("basic", "deep"), default="basic",
                    help="deep: `rankdeck check --deep` first; a suspect node is left out "
                    "and a spare takes its place, or the launch is refused (docs/HEALTH.md)")
    la.add_argument("--skip-preflight", action="store_true",
                    help="start without checking the hosts first (`rankdeck check`)")
    la.add_argument("--spares", metavar="NODES", help="comma-separated hosts of the inventory "
                    "that wait as spares (as `spare: true`): agent, preflight and code, no "
                    "torchrun until `rankdeck cordon` puts one in")
    la.add_argument("--avoid-flagged", action="store_true", help="a flagged host (incidents "
                    "in 2 of its last 5 runs, `rankdeck hosts`) gives its place to a spare of "
                    "the inventory without asking")
    la.add_argument("--auto-cordon", action="store_true",
                    help="the run's judge cordons a node proposed for cordon itself (a node in "
                    "trouble again soon after its restart, a GPU's Xid or ECC error): the spare "
                    "on its host goes in, or the run shrinks (--nnodes MIN:MAX); torchrun "
                    "only (docs/SURGERY.md)")
    la.add_argument("--cordon-within", type=bounded(float, 0), metavar="SECONDS", default=600.0,
                    help="a node in trouble again this soon after its restart is proposed for "
                    "cordon (default 600; 0: no proposals)")
    la.add_argument("--allow-partial", action="store_true",
                    help="start on the reachable hosts even if some are not")
    la.add_argument("--sync", metavar="DIR", help="send DIR's files (what git tracks, or "
                    "what its .gitignore does not exclude) into every host's workdir first; "
                    "only changed files travel (default: the inventory's defaults.sync)")
    la.add_argument("--sync-include", metavar="PATTERN", action="append", default=[],
                    help="also send the secret-looking files (.env, id_*, *.pem) this "
                    ".gitignore-style pattern matches, which --sync leaves out (repeatable)")
    la.add_argument("--slurm", metavar="JOBID", help="run on the nodes of this running Slurm "
                    "job (alone: the job of SLURM_JOB_ID); the inventory names only the login "
                    "host (docs/SLURM.md)")
    la.add_argument("--signal-before", type=SECONDS, metavar="SECONDS", help="on Slurm: this "
                    "long before the job's time limit, ask the ranks to save a checkpoint "
                    "(the file RANKDECK_CHECKPOINT_REQUEST names; docs/SLURM.md)")
    la.add_argument("--requeue", action="store_true", help="on Slurm, a batch job: after that "
                    "checkpoint, requeue the job; the run resumes from it when the job runs "
                    "again (--signal-before defaults to 120)")
    la.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name")
    la.add_argument("script", help="training script, as a path on the hosts (relative to "
                    "each host's workdir)")
    la.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script after --")
    run_opts(la)

    sb = sub.add_parser("submit", help="submit a Slurm job holding the nodes, say why it "
                        "waits while pending, then launch in it (docs/SLURM.md)")
    sb.add_argument("--nodes", type=bounded(int, 1), required=True)
    sb.add_argument("--time", required=True, metavar="TIME", help="the job's time limit, "
                    "as sbatch takes it (00:30:00)")
    sb.add_argument("--partition")
    sb.add_argument("--gpus-per-node", type=bounded(int, 0))
    sb.add_argument("--dry-run", action="store_true", help="print the sbatch script only")
    for action in la._actions:  # noqa: SLF001 (launch's options, the same objects)
        if action.dest not in ("help", "slurm", "dry_run"):
            sb._add_action(action)  # noqa: SLF001

    de = sub.add_parser("demo", help="the reference trainer on 4 local nodes (no SSH)")
    de.add_argument("--steps", type=bounded(int, 1), default=2000)
    de.add_argument("--nodes", type=int, default=4, choices=range(1, 5), metavar="1-4")
    de.add_argument("--nproc-per-node", type=int, default=1)
    de.add_argument("--detach", action="store_true", help="return once every node started")
    de.add_argument("args", nargs=argparse.REMAINDER, help="extra trainer arguments after --")
    run_opts(de)

    for verb, what in (("attach", "open a running (or finished) run again"),
                       ("watch", "attach read-only: see the run, change nothing (attach "
                        "--read-only)")):
        at = sub.add_parser(verb, help=what)
        at.add_argument("run_id")
        at.add_argument("--by-node", action="store_true", help="--no-tui: what was printed "
                        "before, each node's lines together (default: in time order across "
                        "nodes)")
        at.add_argument("-i", "--inventory", help="a run launched from another laptop: "
                        "an inventory of its hosts, whose agents keep the run's record "
                        "(connect as the login that launched it)")
        if verb == "attach":
            at.add_argument("--read-only", action="store_true", help="no key that changes "
                            "the run (kill, restart, stop, cordon, signals, sync); the hosts' "
                            "agents refuse this console every change (docs/SECURITY.md)")
        run_opts(at)

    ac = sub.add_parser("actions", help="who changed the run: every launch, stop, restart, "
                        "sync, cordon and signal, with who asked, which node, when and the "
                        "result")
    ac.add_argument("run_id")
    ac.add_argument("--json", action="store_true", help="a list of objects (docs/PROTOCOL.md, "
                    "\"Action log\")")

    st = sub.add_parser("status", help="per node and per rank: state, step, loss, restarts")
    st.add_argument("run_id")
    st.add_argument("--json", action="store_true", help="machine-readable (docs/STATUS.md)")
    st.add_argument("--stall-after", type=SECONDS, default=None, metavar="SECONDS",
                    help="default: the run's own (set at launch)")

    ex = sub.add_parser("export", help="a run's numbers as files, or into MLflow or W&B: per "
                        "rank step, loss, lr, step time, tok/s; per node its telemetry "
                        "(docs/EXPORTS.md)")
    ex.add_argument("run_id")
    ex.add_argument("--format", choices=FORMATS, default="jsonl")
    ex.add_argument("--out", default=".", metavar="DIR",
                    help="folder for <run>-ranks.<format> and <run>-nodes.<format>, or W&B's "
                    "run folder (made if missing; default: here)")
    ex.add_argument("--follow", action="store_true", help="mlflow, wandb: keep the tracker's "
                    "run up to date while the run lives, and end it as the run ends")
    ex.add_argument("--tracking-uri", default=None, metavar="URI", help="mlflow: http(s)://, "
                    "databricks, sqlite:///FILE or file:DIR (default: MLflow's own, "
                    "MLFLOW_TRACKING_URI)")
    ex.add_argument("--experiment", default="rankdeck", metavar="NAME",
                    help="mlflow: the experiment (made if missing; default: rankdeck)")
    ex.add_argument("--project", default="rankdeck", metavar="P",
                    help="wandb: the project (default: rankdeck; WANDB_ENTITY, WANDB_MODE "
                    "apply)")

    rp = sub.add_parser("report", help="one Markdown page about a run: nodes, loss curve (SVG), "
                        "checkpoints, restarts, stalls and verdicts")
    rp.add_argument("run_id")
    rp.add_argument("--out", default=".", metavar="DIR",
                    help="folder for <run>-report.md and <run>-loss.svg (default: here)")

    gp = sub.add_parser("goodput", help="where the run's time went (start-up, stepping, "
                        "rendezvous, checkpoints, stalls, recovery, steps redone, the end) and "
                        "what each incident cost (docs/GOODPUT.md)")
    gp.add_argument("run_id")
    gp.add_argument("--json", action="store_true", help="wall_s, goodput, buckets, incidents")

    lg = sub.add_parser("logs", help="print a run's lines with `[node r]` prefixes")
    lg.add_argument("run_id")
    who = lg.add_mutually_exclusive_group()
    who.add_argument("--rank", type=int)
    who.add_argument("--node")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("--by-node", action="store_true",
                    help="each node's lines together (default: in time order across nodes)")

    sp = sub.add_parser("stop", help="stop a run, or one node of it")
    sp.add_argument("run_id")
    sp.add_argument("--node")

    rs = sub.add_parser("restart", help="restart a node (it rejoins and resumes from the "
                        "last checkpoint), or the whole run")
    rs.add_argument("run_id")
    rs.add_argument("--node")
    rs.add_argument("--yes", action="store_true", help="a run whose record came from its "
                    "hosts (watch -i): run the command it shows without asking")

    co = sub.add_parser("cordon", help="take a bad node out of a run: a spare takes its place "
                        "(or the run shrinks within --nnodes MIN:MAX) and every rank resumes "
                        "from the last checkpoint; shows what it would do first (docs/SURGERY.md)")
    co.add_argument("run_id")
    co.add_argument("--node", required=True)
    co.add_argument("--replace-with", metavar="SPARE", help="the spare to put in (default: "
                    "the first spare)")
    co.add_argument("--yes", action="store_true", help="do it without asking")

    uc = sub.add_parser("uncordon", help="a cordoned node becomes a spare again")
    uc.add_argument("run_id")
    uc.add_argument("--node", required=True)
    uc.add_argument("--yes", action="store_true", help="a run whose record came from its "
                    "hosts (watch -i): go on without asking")

    sk = sub.add_parser("stacks", help="Python stacks of every rank (or one node's); the "
                        "rank that differs from the majority is marked")
    sk.add_argument("run_id")
    sk.add_argument("--node")
    sk.add_argument("--json", action="store_true")

    wy = sub.add_parser("why", help="who is stuck: the suspect rank(s), their node and line, "
                        "from flight-recorder traces and stacks (docs/STUCK.md)")
    wy.add_argument("run_id")
    wy.add_argument("--json", action="store_true", help="machine-readable (docs/STATUS.md)")

    ck = sub.add_parser("check", help="preflight every host of an inventory")
    ck.add_argument("-i", "--inventory", required=True)
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--deep", action="store_true",
                    help="also measure the network between the nodes, the disk where "
                    "checkpoints go, the clocks and versions, and name the suspect nodes "
                    "(docs/HEALTH.md)")
    ck.add_argument("--checkpoint-dir", metavar="DIR",
                    help="with --deep: where the run's checkpoints go (relative to the "
                    "workdir); the disk's write speed is measured there")
    ck.add_argument("--accept-new-host-keys", action="store_true")

    hs = sub.add_parser("hosts", help="every host of an inventory at once: load, GPU memory, "
                        "strays (training processes of no live run), last runs, incidents, "
                        "flagged (incidents in 2 of its last 5 runs)")
    hs.add_argument("-i", "--inventory", required=True)
    hs.add_argument("--json", action="store_true")
    hs.add_argument("--kill-strays", action="store_true", help="stop the login user's strays "
                    "after a confirmation that lists them; other users' are never touched")
    hs.add_argument("--yes", action="store_true", help="with --kill-strays: do not ask")
    hs.add_argument("--accept-new-host-keys", action="store_true")

    ls = sub.add_parser("ls", help="runs known to this laptop, newest first")
    ls.add_argument("--json", action="store_true")
    return p


def own_option_after_script(parser: argparse.ArgumentParser, argv: list[str],
                            args: argparse.Namespace) -> str | None:
    """A launch option of rankdeck's written after the script without ``--`` before it.

    argparse hands everything after the script to the script, so ``launch train.py --detach``
    would give ``--detach`` to train.py: almost always a mistake, refused with the fix.
    """
    if args.cmd != "launch" or not args.args or argv[-len(args.args) - 1] == "--":
        return None
    tail = args.args
    launch = parser._subparsers._group_actions[0].choices["launch"]  # noqa: SLF001 (argparse)
    ours = {flag for action in launch._actions for flag in action.option_strings}  # noqa: SLF001
    for token in tail[:tail.index("--")] if "--" in tail else tail:
        if token.split("=", 1)[0] in ours:
            return token
    return None


def slurm_alone(argv: list[str]) -> list[str]:
    """``launch --slurm train.py`` (no job id: the allocation's own) as ``--slurm=env``, so
    that argparse does not take the script for the job id."""
    if "--slurm" not in argv or "launch" not in argv:
        return argv
    at = argv.index("--slurm")
    if "--" in argv[:at]:
        return argv
    following = argv[at + 1] if at + 1 < len(argv) else ""
    if following and following[0].isdigit():
        return argv
    return argv[:at] + ["--slurm=env"] + argv[at + 1:]


def raise_fd_limit(want: int = FDS_WANTED) -> int:
    """Raise this process's soft limit on open files towards ``want`` (never above the hard
    limit): one SSH connection per host is one socket, and the soft default (256 on macOS,
    1,024 on most Linux desktops) runs out before 1,024 hosts (docs/SCALE.md). Returns the
    soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a platform that refuses: keep what we have
            pass
    return soft


def main(argv: list[str] | None = None) -> int:
    raise_fd_limit()
    parser = build_parser()
    argv = slurm_alone(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_help()
        return EXIT_USAGE
    misplaced = own_option_after_script(parser, argv, args)
    if misplaced:
        print("rankdeck: %s comes after the script %s, so it would go to the script, not to "
              "rankdeck; put rankdeck's options before the script, or write `%s -- %s` if the "
              "script takes it" % (misplaced, args.script, args.script, misplaced),
              file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(COMMANDS[args.cmd](args))
    except (InventoryError, UsageError, UnknownRun) as exc:
        print("rankdeck: %s" % exc, file=sys.stderr)
        return EXIT_USAGE
    except LaunchError as exc:
        print("rankdeck: %s" % exc, file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED

