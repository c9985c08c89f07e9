"""Each trainer family's real output through MetricParser: the step is the trainer's own.

The data files under tests/agent/formats/ are captured output of real runs (Hugging Face
Trainer and PyTorch Lightning on CPU) or lines in the exact format of the project's source
(torchtitan, Megatron-LM, DeepSpeed); formats/README.md says how each was made.
"""

import math
import os
import re

import pytest

from agent.formats.metrics import MetricParser

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "formats")


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8", newline="") as f:
        text = f.read()
    return "".join(line for line in text.splitlines(True) if not line.startswith("# "))


def pieces(text):
    """The text as the agent's log follower hands it over: cut after each \\n or \\r."""
    return [p for p in re.split(r"(?<=[\r\n])", text) if p]


def interleave(err, out, lag):
    """stderr and stdout pieces in an order a reader polling both files can see them.

    A Trainer writes its n-th dict line to stdout right after the n-th bar clear on stderr.
    ``lag`` is how many stderr pieces before that clear the reader had read when it read the
    dict (stderr read a little behind stdout); None reads all of stderr first.
    """
    err, out = pieces(err), pieces(out)
    if lag is None:
        return [("stderr", p) for p in err] + [("stdout", p) for p in out]
    clears = [i for i, p in enumerate(err) if p.endswith("\r") and p[:-1].isspace()]
    seq, sent = [], 0
    for i, line in enumerate(out):
        upto = clears[i] + 1 - lag if i < len(clears) else len(err)
        seq += [("stderr", p) for p in err[sent:max(sent, upto)]]
        sent = max(sent, upto)
        seq.append(("stdout", line))
    return seq + [("stderr", p) for p in err[sent:]]


def run_worker(name, lag=0):
    parser = MetricParser()
    recs = []
    for stream, text in interleave(read(name + ".stderr"), read(name + ".stdout"), lag):
        recs += parser.parse(text, file=stream, worker=("local_rank 0", 0))
    return parser, recs


def losses(recs):
    return [(r["step"], r["loss"]) for r in recs if r["k"] == "metric" and "loss" in r]


def dict_losses(name):
    """The loss values of the Trainer's dict lines, from its stdout."""
    return [float(v) for v in re.findall(r"\{'loss': '([0-9.e-]+)'", read(name + ".stdout"))]


# -- Hugging Face Trainer ------------------------------------------------------------------

@pytest.mark.parametrize("lag", [0, 2, None])
@pytest.mark.parametrize("name, steps, max_steps", [
    ("hf_logging1", list(range(1, 13)), 12),
    ("hf_logging10", [10, 20, 30, 40], 40),
    ("hf_default", [500, 1000], 1010),
    ("hf_resume", list(range(13, 21)), 20),  # resumed from checkpoint-12: carries on at 13
])
def test_hf_trainer_steps_are_the_trainers(name, steps, max_steps, lag):
    parser, recs = run_worker(name, lag)
    assert losses(recs) == list(zip(steps, dict_losses(name)))
    assert parser.family_of("stdout") == "hf" and parser.family_of("stderr") == "hf"
    # between logs the bar gives the step, up to the last one
    seen = [r["step"] for r in recs if r["k"] == "metric"]
    assert max(seen) == max_steps and None not in seen
    if lag == 0:
        assert seen == sorted(seen)


def test_hf_learning_rate_and_final_summary():
    _, recs = run_worker("hf_logging1")
    metrics = [r for r in recs if "loss" in r]
    assert metrics[0]["lr"] == 5e-05 and metrics[-1]["lr"] == 4.167e-06
    # {'train_runtime': ..., 'train_loss': ...} is the run's average, not a step's loss
    assert len(metrics) == 12


def test_hf_default_logging_still_shows_progress_between_logs():
    _, recs = run_worker("hf_default")
    steps = [r["step"] for r in recs if r["k"] == "metric" and "loss" not in r]
    assert len(steps) > 10 and steps[0] < 500 < steps[-1]


def test_hf_checkpoints():
    _, recs = run_worker("hf_logging1")
    assert [(r["step"], r["path"]) for r in recs if r["k"] == "ckpt"] == [
        (5, "o1/checkpoint-5"), (10, "o1/checkpoint-10"), (12, "o1/checkpoint-12")]
    _, recs = run_worker("hf_resume")
    assert [r["step"] for r in recs if r["k"] == "ckpt"] == [15, 20]


def test_hf_both_streams_in_one_file():
    # 2>&1: the clear, the dict and the redraw arrive in the order they were written
    parser = MetricParser()
    text = read("hf_logging10.stderr")
    dicts = iter(read("hf_logging10.stdout").splitlines(True))
    merged = re.sub(r"\r( +)\r", lambda m: "\r" + m.group(1) + "\r" + next(dicts), text)
    recs = parser.parse(merged)
    assert losses(recs) == list(zip([10, 20, 30, 40], dict_losses("hf_logging10")))


# -- PyTorch Lightning ---------------------------------------------------------------------

