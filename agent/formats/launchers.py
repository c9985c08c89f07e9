"""Trainers that print one summary line per logging interval: torchtitan, Megatron-LM, DeepSpeed.

Each family reproduces the format string of its project's source (cited per class); the
captured lines in tests/agent/formats/ are what the tests read. Standard library only; runs on
Python >= 3.8.
"""

import re

from .values import NUM, strip_ansi, to_float, to_int


class TorchtitanFamily:
    """torchtitan, torchtitan/components/metrics.py ``MetricsProcessor.log``::

        [titan] 2026-01-05 10:00:00,000 - root - INFO - \\x1b[31mstep:  1  \\x1b[32mloss: 12.25311
        \\x1b[38;2;180;60;0mgrad_norm:  4.0938  \\x1b[38;2;54;234;195mmemory: 15.64GiB(16.46%)
        \\x1b[34mtps: 1,297  \\x1b[36mtflops: 75.12  \\x1b[35mmfu: 7.60%\\x1b[39m

    (one line). ``tps`` is tokens per second per device. Its checkpoint messages name neither
    the step nor the folder ("Finished saving the checkpoint in 1.23 seconds."), so none is read.
    """

    name = "torchtitan"
    keywords = ("step",)
    _LINE = re.compile(r"(?<!\w)step:\s*([0-9]{1,12})\s+loss:\s*(" + NUM + ")", re.ASCII)
    _TPS = re.compile(r"\btps: ([0-9][0-9,]{0,20})")
    _TFLOPS = re.compile(r"\btflops: ([0-9][0-9,]{0,20}(?:\.[0-9]+)?)")

    def segment(self, seg, worker, out):
        if "step:" not in seg:
            return False
        line = strip_ansi(seg)
        m = self._LINE.search(line)
        # "validate step: 10  loss: ..." is the validation loss, not a training step
        if m is None or line[max(0, m.start() - 9):m.start()].endswith("validate "):
            return m is not None
        rec = {"k": "metric", "step": to_int(m.group(1)), "loss": to_float(m.group(2))}
        tps = self._TPS.search(line, m.end())
        if tps is not None:
            rec["tok_s"] = to_float(tps.group(1))
        tflops = self._TFLOPS.search(line, m.end())
        if tflops is not None:
            rec["tflops"] = to_float(tflops.group(1))
        out.append(rec)
        return True


class MegatronFamily:
    """Megatron-LM, megatron/training/training.py ``training_log`` (printed on the last rank)::

         [2026-01-05 10:00:00.123456] iteration      100/    1000 | consumed samples: ... |
         elapsed time per iteration (ms): 350.2 | learning rate: 1.500000E-04 | global batch
         size:    32 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | ...

    (one line), and megatron/training/checkpointing.py ``save_checkpoint``::

          [2026-01-05 10:00:00.123456] successfully saved checkpoint from iteration     100 to
          /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ]

    The checkpoint folder is ``<save>/iter_0000100`` (``get_checkpoint_name``).
    """

    name = "megatron"
    keywords = ("iteration",)
    _LINE = re.compile(r"\biteration\s+([0-9]{1,12})/\s*([0-9]{1,12}) \|", re.ASCII)
    _FIELD = re.compile(r"\| ([a-zA-Z][^|:]{0,60}): (" + NUM + r") (?=\|)", re.ASCII)
    _SAVED = re.compile(r"successfully saved checkpoint from iteration\s+([0-9]{1,12}) to (.+?)"
                        r"(?: \[ t [^\]]*\])?\s*$", re.ASCII)

    def segment(self, seg, worker, out):
        if "iteration" not in seg:
            return False
        m = self._LINE.search(seg)
        if m is None:
            return self._checkpoint(seg, out)
        rec = {"k": "metric", "step": to_int(m.group(1))}
        loss = None
        for key, value in self._FIELD.findall(seg, m.end() - 1):
            if key == "learning rate":
                rec["lr"] = to_float(value)
            elif key == "elapsed time per iteration (ms)":
                ms = to_float(value)
                rec["step_time"] = ms / 1000.0 if ms is not None else None
            elif key == "throughput per GPU (TFLOP/s/GPU)":
                rec["tflops"] = to_float(value)
            elif key == "lm loss" or (loss is None and key.endswith(" loss")
                                      and key != "loss scale"):
                loss = to_float(value)
        if loss is not None:
            rec["loss"] = loss
        out.append(rec)
        return True

    def _checkpoint(self, seg, out):
        m = self._SAVED.search(seg)
        if m is None:
            return False
        step = to_int(m.group(1))
        out.append({"k": "ckpt", "step": step,
                    "path": "%s/iter_%07d" % (m.group(2).rstrip("/"), step), "bytes": None})
        return True


class DeepSpeedFamily:
    """DeepSpeed, deepspeed/runtime/engine.py ``_report_progress`` (every ``steps_per_print``)::

        [2026-01-05 10:00:00,123] [INFO] [logging.py:107:log_dist] [Rank 0] step=10, skipped=0,
        lr=[9.5e-05], mom=[(0.9, 0.999)]

    deepspeed/utils/timer.py ``ThroughputTimer.stop`` (the throughput line, when
    ``wall_clock_breakdown`` or the timer is on)::

        [...] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=55.1,
        CurrSamplesPerSec=60.2, MemAllocated=1.2GB, MaxMemAllocated=3.4GB

    and engine.py ``_save_checkpoint``: ``[Rank 0] Saving model checkpoint:
    /out/global_step100/mp_rank_00_model_states.pt``. DeepSpeed prints no loss of its own.
    """

    name = "deepspeed"
    keywords = ("step",)
    _PROGRESS = re.compile(r"(?<![\w/])step=([0-9]{1,12}), skipped=([0-9]{1,12}), lr=\[?(" + NUM
                           + ")", re.ASCII)
    _THROUGHPUT = re.compile(r"micro_step=[0-9]{1,12}/global_step=([0-9]{1,12}), "
                             r"RunningAvgSamplesPerSec=(" + NUM + r"), CurrSamplesPerSec=(" + NUM
                             + ")", re.ASCII)
    _SAVE = re.compile(r"Saving model checkpoint: (.+)")
    _TAG_STEP = re.compile(r"global_step([0-9]{1,12})(?:[\\/]|$)", re.ASCII)

    def segment(self, seg, worker, out):
        if "step" not in seg:
            return False
        if "skipped=" in seg:
            m = self._PROGRESS.search(seg)
            if m is not None:
                out.append({"k": "metric", "step": to_int(m.group(1)),
                            "lr": to_float(m.group(3))})
                return True
        if "SamplesPerSec" in seg:
            m = self._THROUGHPUT.search(seg)
            if m is not None:
                out.append({"k": "metric", "step": to_int(m.group(1)),
                            "samples_s": to_float(m.group(3))})
                return True
        if "Saving model checkpoint:" in seg:
            m = self._SAVE.search(seg)
            path = m.group(1).rstrip() if m is not None else ""
            tag = self._TAG_STEP.search(path)
            if tag is not None:
                out.append({"k": "ckpt", "step": to_int(tag.group(1)), "path": path,
                            "bytes": None})
                return True
        return False
