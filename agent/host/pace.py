"""How long a polling loop sleeps between turns: fast while data pours in, slower when little comes.

The supervisor (tailing the ranks' files) and ``serve`` (streaming the journal) poll: a turn
costs about the same whether it finds one line or a thousand (a read per file, a directory
scan, a message), so at a chatty trainer's 10 lines a second per rank, turns every 20 ms spent
most of the agent's CPU finding one line each (docs/BENCHMARKS.md, "The whole agent"). A turn
whose bytes come in at ``RATE`` or more keeps the next one ``FAST``; a slower trickle doubles
the wait up to ``SLOW``. So a flood (where the latency target lives: p99 <= 200 ms at 10k
lines/s) is read every 50 ms, and a trickle in batches of 100 ms, which a person reading the
lines cannot tell apart; the first line after a quiet spell waits at most ``SLOW`` per stage.
A flood was read every 20 ms until the ingest bench showed what each turn costs beyond its
bytes (a read per file, a journal write, a message, the console's decode of it): at 100k
lines/s 50 ms turns took about a fifth less of the agent's CPU a line, for ~25 ms more
latency (docs/BENCHMARKS.md, "Ingest").

A torrent (``TORRENT`` bytes a second or more, ten busy nodes' worth: 100k lines/s over four
nodes is ~2 MiB/s each) that has lasted ``SETTLE`` seconds is read every ``LONG`` instead:
at that rate each turn's fixed costs (an inotify drain, a read per file, the phase, a journal
write, serve's message and the console's decode of it) were half of rankdeck's CPU
(docs/BENCHMARKS.md, "Ingest"), and no person reads thousands of lines
a second, so 50 ms more between batches shows nothing new; a flood below it (10k lines/s on
one node is ~0.8 MiB/s, where the latency target lives) keeps ``FAST``, as does a torrent's
first second and the first turn after it ebbs.

Where inotify wakes them (agent/host/watch.py) ``serve`` reads the journal as soon as the
supervisor appends, so the supervisor may spend the pair's budget alone: ``SLOW_WATCHED``
batches a trickle two turns into one, and a quiet spell costs a turn a second
(agent/supervisor/supervisor.py ``IDLE_WATCHED``).
"""

import time

FAST = 0.05
SLOW = 0.1
LONG = 0.1  # a torrent's wait, once it has lasted SETTLE seconds
SLOW_WATCHED = 0.2  # the supervisor's ceiling when serve is woken by its appends
RATE = 32 << 10  # bytes a second: 8 ranks x 10 lines/s is ~8 KiB/s, a busy node 100 KiB/s+
TORRENT = 1 << 20  # bytes a second
SETTLE = 1.0  # seconds a torrent lasts before its turns are LONG


class Pace:
    def __init__(self, fast: float = FAST, slow: float = SLOW, rate: float = RATE,
                 long: float = LONG, torrent: float = TORRENT, clock=time.monotonic):
        self.fast, self.slow, self.rate = fast, slow, rate
        self.long, self.torrent, self.clock = long, torrent, clock
        self.wait = fast
        self.torrent_since = None  # when the turns began to bring a torrent

    @property
    def batch(self) -> float:
        """The bytes a turn must bring to count as a flood: the rate over the last wait."""
        return self.rate * self.wait

    def after(self, nbytes: int) -> float:
        """The wait before the next turn, given the bytes this turn brought."""
        if nbytes >= self.torrent * self.wait:
            now = self.clock()
            if self.torrent_since is None:
                self.torrent_since = now
            self.wait = self.long if now - self.torrent_since >= SETTLE else self.fast
            return self.wait
        self.torrent_since = None
        if nbytes >= self.batch:
            self.wait = self.fast
        else:
            self.wait = min(self.slow, self.wait * 2)
        return self.wait
