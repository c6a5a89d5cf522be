"""The conformance command's bad input: one line on stderr, exit code 2. No vLLM needed: a
stand-in module plays the installed version."""

from __future__ import annotations

import sys
import types

import pytest
import vllm_conformance as conformance


def run(capsys, *argv):
    code = conformance.main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture
def installed_vllm(monkeypatch):
    def install(version):
        monkeypatch.setitem(
            sys.modules, "vllm", None if version is None else types.SimpleNamespace(__version__=version)
        )

    return install


def test_a_vllm_version_it_was_not_written_for_is_refused_naming_the_supported_one(capsys, installed_vllm):
    installed_vllm("0.32.0")
    code, err = run(capsys, "--case", "sharegpt")
    assert code == 2
    assert err == [
        "error: vllm 0.32.0 is not supported: this harness is written for vllm 0.33.0 (scripts/vllm_env.sh installs it)"
    ]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--max-steps", "0"], "error: --max-steps 0: give a number of steps >= 1"),
        (["--case", "sharegpt", "--set", "allocator.block_size=7"], "the case sets block_size for both sides"),
        (["--case", "sharegpt", "--set", "scheduler.chunked_prefill=false"], "sets chunked prefill (on on both"),
        (
            ["--case", "sharegpt", "--set", "allocator.watermark=1.5"],
            "allocator.watermark=1.5 must be < 1",
        ),  # the schema
    ],
)
def test_what_would_change_one_side_alone_or_cannot_run_is_refused_before_vllm_loads(
    capsys, installed_vllm, argv, said
):
    installed_vllm(None)  # refused before vLLM is imported (its import writes several lines to stderr)
    code, err = run(capsys, *argv)
    assert code == 2 and len(err) == 1 and said in err[0]


@pytest.mark.parametrize(
    "fraction, num_blocks, kept", [(0.1, 100, 10), (0.25, 121, 30), (0.3, 50, 15), (0.01, 2000, 20)]
)
def test_kvbench_keeps_as_many_blocks_free_as_vllms_watermark_of_a_pool_with_its_null_block(fraction, num_blocks, kept):
    from kvbench.plugins.allocators.block_pool import BlockPool

    case = conformance.Case("w", "", num_blocks=num_blocks, vllm_watermark=fraction)
    assert int(fraction * num_blocks) == kept  # vLLM's count, null block included
    assert BlockPool(num_blocks - 1, watermark=conformance.kvbench_watermark(case)).watermark_blocks == kept


def test_no_vllm_at_all_is_one_line_too(capsys, installed_vllm):
    installed_vllm(None)
    code, err = run(capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: vllm is not importable")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "sglang"], "error: unknown preset 'sglang'; known: vllm, none"),
        (["--case", "bogus"], "error: unknown case 'bogus'; known: sharegpt, sharegpt-prefix,"),
    ],
)
def test_an_unknown_preset_or_case_is_one_line_with_exit_code_2(capsys, installed_vllm, argv, message):
    installed_vllm("0.33.0")
    code, err = run(capsys, *argv)
    assert code == 2 and len(err) == 1 and err[0].startswith(message), err


def test_list_names_every_case(capsys):
    assert conformance.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in conformance.CASES)
