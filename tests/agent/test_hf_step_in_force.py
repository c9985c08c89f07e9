"""Each Hugging Face loss at its own step, read as the supervisor reads a worker's two files.

A Trainer draws its progress bar on stderr with a leading ``\\r`` and no line end
(``\\r 3%|▎ | 1/30 [...]``) and writes its loss dict on stdout. Real rank files in a
torchrun-shaped folder, a real follower (agent/host/tail.py), the recorder
(agent/supervisor/recorder.py) and a real journal: the bytes are appended in the order a
writer makes them and the recorder's turns fall between them, as the supervisor's do. Every
loss must be journaled at its step, none without one, and as soon as the turn after its
write; the judge's view (agent/rules/judge_view.py) reads the same metas.
"""

import os

import pytest

from agent.host.journal import JournalReader, JournalWriter
from agent.host.tail import LogFollower
from agent.rules.judge_view import RunView
from agent.rules.mask import Masker
from agent.supervisor.recorder import Recorder

STEPS = 12


def loss(step, nan_at=None):
    return "nan" if step == nan_at else "%.6f" % (1.0 / step)


def bar(n, total=STEPS):
    done = n * 10 // total
    return ("\r%3d%%|%s%s| %d/%d [00:00<00:00,  9.50it/s]" % (
        n * 100 // total, "#" * done, " " * (10 - done), n, total)).encode()


def the_dict(step, nan_at=None):
    return ("{'loss': %s, 'grad_norm': 1.07, 'learning_rate': 5e-05, 'epoch': %s}\n"
            % (loss(step, nan_at), step / STEPS)).encode()


class Worker:
    """Local rank 0's two files, the recorder that reads them and what it journaled."""

    def __init__(self, tmp_path):
        self.log_dir = str(tmp_path / "logs")
        folder = os.path.join(self.log_dir, "run_abc", "attempt_0", "0")
        os.makedirs(folder)
        self.out, self.err = (os.path.join(folder, s + ".log") for s in ("stdout", "stderr"))
        for path in (self.out, self.err):
            open(path, "wb").close()
        masker = Masker(["s3cr3t-token-1234"])
        follower = LogFollower(self.log_dir, lambda attempt, local_rank: (3, {}),
                               keep_whole=masker.safe_cut)
        self.journal_path = str(tmp_path / "journal")
        self.recorder = Recorder(JournalWriter(self.journal_path), follower, masker, "node1",
                                 None, str(tmp_path), None, lambda: "run_abc", print)
        self.reader = JournalReader(self.journal_path)
        self.metas = []

    def write(self, stream, data):
        with open(self.out if stream == "out" else self.err, "ab") as f:
            f.write(data)

    def turn(self, final=False):
        """One turn of the supervisor's; the loss points it journaled."""
        self.recorder.pump(final=final)
        new = [m for m, _d, _e in self.reader.read(1 << 30)]
        self.metas += new
        return points(new)


def points(metas):
    return [(m.get("step"), m["loss"]) for m in metas if m.get("k") == "metric" and "loss" in m]


def expected(steps, nan_at=None):
    return [(s, float(loss(s, nan_at))) for s in steps]


def same(got, want):
    return [(s, "nan" if v != v else v) for s, v in got] == \
        [(s, "nan" if v != v else v) for s, v in want]


def tqdm_step(w, step, turn_inside=False):
    """What transformers writes at a logged step: the bar's update, then ``tqdm.write`` of
    the dict (the bar blanked and its \\r apart, the dict, the bar drawn again)."""
    w.write("err", bar(step))
    w.write("err", b"\r" + b" " * (len(bar(step)) - 1))
    if turn_inside:  # a turn between the blanks and the \r that ends them
        w.turn()
    w.write("err", b"\r")
    w.write("out", the_dict(step))
    w.write("err", bar(step))


@pytest.mark.parametrize("turn_inside", [False, True])
def test_a_trainers_loss_is_journaled_at_its_step_in_the_turn_after_it(tmp_path, turn_inside):
    w = Worker(tmp_path)
    w.write("err", bar(0))
    assert w.turn() == []
    for step in range(1, STEPS + 1):
        tqdm_step(w, step, turn_inside)
        # the bar drawn after the dict is its step: read now, not when the next step's \r is
        assert same(w.turn(), expected([step])), step
    w.write("err", b"\n")
    assert w.turn(final=True) == []


def test_dicts_written_in_one_block_after_their_bars_find_each_its_step(tmp_path):
    # under torchrun the Trainer's stdout is a file: its dicts leave in 8 KiB blocks, long
    # after the bars they belong to (and more of them than a few)
    w, many = Worker(tmp_path), 300
    w.write("err", bar(0, many))
    dicts = b""
    for step in range(1, many + 1):
        for data in (bar(step, many), b"\r" + b" " * 40, b"\r", bar(step, many)):
            w.write("err", data)
        dicts += the_dict(step)
        if step % 7 == 0:
            w.turn()
    w.write("out", dicts)
    got = w.turn() + w.turn(final=True)
    assert same(got, expected(range(1, many + 1)))


@pytest.mark.parametrize("steps_a_turn", [1, 3])
def test_a_loop_that_prints_its_dict_below_its_bar_gets_each_step(tmp_path, steps_a_turn):
    # no clear between the bar and the dict: the step in force when the dict was written
    w, got = Worker(tmp_path), []
    for step in range(1, STEPS + 1):
        w.write("err", bar(step))
        w.write("out", the_dict(step, nan_at=7))
        if step % steps_a_turn == 0:
            got += w.turn()
    got += w.turn(final=True)
    assert same(got, expected(range(1, STEPS + 1), nan_at=7))

    # the judge reads the same metas: the rank's step, and where it diverged
    view = RunView(["node1"], stall_after=60)
    events = [e for i, m in enumerate(w.metas) for e in view.apply("node1", m, float(i))]
    assert view.ranks[3].step == STEPS
    (diverged,) = [e for e in events if e.get("what") == "diverged"]
    assert diverged["step"] == 7, diverged


def test_a_bar_is_passed_on_when_drawn_and_a_clear_when_whole(tmp_path):
    w = Worker(tmp_path)
    w.write("err", b"[transformers] ***** Running training *****\n" + bar(0) + bar(1))
    w.recorder.pump()
    data = b"".join(d for _m, d, _e in JournalReader(w.journal_path).read(1 << 30))
    assert data.endswith(bar(1))  # drawn: in force now, not when the next \r starts
    w.write("err", b"\r" + b" " * 30)  # tqdm's blanks; their \r comes in its own write
    w.recorder.pump()
    assert b"".join(d for _m, d, _e in JournalReader(w.journal_path).read(1 << 30)) == \
        data + b"\r"  # the blanks wait for it: one clear, whole
    w.write("err", b"\r")
    w.recorder.pump()
    data = b"".join(d for _m, d, _e in JournalReader(w.journal_path).read(1 << 30))
    assert data.endswith(bar(1) + b"\r" + b" " * 30 + b"\r")
