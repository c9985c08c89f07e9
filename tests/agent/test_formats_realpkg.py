"""A real Hugging Face Trainer and a real Lightning fit, on CPU, read by MetricParser.

Each runs as one process (no torchrun), its stdout and stderr in two files as torchrun
``--redirects 3`` keeps them; the parser reads them as the supervisor would. The module
starts every run at once; each test parses its own. Skipped when
the package is not installed (``pip install -c constraints.txt transformers accelerate
lightning``).
"""

import os
import subprocess
import sys

import pytest

from agent.formats.metrics import MetricParser

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "formats")

pytestmark = pytest.mark.realpkg


def have(*modules):
    import importlib.util
    return all(importlib.util.find_spec(m) is not None for m in modules)


# Every run of this module, by name: its script, its arguments, the packages it needs. Each
# imports torch and its package (many seconds of CPU), so the module starts them all at once
# (``runs`` below) and each test parses its own.
RUNS = {
    "hf 1 4": ("hf_trainer_run.py", ("10", "1", "4"), ("transformers", "accelerate")),
    "hf 5 0": ("hf_trainer_run.py", ("10", "5", "0"), ("transformers", "accelerate")),
    "lightning": ("lightning_run.py", ("15", "1", "tqdm"), ("lightning",)),
}


def start(folder, script, *args) -> tuple:
    out, err = folder / "stdout.log", folder / "stderr.log"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, script), str(folder / "run"),
                                 *args], stdout=o, stderr=e, cwd=str(folder),
                                # nothing may reach a hub: the model is built from a config
                                env=dict(os.environ, HF_HUB_OFFLINE="1",
                                         HF_HUB_DISABLE_TELEMETRY="1", WANDB_DISABLED="true"))
    return proc, out, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(name)``: the parser and records of RUNS[name], once it ended (those whose
    packages are installed are started at once)."""
    started = {name: start(tmp_path_factory.mktemp("run"), script, *args)
               for name, (script, args, needs) in RUNS.items() if have(*needs)}

    def parsed(name):
        proc, out, err = started[name]
        # (the 600 s one run had, for each: they share the CPU until the last ends)
        proc.wait(timeout=600 * len(started))
        assert proc.returncode == 0, err.read_text(errors="replace")[-3000:]
        parser = MetricParser()
        recs = []
        # stderr first: the reader may see the bar before the dicts, never the reverse at start
        for file, path in (("stderr", err), ("stdout", out)):
            recs += parser.parse(path.read_bytes(), file=file, worker="w")
        return parser, recs
    yield parsed
    for proc, _out, _err in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not have("transformers", "accelerate"),
                    reason="transformers and accelerate are not installed")
@pytest.mark.parametrize("logging_steps, saves", [("1", "4"), ("5", "0")])
def test_real_hf_trainer(runs, logging_steps, saves):
    parser, recs = runs("hf %s %s" % (logging_steps, saves))  # 10 steps
    every = int(logging_steps)
    assert [r["step"] for r in recs if "loss" in r] == list(range(every, 11, every))
    assert max(r["step"] for r in recs if r["k"] == "metric") == 10
    ckpts = [r["step"] for r in recs if r["k"] == "ckpt"]
    assert ckpts == ([4, 8, 10] if saves != "0" else [])
    assert parser.family_of("stdout") == "hf"


@pytest.mark.skipif(not have("lightning"), reason="lightning is not installed")
def test_real_lightning_fit(runs):
    parser, recs = runs("lightning")  # 15 steps, logged every step, a tqdm bar
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, 16))
    assert parser.family_of("stdout") == "lightning"
