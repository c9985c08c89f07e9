"""agent/host/pace.py: the agent's polling loops turn fast in a flood and slow down in a trickle."""

from math import ceil

from agent.host.pace import FAST, RATE, SLOW, Pace


def test_a_trickle_backs_off_to_slow_and_a_flood_turns_fast_again():
    pace = Pace()
    trickle = int(RATE * FAST / 10)  # a tenth of the flood rate, whatever the wait
    waits = [pace.after(trickle) for _ in range(6)]
    assert waits[0] == 2 * FAST and waits == sorted(waits)
    assert waits[-1] == SLOW and max(waits) == SLOW
    assert pace.after(ceil(RATE * SLOW)) == FAST  # the flood rate over the last wait: fast
    assert pace.after(ceil(RATE * FAST)) == FAST  # and it stays fast while the rate holds
    assert pace.after(0) == 2 * FAST


def test_the_flood_rate_is_bytes_per_second_not_per_turn():
    pace = Pace()
    for _ in range(5):
        pace.after(0)
    assert pace.wait == SLOW
    assert pace.after(int(RATE * FAST)) == SLOW  # FAST worth of the rate in a SLOW turn: slow
    assert pace.after(ceil(RATE * SLOW)) == FAST


def test_silence_never_waits_longer_than_slow():
    pace = Pace()
    assert max(pace.after(0) for _ in range(100)) == SLOW


def test_a_torrent_that_lasts_is_read_less_often_and_a_flood_below_it_never():
    from agent.host.pace import LONG, SETTLE, TORRENT
    clock = type("Clock", (), {"now": 100.0, "__call__": lambda self: self.now})()
    pace = Pace(clock=clock)
    torrent = lambda: ceil(TORRENT * pace.wait)  # noqa: E731 - the torrent's rate, whatever the wait
    assert pace.after(torrent()) == FAST  # its first turns: fast, as any flood
    clock.now += SETTLE / 2
    assert pace.after(torrent()) == FAST
    clock.now += SETTLE / 2
    assert pace.after(torrent()) == LONG > FAST  # it has lasted: every LONG
    clock.now += 1
    assert pace.after(torrent()) == LONG  # the torrent's rate over a LONG wait: still one
    assert pace.after(ceil(RATE * pace.wait)) == FAST  # it ebbs to a flood: fast at once
    clock.now += 1
    assert pace.after(torrent()) == FAST  # a new torrent waits out SETTLE again
    below = Pace(clock=clock)  # a flood just under the torrent's rate, however long
    for _ in range(50):
        clock.now += FAST
        assert below.after(int(TORRENT * below.wait) - 1) == FAST
