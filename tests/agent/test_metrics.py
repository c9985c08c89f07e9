"""MetricParser: the metric and checkpoint lines the console charts, out of raw rank logs."""

import math
import time

import pytest

from agent.formats.metrics import MAX_LINE, MetricParser, keywords_in

REFERENCE = "step=12 loss=4.1234 lr=3.000e-04 step_time=0.0163 tok/s=12345"


def parse(text, user_regex=None):
    return MetricParser(user_regex).parse(text)


def test_reference_trainer_line():
    assert parse(REFERENCE + "\n") == [
        {"k": "metric", "step": 12, "loss": 4.1234, "lr": 3e-4, "step_time": 0.0163,
         "tok_s": 12345.0},
    ]


@pytest.mark.parametrize("prefix", ["[default0]:", "[rank3]: ", "2024-05-01 12:00:01,123 INFO ",
                                    "12:00:01 | "])
def test_prefix_before_step(prefix):
    (rec,) = parse(prefix + REFERENCE)
    assert rec["step"] == 12 and rec["loss"] == 4.1234 and rec["tok_s"] == 12345.0


def test_reordered_and_missing_fields():
    (rec,) = parse("loss=2.5 tok/s=99 step=7\n")
    assert rec == {"k": "metric", "step": 7, "loss": 2.5, "tok_s": 99.0}


def test_colon_form_on_a_step_line():
    (rec,) = parse("Step: 5 | Loss: 2.5 | lr: 1e-4 | step_time: 0.2\n")
    assert rec == {"k": "metric", "step": 5, "loss": 2.5, "lr": 1e-4, "step_time": 0.2}


def test_colon_form_without_step_is_not_a_metric():
    assert parse("note: loss: 2.5 was expected\n") == []


def test_loss_without_step_gives_step_none():
    assert parse("loss=3.5 lr=1e-3\n") == [{"k": "metric", "step": None, "loss": 3.5, "lr": 1e-3}]


def test_keys_inside_longer_names_are_not_metrics():
    # train_loss / eval/loss / max_steps are not the training loss or the current step.
    assert parse("train_loss=1.0 eval/loss=2.0 max_steps=100\n") == []
    (rec,) = parse("global_step=40 train_loss=9 loss=1.5\n")
    assert rec["step"] == 40 and rec["loss"] == 1.5


def test_nan_and_inf():
    (rec,) = parse("step=3 loss=nan lr=inf step_time=-inf\n")
    assert rec["step"] == 3
    assert math.isnan(rec["loss"])  # kept: a diverged run is seen by its loss
    # dropped: the console refuses a number that is not finite in any other field
    assert "lr" not in rec and "step_time" not in rec


def test_nan_step_is_none():
    (rec,) = parse("step=nan loss=1.0\n")
    assert rec["step"] is None and rec["loss"] == 1.0


def test_step_without_metric_is_not_a_record():
    assert parse("resuming at step=50\n") == []


def test_hf_dict_line_without_a_bar_has_no_step():
    # disable_tqdm=True: PrinterCallback prints the dict and nothing says which step it is;
    # the step stays unknown rather than being a count of lines
    line = "{'loss': 2.3456, 'grad_norm': 1.2, 'learning_rate': 4.9e-05, 'epoch': 0.05}\n"
    assert parse(line) == [{"k": "metric", "step": None, "loss": 2.3456, "lr": 4.9e-05}]


def test_hf_dict_with_quoted_or_wrapped_values():
    (rec,) = parse("{'loss': '1.5', 'grad_norm': tensor(3.0), 'learning_rate': np.float64(2e-05)}")
    assert rec["loss"] == 1.5 and rec["lr"] == 2e-05


@pytest.mark.parametrize("line", [
    "{'train_runtime': 12.3, 'train_samples_per_second': 4.5, 'train_steps_per_second': 0.4, "
    "'train_loss': 2.1, 'epoch': 3.0}",
    "{'eval_loss': 2.0, 'eval_runtime': 1.1, 'epoch': 1.0}",
    "{'learning_rate': 4.9e-05, 'epoch': 0.05}",
])
def test_hf_dict_lines_that_are_not_training_loss(line):
    assert parse(line + "\n") == []


