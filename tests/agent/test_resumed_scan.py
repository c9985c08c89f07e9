"""agent/formats/resumed.py after the metrics parser's scan (agent/supervisor/recorder.py): a chunk's resume lines
are found whether or not the parser's keywords are handed on, and a chunk that mentions
none of them costs one scan for Hugging Face's ``Loading model from``."""

import pytest

from agent.formats.metrics import MetricParser
from agent.formats.resumed import resumed_records

NOISE = "rank=3 seq=12 t=1.5 " + "x" * 40 + "\n"


@pytest.mark.parametrize("line", [
    "resumed step=50 from=/abs/ckpt/step_00000050.pt\n",
    "[INFO|trainer.py:3659] >> Loading model from /data/run7/best.\n",  # no step, no checkpoint
    "[INFO|trainer.py:1632] >>   Resuming training from checkpoint with epoch 1 and global "
    "step 500\n",
    "  Continuing training from global step 7\n",
    "Restored all states from the checkpoint at /ckpt/epoch=2-step=25.ckpt\n",
])
def test_a_resume_line_is_found_with_the_metrics_keywords_as_without(line):
    parser = MetricParser()
    text = NOISE * 20 + line + NOISE * 20
    parser.parse(text, "f", (0, 0, "i"))
    assert parser.mentioned is not None
    found = resumed_records(text, parser.mentioned)
    assert found == resumed_records(text) and len(found) == 1


def test_the_keywords_are_none_when_every_line_was_read_and_nothing_is_skipped():
    parser = MetricParser(r"loss (?P<loss>[0-9.]+)")  # a user regex reads every line
    text = NOISE + "resumed step=5 from=/c/5.pt\n"
    parser.parse(text)
    assert parser.mentioned is None
    assert resumed_records(text, parser.mentioned) == resumed_records(text) != []
    plain = MetricParser()
    plain.parse(NOISE * 5)
    assert plain.mentioned == () and resumed_records(NOISE * 5, plain.mentioned) == []
