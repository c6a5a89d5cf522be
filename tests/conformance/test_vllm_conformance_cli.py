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
