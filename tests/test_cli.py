"""The `bench` command as a user meets it: one run, its help, and one-line errors with exit code 2."""

import contextlib
import csv
import errno
import fcntl
import json
import os
import pty
import shlex
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from kvbench import cli
from kvbench.schema.docs import doc_of, schema_fields


def bench(tmp_path, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "kvbench.launch", *args, "progress=false"],  # the `bench` script's own entry
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_run_writes_one_row_with_identity_serving_and_environment_columns(tmp_path):
    result = bench(tmp_path, "+allocator=pow2", "workload.num_requests=30", "plots=auto")
    assert result.returncode == 0, result.stderr
    (metrics,) = tmp_path.glob("results/runs/*/metrics.csv")
    (row,) = csv.DictReader(metrics.open())
    identity = (row["scenario"], row["allocator"], row["model"], row["hardware"])
    assert identity == ("simulate", "pow2", "opt-13b", "a100-40gb")
    assert row["completed"] == "30" and row["status"] == "ok"
    assert not list(metrics.parent.glob("*.png"))  # plots=auto: only a sweep draws
    for column in (
        "kv_token_util",
        "normalized_latency_s_per_tok",
        "p99_ttft_ms",
        "median_tpot_ms",
        "kvbench_version",
        "git_sha",
        "torch",
        "device",
        "workload.num_requests",
    ):
        assert column in row


def test_a_row_records_the_values_the_run_read_not_their_spelling(tmp_path):
    (tmp_path / "timed.csv").write_text("arrival_s,input_len,output_len\n0.0,10,5\n0.5,20,6\n")
    result = bench(tmp_path, "seed=1e3", "workload=trace", f"workload.path={tmp_path / 'timed.csv'}", "plots=false")
    assert result.returncode == 0, result.stderr
    (metrics,) = tmp_path.glob("results/runs/*/metrics.csv")
    (row,) = csv.DictReader(metrics.open())
    assert row["seed"] == "1000"  # seed=1e3 ran as seed 1000, which a sweep's seed=1000 matches
    assert row["rate"] == ""  # the trace's own arrival times: workload.rate was not read


@pytest.mark.parametrize("timed", [False, True])
def test_serve_serves_a_short_trace_whole_and_records_a_rate_only_where_it_read_one(tmp_path, timed):
    """serve's scenario.num_requests=64 caps a trace, it does not ask 64 rows of a 3-row one;
    a trace's own arrival times are the arrivals, and then no rate is recorded."""
    header, times = (
        ("input_len,output_len,arrival_s", (",0", ",1", ",2")) if timed else ("input_len,output_len", ("",) * 3)
    )
    (tmp_path / "t.csv").write_text(header + "\n" + "".join(f"{10 + i},4{t}\n" for i, t in enumerate(times)))
    args = ["scenario=serve", "model=tiny", "workload=trace", f"workload.path={tmp_path / 't.csv'}", "plots=false"]
    result = bench(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    (metrics,) = tmp_path.glob("results/runs/*/metrics.csv")
    (row,) = csv.DictReader(metrics.open())
    assert row["requests"] == "3" and row["rate"] == ("" if timed else "inf")
    arrivals = [json.loads(line)["arrival_s"] for line in (metrics.parent / "requests.jsonl").open()]
    assert arrivals == ([0.0, 1.0, 2.0] if timed else [0.0] * 3)


def test_a_single_run_draws_its_kv_breakdown_beside_its_row_by_default(tmp_path):
    result = bench(tmp_path, "workload.num_requests=10", "workload.duration_s=null")
    assert result.returncode == 0, result.stderr
    (metrics,) = tmp_path.glob("results/runs/*/metrics.csv")
    assert (metrics.parent / "kv_breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one point's throughput and latency are the console table's numbers: no bar chart of them
    assert not (metrics.parent / "throughput_latency.png").exists()


def test_help_lists_the_groups_every_field_with_its_doc_and_the_launchers(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    section = result.stdout.split("== Config groups")[1].split("== Fields")[0]
    groups = dict(line.split(": ", 1) for line in section.splitlines() if ": " in line)
    assert {"contiguous", "oracle", "pow2", "paged"} <= set(groups["allocator"].split(", "))
    assert {"eager", "triton_paged", "flashinfer"} <= set(groups["backend"].split(", "))
    assert "a100-40gb" in groups["hardware"] and "opt-13b" in groups["model"]
    documented = {
        line.split()[0]: line
        for line in result.stdout.split("== Fields")[1].split("== Config ==")[0].splitlines()[1:]
        if line.strip()
    }
    assert "requests/s; inf = every request at t=0" in documented["workload.rate"]
    assert "tokens per block" in documented["allocator.block_size"]
    assert "at most this many tokens fed to the model in one step" in documented["scheduler.max_num_batched_tokens"]
    assert "int, >= 1, <= 256" in documented["allocator.block_size"]
    assert "int, >= 0, <= 4294967294 " in documented["seed"]  # exact where six digits would round it
    assert "  str or null  " in documented["report.baseline"]  # a | b unions are named, not "?"
    assert "  bool or auto  " in documented["plots"]  # and "or null" only where null is allowed
    assert not [key for key, line in documented.items() if " ? " in line]
    assert set(documented) == set(schema_fields())
    for launcher in ("hydra/launcher=joblib", "submitit_local", "submitit_slurm", "ray"):
        assert launcher in result.stdout


def test_help_documents_a_key_as_the_chosen_option_reads_it():
    """`bench --help workload=trace` gave ShareGPT's doc of workload.rate, which a trace with
    arrival times does not read."""
    from omegaconf import OmegaConf

    import kvbench.cli  # noqa: F401 (registers the help's resolver)

    def rate_doc(choices):
        text = OmegaConf.create({"hydra": {"runtime": {"choices": choices}}, "help": "${kvbench.field_docs:}"}).help
        return next(line for line in text.splitlines() if line.split()[0] == "workload.rate")

    assert "requests/s when the file has no arrival times" in rate_doc({"workload": "trace"})
    assert "requests/s; inf = every request at t=0 (then set num_requests)" in rate_doc({"workload": "sharegpt"})
    assert rate_doc({}) == rate_doc({"workload": "sharegpt", "hydra/launcher": "basic"})


def test_every_field_a_user_can_set_has_a_doc_line():
    undocumented = [key for key, same in schema_fields().items() if not doc_of(key, same)]
    assert undocumented == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["+allocator=bogus"], "error: unknown allocator 'bogus'; known: contiguous"),
        (["workload.rate=fast"], "error: workload.rate=fast must be a number"),
        (["+workload.rat=4"], "error: workload.rat is not a key of workload; did you mean workload.rate?"),
        (
            ["+allocator=paged", "allocator.prefix_caching=maybe"],
            "error: allocator.prefix_caching=maybe must be true or false",
        ),
        (["workload.burstiness=inf"], "error: workload.burstiness=inf must be a finite number"),
    ],
)
def test_bad_input_through_the_console_entry_point_is_one_line_with_exit_code_2(tmp_path, args, message):
    result = bench(tmp_path, *args, "workload.num_requests=5")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [result.stderr.strip()] and "Traceback" not in result.stderr
    assert result.stderr.startswith(message)


