"""Asking a rank's flight-recorder hook while it is still answering another asker: its FIFO
has no reader for that moment (the hook reopens it after each answer), and the ask waits for it
instead of calling the hook deaf (the judge's two samples, the periodic sampler and a
console's `why` can come close together: a verdict then named nobody)."""

from __future__ import annotations

import os
import threading
import time

from agent.torchrun import fr_dump


def test_an_ask_waits_for_a_hook_that_reopens_its_fifo(tmp_path):
    pid = 4242
    fifo = tmp_path / ("%d.req" % pid)
    os.mkfifo(fifo, 0o600)
    got = []

    def hook_back_later():
        time.sleep(0.3)  # still writing its previous answer
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=hook_back_later, daemon=True)
    reader.start()
    asked = fr_dump.ask(str(tmp_path), pid)
    reader.join(10)
    assert "error" not in asked, asked
    assert got == [b"1"]


def test_a_hook_that_never_listens_is_said_after_the_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(fr_dump, "LISTEN_WAIT", 0.2)
    os.mkfifo(tmp_path / "7.req", 0o600)
    assert "not listening" in fr_dump.ask(str(tmp_path), 7)["error"]
    assert "no flight-recorder hook" in fr_dump.ask(str(tmp_path), 8)["error"]
