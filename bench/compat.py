"""The torch version matrix: one venv per torch version, the tests that touch torch in each.

For every version asked (default 2.4, 2.8, 2.11, 2.13, 2.15) this makes (or reuses) a venv
``VENVS/torch-<version>`` with ``torch==<version>.*`` and what the tests' host scripts import besides (``HOST_PACKAGES``), prints what that torch
has of the APIs rankdeck uses where they differ (flight-recorder dump, the store's listen-fd
handover, DDP's buffer-sync keyword), then runs the reference trainer's tests and the spine
subset that touches torch with ``RANKDECK_TEST_HOST_PYTHON`` set to the venv's python
(tests/spine/helpers.py): the agent, torchrun, the store and the trainer run under that venv,
pytest and the console stay on the interpreter that runs this script. It prints a table
version x test group (passed/collected, the failed tests named below it with the first line
of their failure; "n/a: why" for a group this torch cannot run, e.g. the straggler flag without
a flight recorder).

    .venv/bin/python bench/compat.py [--versions 2.4,2.15] [--venvs /work/compat-venvs]
    .venv/bin/python bench/compat.py --probe-only

Only torch 2.13 has a CPU-only wheel on this project's registry; the other versions are the
CUDA builds (several GB each with their nvidia-* packages, about 5 min each to install here).
They run on CPU (gloo). Never part of CI; results go in docs/COMPAT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = ("2.4", "2.8", "2.11", "2.13", "2.15")
BASE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
# What the hosts' side of the tests needs besides torch: numpy (torch warns without it), py-spy
# (the agent's stack dumps), safetensors (tests/spine/test_checkpoint_run.py's saver script; a
# venv without it fails that test with the rank's ModuleNotFoundError, not rankdeck's fault).
HOST_PACKAGES = ("numpy", "py-spy", "safetensors")
# A venv is complete when these import and py-spy is on its bin/.
HOST_IMPORTS = "import torch, numpy, safetensors"
# (row label, pytest node ids): the trainer and every spine test whose hosts run torch. A label
# has no comma (--groups is a comma-separated list of them).
GROUPS = (
    ("trainer", ["tests/trainer/test_trainer.py"]),
    ("hang", ["tests/spine/test_hang.py"]),
    ("who-is-stuck", ["tests/spine/test_stuck.py"]),
    ("straggler", ["tests/spine/test_straggler.py"]),
    ("silent ranks", ["tests/spine/test_silent_ranks.py"]),
    ("checkpoint/resume", ["tests/spine/test_checkpoint_run.py",
                           "tests/spine/test_local_run.py::"
                           "test_restart_a_node_resumes_from_checkpoint_then_stop_leaves_nothing"]),
    ("store on rdzv addr", ["tests/agent/test_host_hardening.py::"
                            "test_store_listens_on_the_rendezvous_address_only"]),
    ("stuck without recorder", ["tests/spine/test_stuck_without_recorder.py"]),
)
# Groups that read the flight recorder's collective entry times and nothing else: on a torch
# without one (the probe's fr_dump empty) they are not run; the cell names why.
NEEDS_RECORDER = {"straggler": "n/a: no flight recorder (the flag reads collective entry times)"}
# ... and the one that runs only on a torch without it (it skips where there is one).
WITHOUT_RECORDER = {"stuck without recorder": "n/a: this torch has a flight recorder"}
# What each torch has of the APIs rankdeck uses where versions differ; printed per version.
PROBE = r"""
import inspect, json, socket, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
c10d = torch._C._distributed_c10d
out = {"torch": torch.__version__,
       "fr_dump": [n for n in ("_dump_fr_trace", "_dump_fr_trace_json") if hasattr(c10d, n)],
       "ddp_keyword": [k for k in ("forward_sync_buffers", "broadcast_buffers")
                       if k in inspect.signature(DDP.__init__).parameters][0]}
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(8)
try:
    dist.TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True, wait_for_workers=False,
                  master_listen_fd=sock.detach())
    out["listen_fd"] = "yes"
except Exception as exc:
    out["listen_fd"] = "no: %s" % str(exc).splitlines()[0][:80]