def test_an_error_after_a_progress_bar_starts_its_own_line(tmp_path):
    # the bar is drawn when the run starts (stderr a terminal: there is no bar in a pipe); the
    # engine then finds no prompt fits a step
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new one is 0 wide
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "scheduler.max_num_batched_tokens=10",
            "workload.num_requests=5",
            "progress=true",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=follower,
        timeout=120,
    )
    os.close(follower)
    said = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's last writer is gone
        while chunk := os.read(leader, 1 << 16):
            said += chunk
    os.close(leader)
    stderr = said.decode()
    assert result.returncode == 2
    assert "0/5" in stderr, stderr  # the bar was drawn
    last_line = stderr.replace("\r\n", "\n").rstrip("\n").split("\n")[-1]
    assert last_line.split("\r")[-1].startswith("error: a prompt of"), stderr


def test_two_runs_started_in_the_same_second_write_two_directories(tmp_path):
    start = [
        subprocess.Popen(
            [sys.executable, "-m", "kvbench.cli", "workload.num_requests=5", "progress=false"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in start] == [0, 0]
    runs = sorted(tmp_path.glob("results/runs/*/metrics.csv"))
    assert len(runs) == 2
    assert all(p.parent.name.rsplit("-", 1)[1].isdigit() for p in runs)  # <time>-<pid>: the pid tells them apart


def in_process(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    try:
        cli.main([*args, "progress=false"])
    finally:
        GlobalHydra.instance().clear()


def test_a_results_directory_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "results").write_text("not a directory")
    with pytest.raises(SystemExit) as exit_info:
        in_process(tmp_path, monkeypatch, "workload.num_requests=5")
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line.startswith("error: cannot use ") and "results" in line and "a file is where a directory should be" in line
    )


def test_ctrl_c_in_a_single_run_is_one_line_exit_130_and_leaves_no_result(tmp_path, monkeypatch, capsys):
    from kvbench.scenarios import run

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_point", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        in_process(tmp_path, monkeypatch, "workload.num_requests=5")
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted: the run wrote no result"]
    assert not list(tmp_path.glob("results/runs/*/metrics.csv"))


@pytest.mark.parametrize(
    "error, said",
    [
        (OSError(errno.EROFS, os.strerror(errno.EROFS)), "the file system is read-only"),
        # the chmod test below, for root too (whom a mode of 0555 does not stop)
        (PermissionError(errno.EACCES, os.strerror(errno.EACCES)), "permission denied"),
    ],
    ids=["read-only", "no-write-permission"],
)
def test_a_results_directory_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys, error, said):
    real_mkdir = os.mkdir

    def refused(path, *args, **kwargs):  # the test runs as root, whom chmod does not stop
        if "results" in str(path):
            raise type(error)(error.errno, error.strerror, str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused)
    with pytest.raises(SystemExit) as exit_info:
        in_process(tmp_path, monkeypatch, "workload.num_requests=5")
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "results" in line and said in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories (the test above covers it)")
def test_a_chmod_read_only_results_directory_is_one_line(tmp_path):
    (tmp_path / "results").mkdir(mode=0o555)
    result = bench(tmp_path, "workload.num_requests=5")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "permission denied" in result.stderr