def bar_losses(name):
    """The loss each step's bar settles on: the value in its last draw at that count."""
    last = {}
    for m in re.finditer(r"Epoch (\d+):[^\r\n]*?\| *(\d+)/\d+ \[[^\]]*train_loss=([0-9.e-]+)\]",
                         read(name + ".stdout")):
        if m.group(2) != "0":  # an epoch's reset draw
            last[(int(m.group(1)), int(m.group(2)))] = float(m.group(3))
    return [loss for _, loss in sorted(last.items())]


@pytest.mark.parametrize("name, last_step", [
    ("lightning_every1", 25), ("lightning_every10", 25), ("lightning_default", 120)])
def test_lightning_steps_and_losses(name, last_step):
    parser, recs = run_worker(name)
    got = losses(recs)
    assert [s for s, _ in got] == list(range(1, last_step + 1))
    assert [v for _, v in got] == bar_losses(name)
    assert parser.family_of("stdout") == "lightning"


def test_lightning_resumed_in_mid_epoch_carries_on():
    # resumed from epoch=2-step=25.ckpt to max_steps=35: "Training: n/?" then "Epoch 3"
    _, recs = run_worker("lightning_resume")
    assert [s for s, _ in losses(recs)] == list(range(26, 36))


def test_lightning_rich_bar_is_not_read_as_steps():
    # RichProgressBar writes only its last frame into a file: nothing to misread
    _, recs = run_worker("lightning_rich")
    assert recs == []


# -- torchtitan, Megatron-LM, DeepSpeed ----------------------------------------------------

def parse_file(name):
    parser = MetricParser()
    return parser, parser.parse(read(name), file=name, worker=name)


def test_torchtitan():
    parser, recs = parse_file("torchtitan.log")
    assert recs == [
        {"k": "metric", "step": 1, "loss": 12.25311, "tok_s": 1297.0, "tflops": 75.12},
        {"k": "metric", "step": 10, "loss": 9.87654, "tok_s": 40123.0, "tflops": 2323.51},
        {"k": "metric", "step": 20, "loss": 7.01234, "tok_s": 40980.0, "tflops": 2373.12},
        {"k": "metric", "step": 30, "loss": 6.54321, "tok_s": 41011.0, "tflops": 2374.92},
    ]
    assert parser.family_of("torchtitan.log") == "torchtitan"


def test_megatron():
    parser, recs = parse_file("megatron.log")
    metrics = [r for r in recs if r["k"] == "metric"]
    assert [(r["step"], r["loss"]) for r in metrics] == [
        (110, 7.123456), (120, 6.987654), (130, 6.5)]
    assert metrics[1]["lr"] == 1.45e-4 and metrics[1]["tflops"] == 123.4
    assert math.isclose(metrics[1]["step_time"], 0.3502)
    assert [r for r in recs if r["k"] == "ckpt"] == [
        {"k": "ckpt", "step": 120, "path": "/ckpt/gpt/iter_0000120", "bytes": None}]
    assert parser.family_of("megatron.log") == "megatron"


def test_deepspeed():
    parser, recs = parse_file("deepspeed.log")
    assert [r for r in recs if "lr" in r] == [
        {"k": "metric", "step": 10, "lr": 9e-05}, {"k": "metric", "step": 20, "lr": 8e-05},
        {"k": "metric", "step": 30, "lr": 7e-05}]
    assert [(r["step"], r["samples_s"]) for r in recs if "samples_s" in r] == [
        (10, 61.2), (20, 62.2), (30, 63.2)]
    assert [r for r in recs if r["k"] == "ckpt"] == [
        {"k": "ckpt", "step": 20, "path": "/out/ds/global_step20/mp_rank_00_model_states.pt",
         "bytes": None}]
    assert parser.family_of("deepspeed.log") == "deepspeed"


def test_accelerate_plain_prints():
    # an accelerate script prints what it likes; the common shape is key=value
    text = ("Step 10: loss=2.3456 lr=1e-04\n"
            "epoch 0 | step=20 | loss=2.1 | lr=9.5e-05\n")
    parser = MetricParser()
    assert parser.parse(text, "f") == [
        {"k": "metric", "step": None, "loss": 2.3456, "lr": 1e-04},
        {"k": "metric", "step": 20, "loss": 2.1, "lr": 9.5e-05}]
    assert parser.family_of("f") == "plain"


def test_user_regex_for_a_format_of_its_own():
    parser = MetricParser(r"it (?P<step>\d+) ppl=\S+ nll=(?P<loss>[0-9.]+)")
    assert parser.parse("it 7 ppl=9.1 nll=2.2\n") == [{"k": "metric", "step": 7, "loss": 2.2}]


def test_each_file_settles_on_its_own_family():
    parser = MetricParser()
    parser.parse(read("megatron.log"), "a", "w1")
    parser.parse(read("torchtitan.log"), "b", "w2")
    parser.parse(read("deepspeed.log"), "c", "w3")
    assert [parser.family_of(f) for f in "abc"] == ["megatron", "torchtitan", "deepspeed"]
    assert parser.family_of("never seen") is None
