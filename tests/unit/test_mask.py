"""Secrets are masked the same way on every path: longest first in one pass, with control
characters, as whole words when short, and across the pieces a long line is cut into."""

from __future__ import annotations

import io

from console.headless import HeadlessPrinter
from console.lines import MAX_PARTIAL
from console.sanitize import Masker, clean, short_secret_warning
from console.state import RunState

SECRET = "S3cr3t-Value-Zq9!"


def state_with(secrets) -> RunState:
    state = RunState("r1", [("node0", "127.0.0.2")])
    state.masker = Masker(secrets)
    state.apply_records("node0", [[{"k": "file", "f": 1, "rank": 0, "local_rank": 0,
                                    "stream": "stdout", "path": "x"}]], 10)
    return state


def feed(state: RunState, *pieces: str) -> None:
    for i, text in enumerate(pieces):
        state.apply_records("node0", [[{"k": "data", "f": 1, "j": 100 + i, "ts": 1.0}, text]],
                            200 + i)


def test_a_secret_that_contains_another_is_masked_whole():
    # alphabetical order used to mask `abcdefgh` first and leave `****123`
    assert clean("token=abcdefgh123 end", ["abcdefgh", "abcdefgh123"]) == "token=**** end"
    assert clean("token=abcdefgh123 end", ["abcdefgh123", "abcdefgh"]) == "token=**** end"


def test_a_secret_with_a_control_character_is_masked():
    secret = "pass\x01word-42"
    assert clean("key=%s ok" % secret, [secret]) == "key=**** ok"


def test_a_secret_split_by_an_escape_sequence_is_masked():
    assert clean("key=S3cr3t-\x1b[1mValue-Zq9! ok", [SECRET]) == "key=**** ok"


def test_a_short_secret_is_masked_only_as_a_whole_word():
    shown = clean("ab x=ab abc cab ab.", ["ab"])
    assert shown == "**** x=**** abc cab ****."
    assert "2 secret value(s)" in short_secret_warning(["ab", "xyz", "long-enough-1"])
    assert short_secret_warning(["long-enough-1"]) is None


def test_safe_cut_never_splits_a_secret():
    masker = Masker([SECRET, "another-secret-longer-one"])
    text = "y" * 100 + SECRET[:9]  # the secret may go on in the next piece: keep it back
    assert masker.safe_cut(text) <= 100
    whole = "y" * 100 + SECRET + "z" * 20  # the plain cut would fall inside it
    assert masker.safe_cut(whole) == 100


def test_a_secret_across_two_writes_of_one_line_never_shows():
    state = state_with([SECRET])
    out = io.StringIO()
    HeadlessPrinter(state, out=out, colour=False, secrets=[SECRET])
    feed(state, "step 1 key=" + SECRET[:6], SECRET[6:] + " done\n")
    shown = out.getvalue()
    assert "key=**** done" in shown, shown
    assert SECRET[6:] not in shown and SECRET[:6] not in shown
    assert list(state.ranks[0].lines) == ["step 1 key=**** done"]  # kept masked in memory


def test_a_secret_across_two_64k_pieces_of_one_line_never_shows():
    # a line with no end in sight is passed on in pieces; the cut fell inside the secret
    # and the second piece began with its tail
    state = state_with([SECRET])
    out = io.StringIO()
    HeadlessPrinter(state, out=out, colour=False, secrets=[SECRET])
    feed(state, "x" * (MAX_PARTIAL - 5) + SECRET[:10], SECRET[10:] + " tail\n")
    kept = list(state.ranks[0].lines)
    assert len(kept) == 2
    for line in kept:
        assert SECRET[10:] not in line and SECRET[:10] not in line, line[-40:]
    assert kept[1].endswith("**** tail"), kept[1][-40:]
    assert SECRET[10:] not in out.getvalue()


def test_causes_and_event_texts_are_masked():
    state = state_with([SECRET])
    state.apply_records("node0", [[{"k": "event", "what": "ended", "state": "failed",
                                    "exit_code": 1, "ts": 2.0,
                                    "cause": {"message": "KeyError: '%s'" % SECRET}}]], 300)
    assert state.nodes["node0"].cause == "KeyError: '****'"
    assert SECRET not in str(state.status())
    assert all(SECRET not in ev.text for ev in state.events)
    state.set_node("node0", "unreachable", "agent said " + SECRET)
    assert state.nodes["node0"].cause == "agent said ****"