def test_a_full_disk_when_writing_metrics_is_one_line(tmp_path, monkeypatch, capsys):
    real_replace = os.replace

    def full(src, dst, *args, **kwargs):
        if str(dst).endswith("metrics.csv"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(SystemExit) as exit_info:
        in_process(tmp_path, monkeypatch, "workload.num_requests=5")
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "metrics.csv" in line and "the disk is full" in line
    assert not list(tmp_path.rglob("*.tmp"))


def test_hydra_full_error_still_shows_hydra_s_traceback(tmp_path):
    result = bench(tmp_path, "workload.rat=4", env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert result.returncode == 1 and "Traceback" in result.stderr


def test_help_still_shows_where_a_plugin_name_does_not_resolve(tmp_path):
    """`+allocator.name=${oc.env:UNSET}` made --help an error: the help looks the name up to list
    a chosen plugin's options."""
    env = {k: v for k, v in os.environ.items() if k != "KVBENCH_UNSET_NAME"}
    result = bench(tmp_path, "+allocator.name=${oc.env:KVBENCH_UNSET_NAME}", "--help", env=env)
    assert result.returncode == 0 and "== Fields" in result.stdout, result.stderr


def readme_plugin_example() -> dict[str, str]:
    """The fenced blocks of the README's 'Adding a plugin' section, by language."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("### Adding a plugin")[1].split("\n## ")[0]
    blocks = {}
    for chunk in section.split("```")[1::2]:
        language, _, body = chunk.partition("\n")
        blocks.setdefault(language.strip(), body)
    return blocks


def test_the_readme_plugin_example_works_as_written(tmp_path):
    blocks = readme_plugin_example()
    site = tmp_path / "site"
    package = site / "my_package"
    (package / "conf" / "allocator").mkdir(parents=True)
    (package / "__init__.py").write_text(blocks["python"])
    (package / "conf" / "__init__.py").write_text("")
    (package / "conf" / "allocator" / "mine.yaml").write_text(blocks["yaml"])
    dist = site / "my_package-0.1.dist-info"  # what `pip install` of the package would leave
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my_package\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(  # the toml table as pip writes it
        blocks["toml"].replace("[project.entry-points.kvbench]", "[kvbench]").replace('"', "")
    )
    command = shlex.split(blocks["bash"].strip())
    assert command[0] == "bench"
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = bench(tmp_path, *command[1:], "workload.num_requests=10", "hydra.run.dir=run", env=env)
    assert result.returncode == 0, result.stderr
    (row,) = csv.DictReader((tmp_path / "run" / "metrics.csv").open())
    assert row["allocator"] == "mine" and row["status"] == "ok" and row["allocator.spare_blocks"] == "4"
    yaml_set = [arg for arg in command[1:] if not arg.startswith("allocator.spare_blocks=")]
    result = bench(tmp_path, *yaml_set, "workload.num_requests=10", "hydra.run.dir=yaml", env=env)
    (row,) = csv.DictReader((tmp_path / "yaml" / "metrics.csv").open())
    assert row["allocator.spare_blocks"] == "2"  # its YAML's value is a column too, not left unsaid

    result = bench(tmp_path, *yaml_set, "--help", env=env)
    groups = result.stdout.split("== Config groups")[1].split("== Fields")[0]
    assert "allocator: contiguous, hybrid, mine, oracle, paged, pow2\n" in groups
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("  allocator.spare_blocks ")]
    assert " ".join(line.split()[1:]) == "int, >= 0, <= 64 blocks kept back from the pool for late arrivals"

    result = bench(tmp_path, *yaml_set, "allocator.spare_blocks=65", "workload.num_requests=10", env=env)
    assert result.returncode == 2 and "spare_blocks" in result.stderr and "64" in result.stderr

    result = bench(tmp_path, *command[1:], "+allocator.spares=1", "workload.num_requests=10", env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: allocator mine has no option 'spares'; did you mean spare_blocks? "
        "(it accepts: block_size, spare_blocks, watermark, prefix_caching)"
    ]


def composed(tmp_path, monkeypatch, *args) -> tuple[list[str], list[str]]:
    """The run modes Hydra composed a config for, and the one it ran (run or multirun, not run:
    the experiment below would take minutes)."""
    from hydra._internal.hydra import Hydra

    modes, ran = [], []
    compose = Hydra.compose_config

    def counted(self, *a, **kw):
        modes.append(str(kw.get("run_mode")))
        return compose(self, *a, **kw)

    monkeypatch.setattr(Hydra, "compose_config", counted)
    monkeypatch.setattr(Hydra, "multirun", lambda self, **kw: ran.append("multirun"))
    in_process(tmp_path, monkeypatch, *args)
    return modes, ran


def test_a_plain_run_composes_its_config_once(tmp_path, monkeypatch):
    modes, ran = composed(tmp_path, monkeypatch, "workload.num_requests=5", "plots=false")
    assert modes == ["RunMode.RUN"] and ran == []  # Hydra's get_mode would have composed one more
    assert list(tmp_path.glob("results/runs/*/metrics.csv"))


def test_an_experiment_still_takes_its_sweep_mode_from_its_config(tmp_path, monkeypatch):
    modes, ran = composed(tmp_path, monkeypatch, "+experiment=fig2")
    assert modes == ["RunMode.MULTIRUN"] and ran == ["multirun"]  # get_mode read hydra.mode from fig2.yaml


@pytest.mark.parametrize(
    "args, skipped",
    [
        (["model=tiny", "+allocator=paged", "workload.rate=4", "hydra/launcher=joblib", "hydra.run.dir=x"], True),
        (["-m", "+experiment=fig2"], True),  # -m: the mode is MULTIRUN whatever the config says
        (["+experiment=fig2"], False),
        (["hydra.mode=MULTIRUN"], False),
        (["hydra.searchpath=[file:///plugins]"], False),
        (["+allocator=third_party"], False),  # a plugin's YAML, which might set the mode
        (["--config-name", "other"], False),
    ],
)
def test_the_mode_composition_is_skipped_only_where_no_config_can_set_the_mode(args, skipped):
    from hydra._internal.utils import get_args_parser

    assert cli.mode_is_the_command_lines(get_args_parser().parse_args(args)) is skipped


def test_a_sweep_composes_each_points_config_once_and_still_checks_every_point_first(tmp_path, monkeypatch, capsys):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.plugins.sweeper import Sweeper

    composed, compose, check = [], ConfigLoaderImpl.load_sweep_config, Sweeper.validate_batch_is_legal

    def counted(self, master_config, sweep_overrides):
        composed.append(tuple(sweep_overrides))
        return compose(self, master_config, sweep_overrides)

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", counted)
    sweep = ["-m", "+allocator=contiguous,paged", "workload.num_requests=5", "plots=false"]
    in_process(tmp_path, monkeypatch, *sweep, "hydra.sweep.dir=good")
    assert len(composed) == len(set(composed)) == 2  # Hydra's check, then its launcher: 4 without the hand-over
    assert sorted(p.parent.name for p in (tmp_path / "good").glob("*/metrics.csv")) == [
        "+allocator=contiguous,workload.num_requests=5",
        "+allocator=paged,workload.num_requests=5",
    ]
    assert ConfigLoaderImpl.load_sweep_config is counted and Sweeper.validate_batch_is_legal is check  # undone

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # the bad point is last: no point may run before the check
        in_process(
            tmp_path,
            monkeypatch,
            "-m",
            "+allocator=paged,nonexistent",
            "workload.num_requests=5",
            "hydra.sweep.dir=bad",
        )
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unknown allocator 'nonexistent'; known: contiguous, hybrid, oracle, paged, pow2"
    ]
    assert not list((tmp_path / "bad").glob("*/metrics.csv"))


def test_every_command_s_version_is_kvbench_s(capsys):
    import kvbench
    from kvbench.reporting import compare, report

    cli.main(["--version"])  # Hydra's own flag printed only "Hydra 1.3.8"
    assert capsys.readouterr().out.startswith(f"kvbench {kvbench.__version__} (Hydra ")
    for command in (compare.main, report.main):
        with pytest.raises(SystemExit) as exit_info:
            command(["--version"])
        assert exit_info.value.code == 0
        assert capsys.readouterr().out == f"kvbench {kvbench.__version__}\n"
