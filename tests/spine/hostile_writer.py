"""A rank script for torchrun that writes hostile output (tests/spine/test_hostile.py).

Rank ``--hostile-rank`` (default 1) waits a moment, then writes to stdout, with no pause:
a ``--big-mb`` MB line in one write without a newline (then the newline), bytes that are not
UTF-8, NUL bytes, ANSI escapes (colours, cursor moves, screen clears, OSC titles, a lone ESC,
8-bit C1 controls), markup-like text (``[rank0]:``, ``[bold]``), a line of tabs, carriage
return progress, and ``--burst`` numbered lines in one write. It stamps the start and the end
(``hostile begin t=...``, ``hostile end t=...``) and drops ``<flag-dir>/done``.

Every other rank writes ``seq=N rank=R t=T`` every ``--period`` seconds from its start until
``--linger`` seconds after the flag appears, then exits 0 (exit 3 after ``--max-seconds``,
so a test that never sees the flag fails rather than hangs). No torch import: the ranks do
not need a process group.
"""

import argparse
import os
import sys
import time

ANSI = (b"\x1b[31mred\x1b[0m \x1b[1;32;44mbold green on blue\x1b[m \x1b[2J\x1b[H"
        b"\x1b[10;20Hmoved\x1b[5A\x1b[K \x1b]0;pwned title\x07 \x1b]2;second title\x1b\\ "
        b"\x1b[?1049h\x1b[?25l alt screen \x1b(0lqk\x1b(B \x1bc reset "
        b"\xc2\x9b31m c1-csi \xc2\x9d0;osc\xc2\x9c end\n")
HOSTILE = [
    b"invalid utf-8: \xff\xfe \xc3\x28 \xa0\xa1 \xed\xa0\x80 \xf0\x28\x8c\xbc \xc0\xaf end\n",
    b"nul bytes:\x00\x00 middle\x00end \x00\n",
    b"\x00" * 64 + b"\n",
    ANSI,
    b"lone escape at the end \x1b\n",
    b"truncated csi \x1b[\n",
    b"[rank0]: not from rank 0 [bold]bold[/bold] [red]red[/] [link=http://x]x[/link] "
    b"[/] [[escaped]] \\[x] [@click=app.quit]quit[/]\n",
    b"[default0]:step=99999 loss=0.0 lr=1 step_time=1 tok/s=1 [b]markup-like metric\n",
    b"other controls: \x01\x02\x07\x08\x0b\x0c\x7f del\n",
    b"\t" * 5000 + b"tabs\n",
    b"progress 10%\r progress 50%\r progress 100%\n",
    b"\r\r\r\n",
]


def write_all(out, data):
    view = memoryview(data)
    while view:
        n = out.write(view)
        view = view[n:]


def hostile(args, out):
    time.sleep(args.delay)
    out.write(b"hostile begin t=%.6f\n" % time.time())
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJKLMNOPQRSTUVWXYZ_"
    big = pattern * (args.big_mb * 1024 * 1024 // len(pattern))
    write_all(out, big)  # one write (as far as the kernel takes it), no newline
    del big
    out.write(b"\n")
    for chunk in HOSTILE:
        out.write(chunk)
    burst = b"".join(b"burst %d of %d\n" % (i, args.burst) for i in range(args.burst))
    write_all(out, burst)
    out.write(b"hostile end t=%.6f\n" % time.time())
    open(os.path.join(args.flag_dir, "done"), "w").close()
    return 0


def steady(args, out, rank):
    start = time.time()
    seq = 0
    seen = None
    flag = os.path.join(args.flag_dir, "done")
    while True:
        now = time.time()
        out.write(b"seq=%d rank=%d t=%.6f\n" % (seq, rank, now))
        seq += 1
        if seen is None and os.path.exists(flag):
            seen = now
        if seen is not None and now - seen >= args.linger:
            out.write(b"steady done seqs=%d\n" % seq)
            return 0
        if now - start > args.max_seconds:
            out.write(b"no flag after %d s\n" % args.max_seconds)
            return 3
        time.sleep(args.period)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flag-dir", required=True)
    p.add_argument("--hostile-rank", type=int, default=1)
    p.add_argument("--big-mb", type=int, default=50)
    p.add_argument("--burst", type=int, default=100000)
    p.add_argument("--delay", type=float, default=2.0)
    p.add_argument("--period", type=float, default=0.02)
    p.add_argument("--linger", type=float, default=2.0)
    p.add_argument("--max-seconds", type=int, default=240)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    out = os.fdopen(sys.stdout.fileno(), "wb", buffering=0, closefd=False)
    if rank == args.hostile_rank:
        return hostile(args, out)
    return steady(args, out, rank)


if __name__ == "__main__":
    sys.exit(main())
