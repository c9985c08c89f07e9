"""A real Hugging Face Trainer and a real Lightning fit, on CPU, read by MetricParser.

Each runs as one process (no torchrun), its stdout and stderr in two files as torchrun
``--redirects 3`` keeps them; the parser reads them as the supervisor would. Skipped when
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


def run_and_parse(tmp_path, script, *args):
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.run([sys.executable, os.path.join(HERE, script), str(tmp_path / "run"),
                               *args], stdout=o, stderr=e, cwd=str(tmp_path), timeout=600,
                               # nothing may reach a hub: the model is built from a config
                               env=dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
                                        WANDB_DISABLED="true"))
    assert proc.returncode == 0, err.read_text(errors="replace")[-3000:]
    parser = MetricParser()
    recs = []
    # stderr first: the reader may see the bar before the dicts, never the reverse at start
    for name, path in (("stderr", err), ("stdout", out)):
        recs += parser.parse(path.read_bytes(), file=name, worker="w")
    return parser, recs


@pytest.mark.skipif(not have("transformers", "accelerate"),
                    reason="transformers and accelerate are not installed")
@pytest.mark.parametrize("logging_steps, saves", [("1", "4"), ("5", "0")])
def test_real_hf_trainer(tmp_path, logging_steps, saves):
    parser, recs = run_and_parse(tmp_path, "hf_trainer_run.py", "10", logging_steps, saves)
    every = int(logging_steps)
    assert [r["step"] for r in recs if "loss" in r] == list(range(every, 11, every))
    assert max(r["step"] for r in recs if r["k"] == "metric") == 10
    ckpts = [r["step"] for r in recs if r["k"] == "ckpt"]
    assert ckpts == ([4, 8, 10] if saves != "0" else [])
    assert parser.family_of("stdout") == "hf"


@pytest.mark.skipif(not have("lightning"), reason="lightning is not installed")
def test_real_lightning_fit(tmp_path):
    parser, recs = run_and_parse(tmp_path, "lightning_run.py", "15", "1", "tqdm")
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, 16))
    assert parser.family_of("stdout") == "lightning"
