"""Secrets are masked the same way on every path: longest first in one pass, with control
characters, as whole words when short, and across the pieces a long line is cut into."""

from __future__ import annotations

import io

from console.verbs.headless import HeadlessPrinter
from console.lines.lines import MAX_PARTIAL
from console.lines.sanitize import Masker, clean, secret_warnings
from console.model.state import RunState

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
    (warning,) = secret_warnings(["ab", "xyz", "long-enough-1"])
    assert "2 secret value(s) shorter than 8 characters" in warning
    assert secret_warnings(["long-enough-1"]) == []


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


PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
       "Zm9vYmFyYmF6cXV4cXV1eA==\nab12\n-----END PRIVATE KEY-----\n")


def test_a_multi_line_secret_is_masked_line_by_line():
    # a secret with a newline is never whole in one line: each of its lines of 8 characters
    # or more is masked on its own (shorter ones would mangle the log)
    state = state_with([PEM])
    feed(state, "key follows\n" + PEM + "done\n")
    lines = list(state.ranks[0].lines)
    assert lines == ["key follows", "****", "****", "****", "ab12", "****", "done"], lines
    assert clean("  Zm9vYmFyYmF6cXV4cXV1eA==  ", [PEM]) == "  ****  "


def test_a_block_scalar_secret_is_masked_without_its_trailing_newline():
    # `value: |` keeps a trailing "\n" that a printed line never holds
    secret = "blk-4f1e9a2c7d\n"
    state = state_with([secret])
    feed(state, "token=blk-4f1e9a2c7d\n")
    assert list(state.ranks[0].lines) == ["token=****"]
    assert clean("token=blk-4f1e9a2c7d", [secret]) == "token=****"


def test_multi_line_secrets_are_warned_about():
    (warning,) = secret_warnings([PEM, "one-line-secret-1", "trailing-newline-1\n"])
    assert "1 secret value(s) of several lines" in warning
    assert "each line of 8 characters or more" in warning
    assert secret_warnings([PEM, "ab"])[0].startswith("1 secret value(s) shorter")


def test_control_characters_and_c1_sequences_inside_a_secret_do_not_hide_it():
    # each is removed or shown as U+FFFD by clean(); the secret is found around them
    for shown in ("S3cr3t-\bValue-Zq9!",  # a backspace
                  "S3cr3t-\x9b31mValue-Zq9!",  # C1 CSI (one character)
                  "S3cr3t-\x1bPq#0;2;0;0;0\x1b\\Value-Zq9!",  # DCS ... ST
                  "S3cr3t-\x90payload\x9cValue-Zq9!",  # 8-bit DCS ... ST
                  "S3cr3t-\x1b]0;title\x07Val\x00ue-Zq9!",  # OSC, then a NUL
                  "S3cr3t-\x1b_app\x1b\\Value-Zq9!"):  # APC ... ST
        assert clean("key=%s ok" % shown, [SECRET]) == "key=**** ok", repr(shown)
    # a DCS's payload is no text to show either
    assert clean("a\x1bPpayload\x1b\\b") == "ab"