print(json.dumps(out))
"""


def venv_python(venvs: str, version: str) -> str:
    return os.path.join(venvs, "torch-" + version, "bin", "python")


def make_venv(venvs: str, version: str) -> str:
    """The venv's python, made and installed first if missing (pip's output to a log)."""
    python = venv_python(venvs, version)
    home = os.path.dirname(os.path.dirname(python))
    if os.path.exists(python) and subprocess.run(
            [python, "-c", HOST_IMPORTS], capture_output=True).returncode == 0 \
            and os.path.exists(os.path.join(home, "bin", "py-spy")):
        return python
    if not os.path.exists(python):
        subprocess.run([BASE_PYTHON, "-m", "venv", home], check=True)
    log = home + ".install.log"
    # A venv made before a package joined HOST_PACKAGES: pip installs only what is missing.
    print("installing torch %s and %s into %s (log: %s)"
          % (version, ", ".join(HOST_PACKAGES), home, log), flush=True)
    started = time.monotonic()
    # A site-wide pip constraints file may cap torch below the version asked (this machine's
    # caps it at 2.14.1): the pin here is the one that counts.
    env = dict(os.environ, PIP_CONSTRAINT=os.devnull)
    with open(log, "ab") as out:
        rc = subprocess.run([python, "-m", "pip", "install", "--no-cache-dir",
                             "torch==%s.*" % version, *HOST_PACKAGES],
                            stdout=out, stderr=out, env=env).returncode
    if rc:
        raise SystemExit("torch %s: pip exited %d; see %s" % (version, rc, log))
    print("  installed in %.0f s" % (time.monotonic() - started), flush=True)
    return python


def probe(python: str) -> dict:
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_group(python: str, tests: list[str], timeout: int) -> tuple[int, int, list[str]]:
    """(passed, collected, names of the tests that did not pass) for one pytest run."""
    with tempfile.TemporaryDirectory(prefix="rankdeck-compat-") as tmp:
        report = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, RANKDECK_TEST_HOST_PYTHON=python, PYTHONPATH=REPO)
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--timeout", str(timeout), "--junitxml", report, *tests],
                       cwd=REPO, env=env)
        try:
            cases = ET.parse(report).getroot().iter("testcase")
        except (OSError, ET.ParseError):
            return 0, 0, ["no report: pytest did not finish"]
        passed, failed, total = 0, [], 0
        for case in cases:
            total += 1
            bad = [c for c in case if c.tag in ("failure", "error", "skipped")]
            if bad:
                why = (bad[0].get("message") or "").strip().splitlines()
                failed.append("%s (%s: %s)" % (case.get("name"), bad[0].tag,
                                               why[0][:200] if why else "?"))
            else:
                passed += 1
        return passed, total, failed


def table(versions, probes, results) -> str:
    """Markdown: one row per test group, one column per torch version, then the probes."""
    cols = ["torch " + probes[v].get("torch", v) for v in versions]
    lines = ["| test | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for label, _tests in GROUPS:
        cells = []
        for v in versions:
            got = results.get((v, label))
            cells.append("not run" if got is None else got if isinstance(got, str)
                         else "%d/%d" % (got[0], got[1]))
        lines.append("| %s | %s |" % (label, " | ".join(cells)))
    for key, label in (("fr_dump", "flight-recorder dump"), ("listen_fd", "store listen-fd"),
                       ("ddp_keyword", "DDP no-buffer-sync")):
        cells = []
        for v in versions:
            val = probes[v].get(key, probes[v].get("error", "?"))
            cells.append((", ".join(val) or "none") if isinstance(val, list) else str(val))
        lines.append("| *%s* | %s |" % (label, " | ".join(cells)))
    failures = ["- torch %s, %s: %s" % (v, label, "; ".join(got[2]))
                for (v, label), got in results.items() if not isinstance(got, str) and got[2]]
    return "\n".join(lines + ([""] + failures if failures else []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", default=",".join(VERSIONS))
    ap.add_argument("--venvs", default="/work/compat-venvs",
                    help="folder of the venvs, one per version (outside the repository)")
    ap.add_argument("--groups", default="",
                    help="comma-separated row labels, run in that order (default: all)")
    ap.add_argument("--timeout", type=int, default=300, help="per-test timeout, seconds")
    ap.add_argument("--probe-only", action="store_true", help="print the API probes only")
    args = ap.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    wanted = [g.strip() for g in args.groups.split(",") if g.strip()]
    labels = [label for label, _tests in GROUPS]
    unknown = [g for g in wanted if g not in labels]
    if unknown:
        ap.error("no such group: %s (the groups: %s)" % (", ".join(unknown), ", ".join(labels)))
    # in the order asked: the one that matters most first on a slow, shared machine
    groups = [g for name in wanted for g in GROUPS if g[0] == name] if wanted else list(GROUPS)
    probes, results = {}, {}
    for version in versions:
        python = make_venv(args.venvs, version)
        probes[version] = probe(python)
        print("torch %s: %s" % (version, probes[version]), flush=True)
        if args.probe_only:
            continue
        for label, tests in groups:
            has_recorder = bool(probes[version].get("fr_dump"))
            skip = (NEEDS_RECORDER if not has_recorder else WITHOUT_RECORDER).get(label)
            if skip:
                results[(version, label)] = skip
                print("torch %s, %s: %s" % (version, label, skip), flush=True)
                continue
            started = time.monotonic()
            results[(version, label)] = run_group(python, tests, args.timeout)
            print("torch %s, %s: %d/%d in %.0f s" % (version, label, results[(version, label)][0],
                                                     results[(version, label)][1],
                                                     time.monotonic() - started), flush=True)
    print()
    print(table(versions, probes, results))
    return 0 if all(isinstance(got, str) or not got[2] for got in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
