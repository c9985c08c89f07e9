"""The host's masking of secrets in log data before it enters the journal (agent/rules/mask.py)."""

from agent.torchrun.cause import masked
from agent.rules.mask import Masker


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


PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
       "Zm9vYmFyYmF6cXV4cXV1eA==\nab12\n-----END PRIVATE KEY-----\n")


def test_a_multi_line_secret_is_masked_line_by_line_in_any_record():
    # a record holds whole lines: all of a multi-line secret, or only some of its lines
    m = Masker([PEM])
    data = ("key follows\n" + PEM + "done\n").encode()
    assert m.mask(data) == b"key follows\n****\ndone\n"
    part = PEM.split("\n", 2)[2].encode() + b"done\n"  # from its third line on
    assert m.mask(part) == b"****\nab12\n****\ndone\n"  # lines under 8 characters stay


def test_a_block_scalar_secret_is_masked_without_its_trailing_newline():
    m = Masker(["blk-4f1e9a2c7d\n"])
    assert m.mask(b"token=blk-4f1e9a2c7d, next\n") == b"token=****, next\n"


def test_escape_sequences_and_control_characters_inside_a_secret_do_not_hide_it():
    m = Masker(["S3cr3t-Value-Zq9!"])
    for shown in (b"S3cr3t-\x1b[31mValue-Zq9!\x1b[0m",  # a colour code
                  b"S3cr3t-\bValue-Zq9!",  # a backspace
                  b"S3cr3t-\xc2\x9b31mValue-Zq9!",  # C1 CSI, as UTF-8
                  b"S3cr3t-\x1bPpayload\x1b\\Value-Zq9!"):  # DCS ... ST
        assert m.mask(b"key=" + shown + b" ok\n") in (b"key=**** ok\n",
                                                      b"key=****\x1b[0m ok\n"), shown
    # the escapes of other text stay as written
    assert m.mask(b"\x1b[1mbold\x1b[0m S3cr3t-Value-Zq9!\n") == b"\x1b[1mbold\x1b[0m ****\n"


def test_safe_cut_never_splits_a_secret():
    m = Masker(["S3cr3t-Value-Zq9!"])
    data = b"y" * 100 + b"S3cr3t-Value-Zq9!" + b"z" * 20
    assert m.safe_cut(data, 105) == 100  # whole, across the cut: before it
    assert m.safe_cut(data, 100) == 100 and m.safe_cut(data, 130) == 130
    begun = b"y" * 100 + b"S3cr3t-Va"  # may go on in what follows: kept back
    assert m.safe_cut(begun, len(begun)) == 100
    assert Masker([]).safe_cut(begun, len(begun)) == len(begun)