def test_hf_dict_takes_the_step_of_the_bar_redrawn_after_it():
    # tqdm.write: the bar is cleared with blanks, the dict printed, the bar redrawn at 50
    text = ("  5%|5   | 49/1000 [00:10<03:10, 4.99it/s]\r  5%|5   | 50/1000 [00:10<03:10, 4.99it/s]"
            "\r" + " " * 44 + "\r{'loss': 1.25, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
            "\r  5%|5   | 50/1000 [00:10<03:10, 4.99it/s]\r  5%|5   | 51/1000 [00:10<03:10, 4.99it/s]")
    assert parse(text) == [{"k": "metric", "step": 50},
                           {"k": "metric", "step": 50, "loss": 1.25, "lr": 1e-05},
                           {"k": "metric", "step": 51}]


def test_hf_bar_moves_give_one_step_record_per_chunk():
    bars = "".join("\r  1%%|1   | %d/1000 [00:10<03:10, 4.99it/s]" % n for n in range(0, 8))
    assert parse(bars) == [{"k": "metric", "step": 7}]


def test_hf_dict_never_cleared_takes_the_bar_count():
    # a bar that never clears for the dicts (they are not written through tqdm): after two
    # dicts the pairing is given up and each dict takes the bar's latest count
    parser = MetricParser()
    recs = parser.parse("\r 1%| | 10/1000 [00:01<01:00, 9.9it/s]\n", "err", "w")
    for n in (1, 2, 3):
        recs += parser.parse("{'loss': %d.5, 'epoch': 0.1}\n" % n, "out", "w")
    assert recs == [{"k": "metric", "step": 10}] + [
        {"k": "metric", "step": 10, "loss": n + 0.5} for n in (1, 2, 3)]


def test_reference_checkpoint_line():
    text = "[default0]:checkpoint saved step=50 path=/abs/path/step_00000050.pt bytes=123456\n"
    assert parse(text) == [
        {"k": "ckpt", "step": 50, "path": "/abs/path/step_00000050.pt", "bytes": 123456},
    ]


def test_checkpoint_path_with_spaces_and_no_bytes():
    assert parse("checkpoint saved step=7 path=/runs/my run/step_7.pt\n") == [
        {"k": "ckpt", "step": 7, "path": "/runs/my run/step_7.pt", "bytes": None},
    ]


def test_hf_checkpoint_line():
    text = ("[INFO|trainer.py:3705] 2024-05-01 >> Saving model checkpoint to "
            "/out/run1/checkpoint-500\n")
    assert parse(text) == [
        {"k": "ckpt", "step": 500, "path": "/out/run1/checkpoint-500", "bytes": None},
    ]


def test_checkpoint_line_is_not_also_a_metric():
    recs = parse("checkpoint saved step=50 path=/x/step_50.pt bytes=1\nstep=51 loss=1.0\n")
    assert [r["k"] for r in recs] == ["ckpt", "metric"]


def test_mixed_formats_keep_order():
    text = "\n".join([
        "step=1 loss=3.0",
        "some unrelated line",
        "{'loss': 2.9, 'learning_rate': 1e-4, 'epoch': 0.1}",
        "checkpoint saved step=2 path=/c/step_2.pt bytes=10",
        REFERENCE,
    ])
    recs = parse(text)
    assert [(r["k"], r["step"]) for r in recs] == [
        ("metric", 1), ("metric", None), ("ckpt", 2), ("metric", 12)]


def test_user_regex():
    parser = MetricParser(r"iter (?P<step>\d+)/\d+ .*? lm loss: (?P<loss>\S+) \| (?P<other>\w+)")
    recs = parser.parse(" iter 10/100 | elapsed 3 | lm loss: 8.1E+00 | x\n")
    assert recs == [{"k": "metric", "step": 10, "loss": 8.1}]


def test_user_regex_wins_over_builtin_on_its_line_only():
    parser = MetricParser(r"L=(?P<loss>[0-9.]+)")
    recs = parser.parse("step=3 loss=1.0 L=9.5\nstep=4 loss=2.0\n")
    assert recs == [{"k": "metric", "step": None, "loss": 9.5},
                    {"k": "metric", "step": 4, "loss": 2.0}]


def test_user_regex_invalid():
    with pytest.raises(ValueError, match="invalid metrics regex"):
        MetricParser(r"loss=(?P<loss>[0-9.+")


def test_user_regex_without_known_groups():
    with pytest.raises(ValueError, match="no named group among step, loss"):
        MetricParser(r"(?P<perplexity>\d+)")


