"""A training script that prints nothing: gloo all-reduces and arithmetic for ``BUSY_S``
seconds, then every rank sleeps (a hang that uses no CPU). For tests/spine/test_silent_ranks.py."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(10000)
end = time.monotonic() + float(os.environ.get("BUSY_S", "20"))
while time.monotonic() < end:
    t = (t * 1.0001).sin()
    dist.all_reduce(t)
time.sleep(3600)
