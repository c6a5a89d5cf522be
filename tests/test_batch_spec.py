"""The kernel scenario's batch-spec grammar: counts, lengths, k suffixes, mixes and windows."""

import pytest

from kvbench.errors import UserError
from kvbench.scenarios.batch_spec import parse


def test_decodes_at_one_k_context():
    spec = parse("32d1k")
    assert spec.num_seqs == 32 and spec.seq_lens == [1024] * 32
    assert spec.num_tokens == 32  # one query token per decode
    assert spec.kv_tokens == 32 * 1024
    assert spec.is_decode_only and spec.window == 0


def test_prefills_and_decodes_mixed():
    spec = parse("2p512+16d2k")
    assert spec.seq_lens == [512, 512] + [2048] * 16
    assert spec.query_lens == [512, 512] + [1] * 16
    assert spec.num_tokens == 2 * 512 + 16
    assert spec.kv_tokens == 2 * 512 + 16 * 2048
    assert not spec.is_decode_only


def test_window_and_k_counts():
    spec = parse("8d4k:w512")
    assert spec.window == 512 and spec.seq_lens == [4096] * 8
    assert parse("1kd16").num_seqs == 1024
    assert parse(" 4d1k ").text == "4d1k"


@pytest.mark.parametrize(
    "text, bad",
    [
        ("32x1k", "'32x1k'"),  # unknown kind
        ("2p512+16d", "'16d'"),  # missing length
        ("2p512++4d8", "''"),  # empty part
        ("4d1m", "'4d1m'"),  # unknown suffix
        ("0d128", "'0d128'"),  # zero count
        ("4d128:512", "'512'"),  # window without w
        ("4d128:w0", "'w0'"),  # zero window
    ],
)
def test_malformed_spec_names_the_bad_part(text, bad):
    with pytest.raises(UserError) as err:
        parse(text)
    message = str(err.value)
    assert bad in message and "\n" not in message
    assert f"batch={text!r}" in message
