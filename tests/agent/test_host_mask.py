"""The host's masking of secrets in log data before it enters the journal (agent/mask.py)."""

from agent.cause import masked
from agent.mask import Masker


def test_longest_first_in_one_pass():
    m = Masker(["abcdefgh", "abcdefgh123456"])
    assert m.mask(b"key=abcdefgh123456 and abcdefgh.") == b"key=**** and ****."


def test_a_short_secret_is_masked_only_as_a_whole_word():
    m = Masker(["ab1"])
    assert m.mask(b"ab1 cab1d (ab1)") == b"**** cab1d (****)"


def test_bytes_that_are_not_utf8_pass_through():
    m = Masker(["s3cr3t-value"])
    assert m.mask(b"\xff\xfe s3cr3t-value \xff") == b"\xff\xfe **** \xff"


def test_no_secrets_is_the_identity():
    assert Masker([]).mask(b"plain") == b"plain"
    assert Masker([""]).mask(b"x") == b"x"


def test_causes_use_the_same_rules():
    assert masked("RuntimeError: rejected tok-123456789 (tok)", ["tok-123456789", "tok"]) \
        == "RuntimeError: rejected **** (****)"