def test_garbage_never_raises():
    junk = "".join(chr(c) for c in range(0, 0x800, 7))
    surrogates = b"step=1 loss=\xff\xfe \x00\x80 step=2 loss=2.5\n".decode("utf-8", "surrogateescape")
    text = junk + "\n" + surrogates + "\udcff\udcfe\n" + "\u0130 Step=3 Loss=4\n"
    recs = MetricParser().parse(text)
    assert recs == [{"k": "metric", "step": 1, "loss": 2.5}, {"k": "metric", "step": 3, "loss": 4.0}]
    # a user regex that matches every line but yields no number leaves the line to the
    # built-in formats
    assert MetricParser("(?P<loss>.+)").parse(text) == recs
    assert MetricParser().parse("") == []
    assert MetricParser().parse(b"step=1 loss=2\xff\n") == [{"k": "metric", "step": 1, "loss": 2.0}]


def test_huge_values_do_not_raise():
    (rec,) = parse("step=" + "9" * 5000 + " loss=1e999\n")
    assert rec["step"] is None and rec["loss"] == math.inf


def test_overlong_and_hostile_lines():
    long_line = "step=1 loss=" + "1" * MAX_LINE + "x\n"
    assert parse(long_line + "step=2 loss=3\n") == [{"k": "metric", "step": 2, "loss": 3.0}]
    # Long blank and digit runs where each format's pattern would backtrack if it could: the
    # patterns are linear, so these take milliseconds (a quadratic one would take minutes).
    hostile = {
        "checkpoint saved path=a" + " " * 60000 + "b": [],
        "Saving model checkpoint to a" + " " * 60000 + "b": [],
        "step=1 loss=" + "1" * 60000 + "x step_time=1": [{"k": "metric", "step": 1, "loss": math.inf,
                                                          "step_time": 1.0}],
        " iteration " + "1" * 60000 + "/ 10 |": [],
        "Epoch 1: " + " " * 60000 + "x": [],
        " 5%|" + " " * 60000 + "| 1/": [],
        "step: " + "9" * 60000 + " loss": [],
    }
    for line, expected in hostile.items():
        assert parse(line) == expected


def test_ten_thousand_lines_in_order():
    lines = ["[default%d]:step=%d loss=%.4f lr=3.000e-04 step_time=0.0163 tok/s=%d"
             % (i % 8, i, 5.0 - i * 1e-4, 12000 + i) for i in range(10000)]
    lines[5000] = "step=5000 tok/s=17000 loss=4.5"  # one off the fast path
    chunk = "\n".join(lines) + "\n"
    parser = MetricParser()
    started = time.perf_counter()
    recs = parser.parse(chunk)
    elapsed = time.perf_counter() - started
    assert [r["step"] for r in recs] == list(range(10000))
    assert recs[5000]["loss"] == 4.5 and recs[9999]["tok_s"] == 21999.0
    print("\nmetrics: 10k trainer lines in %.1f ms (%.0f lines/s)" % (elapsed * 1e3, 10000 / elapsed))


def test_lines_without_metrics_are_cheap_and_empty():
    chunk = "".join("INFO epoch 1 batch %d: data loaded, all good\n" % i for i in range(10000))
    started = time.perf_counter()
    assert MetricParser().parse(chunk) == []
    elapsed = time.perf_counter() - started
    print("\nmetrics: 10k plain lines in %.2f ms (%.0f lines/s)" % (elapsed * 1e3, 10000 / elapsed))


def test_keywords_in_scans_for_a_tqdm_rate_only_where_a_slash_is():
    assert keywords_in("100%|#####| 100/100 [00:01<00:00, 9.50it/s]") == ("it/s",)
    assert keywords_in("epoch 1: 2.31s/it, step 3") == ("s/it", "step")
    # no '/': the rates are not looked for, the other keywords are
    assert keywords_in("step 3 loss 2.0 it s checkpoint iteration") == (
        "loss", "checkpoint", "step", "iteration")
    assert keywords_in("rank=3 seq=1 t=1.5 xxxx") == ()


def test_a_loss_nan_in_printed_text_of_another_family_is_no_metric():
    """A Hugging Face file whose trainer prints a generated sample holding ``step=3
    loss=nan``: the plain family reads it, but it is not this file's trainer's line, so no
    non-finite loss comes out of it (``--on-nan stop`` would stop the run); the trainer's own
    nan loss still does."""
    parser = MetricParser()
    hf = "{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 0.0001, 'epoch': 0.1}\n"
    assert parser.parse(hf * 3, "f") and parser.family_of("f") == "hf"
    sample = "generated: the table says step=3 loss=nan for this row\n"
    assert not any(math.isnan(r.get("loss", 0.0)) for r in parser.parse(sample, "f"))
    (rec,) = parser.parse(hf.replace("2.5", "nan"), "f")
    assert math.isnan(rec["loss"])
