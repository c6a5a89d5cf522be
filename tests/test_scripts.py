"""The scripts users run from scripts/: bad input is one line and exit code 2 before any work,
and nothing a user already has is removed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def run(*command, stdin: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(list(map(str, command)), capture_output=True, text=True, input=stdin, timeout=120, cwd=cwd)


@pytest.mark.parametrize(
    "script, args, said",
    [
        ("preemption_sweep.py", ["--out", "{file}/p.csv"], "--out's folder"),
        ("preemption_sweep.py", ["--out", "{tmp}/sub/"], "--out {tmp}/sub/ is a folder: give a file name"),
        ("preemption_sweep.py", ["--out", "/proc/p.csv"], "--out's folder /proc is not writable"),  # after the sweep
        ("hybrid_compare.py", ["--out", "{file}/sub", "--requests", "4"], "--out {file}/sub cannot be made a folder"),
        ("bench_simulator.py", ["--allocators", "nope"], "unknown allocator 'nope'"),
        ("bench_simulator.py", ["--requests", "0"], "workload.num_requests=0 must be >= 1"),
        ("gpu_figures.py", ["{tmp}/missing", "{tmp}/out"], "is not a folder"),
        ("gate_trials.py", ["--out", "{table}"], "--out {table} is not a trials CSV"),  # rows would skew
        ("gate_trials.py", ["--trials", "0"], "--trials 0: give at least 1"),
        ("gate_trials.py", ["--out", ""], "--out is empty"),  # not the current folder
        ("hybrid_compare.py", ["--out", "", "--requests", "4"], "--out is empty"),
        ("gpu_figures.py", ["{tmp}", "{tmp}/out"], "holds none of kernel/, flashinfer/, graphs/"),
        ("gpu_figures.py", ["", "{tmp}/out"], "WORK_DIR is empty"),
        ("bench_simulator.py", ["--allocators", "paged,paged"], "give each allocator once"),
        ("bench_simulator.py", ["--allocators", "paged,nope"], "unknown allocator 'nope'"),  # before paged runs
        ("bench_nano.py", ["--nano-vllm", "{tmp}", "--block-size", "16,1"], "every value must be in 2..256"),
        ("bench_nano.py", ["--nano-vllm", "{tmp}", "--csv", "{tmp}"], "--csv {tmp} is a folder"),
        ("bench_step.py", ["--cases", "nope"], "--cases: unknown nope"),
        ("vllm_conformance.py", ["--json", "{file}/r.json"], "--json {file}/r.json: give a file name"),
        ("vllm_conformance.py", ["--set", "~engine"], "~engine deletes a section every run reads"),  # no vLLM needed
        ("vllm_conformance.py", ["--set", "engine=5"], "engine=5 must be a section"),
        ("vllm_conformance.py", ["--set", "workload.rate=-1"], "workload.rate=-1 must be > 0"),
        ("bench_nano.py", ["--nano-vllm", "{tmp}"], "--nano-vllm {tmp}: no nanovllm/engine/scheduler.py there"),
        ("bench_nano.py", ["--nano-vllm", "{tmp}", "--n", "64,0"], "--n 64,0: every value must be >= 1"),
        ("gate_trials.py", ["--slowdown", "nan"], "--slowdown nan: give a fraction >= 0"),  # an A/B started
        ("gate_trials.py", ["--slowdown", "-2"], "--slowdown -2.0: give a fraction >= 0"),
    ],
)
def test_a_script_refuses_what_it_cannot_do_before_it_computes(tmp_path, script, args, said):
    file, table = tmp_path / "afile", tmp_path / "other.csv"
    file.write_text("")
    table.write_text("allocator,request_throughput\npaged,2.1\n")
    fill = lambda text: text.format(file=file, tmp=tmp_path, table=table)  # noqa: E731
    result = run(sys.executable, SCRIPTS / script, *map(fill, args))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert fill(said) in result.stderr.strip().splitlines()[-1]
    assert table.read_text() == "allocator,request_throughput\npaged,2.1\n"


@pytest.mark.parametrize(
    "script",
    [
        "bench_nano.py",
        "bench_simulator.py",
        "bench_step.py",
        "gate_trials.py",
        "gpu_figures.py",
        "hybrid_compare.py",
        "preemption_sweep.py",
        "vllm_conformance.py",
    ],
)
def test_a_script_s_usage_error_is_one_line(script):
    result = run(sys.executable, SCRIPTS / script, "--no-such-flag")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()  # no usage block above it
    assert line.startswith(f"error: {script}: ") and line.endswith(f"(see {script} --help)")


def test_gpu_figures_says_what_did_not_finish_when_no_sweep_did(tmp_path):
    for sweep in ("kernel", "graphs"):  # gpu_check.sh made them; no point finished
        (tmp_path / sweep).mkdir()
    result = run(sys.executable, SCRIPTS / "gpu_figures.py", tmp_path, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "no triton_paged point finished" in result.stdout and "no serve point finished" in result.stdout


def test_gpu_figures_checks_its_tables_before_it_writes(tmp_path):
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "summary.csv").write_text("status,x\nok,1\n")
    result = run(sys.executable, SCRIPTS / "gpu_figures.py", tmp_path, tmp_path / "afile")
    assert result.returncode == 2 and "graphs/summary.csv lacks column(s) requests, graph" in result.stderr
    (tmp_path / "afile").write_text("")
    (tmp_path / "graphs" / "summary.csv").write_text("status,requests,graph\nok,4,eager\n")
    result = run(sys.executable, SCRIPTS / "gpu_figures.py", tmp_path, tmp_path / "afile")
    assert result.returncode == 2 and f"OUT_DIR {tmp_path / 'afile'} cannot be made a folder" in result.stderr
    result = run(sys.executable, SCRIPTS / "gpu_figures.py", tmp_path, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "batch   4 eager" in result.stdout and (tmp_path / "out" / "graphs.csv").is_file()


def test_gpu_check_says_its_usage_and_refuses_what_it_does_not_know(tmp_path):
    usage = run("bash", SCRIPTS / "gpu_check.sh", "--help")
    assert usage.returncode == 0 and "scripts/gpu_check.sh --cpu" in usage.stdout
    unknown = run("bash", SCRIPTS / "gpu_check.sh", "--nope")
    assert unknown.returncode == 2 and "unknown argument '--nope'" in unknown.stderr
    (tmp_path / "afile").write_text("")
    blocked = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--cpu"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "afile" / "sub")},
        timeout=60,
    )
    assert blocked.returncode == 2 and "cannot write results into OUT=" in blocked.stderr
    # a python without kvbench: every stage said it finished nothing, then a traceback
    bare = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--cpu"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": "/usr/bin/python3"},
        timeout=60,
    )
    assert bare.returncode == 2 and "cannot import kvbench: set PYTHON=" in bare.stderr


def test_vllm_env_never_removes_a_folder_that_is_not_its_environment(tmp_path):
    kept = tmp_path / "results" / "run.csv"
    kept.parent.mkdir()
    kept.write_text("precious\n")
    result = run("bash", SCRIPTS / "vllm_env.sh", "results", cwd=tmp_path)  # relative to the caller
    assert result.returncode == 2 and "is not a virtual environment" in result.stderr
    assert kept.read_text() == "precious\n"
    # another virtual environment (kvbench's own .venv) was removed and rebuilt as vLLM's
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "venv" / "mine").write_text("kept\n")
    result = run("bash", SCRIPTS / "vllm_env.sh", "venv", cwd=tmp_path)
    assert result.returncode == 2 and "is a virtual environment this script did not build" in result.stderr
    assert (tmp_path / "venv" / "mine").read_text() == "kept\n"
    result = run("bash", SCRIPTS / "vllm_env.sh", "--help", cwd=tmp_path)  # it built a venv named --help
    assert result.returncode == 0 and result.stdout.startswith("usage: scripts/vllm_env.sh [DIR]")
    assert not (tmp_path / "--help").exists()


@pytest.mark.parametrize("message", ["garbage", '{"nojob": 1}', '{"job": "bogus"}'])
def test_the_helper_ends_on_a_message_it_cannot_read_instead_of_waiting(message):
    result = run(sys.executable, "-m", "kvbench.reporting.helper", "run", stdin=message + "\n")
    assert result.returncode == 1 and "a message it cannot read" in result.stderr


def test_bench_steps_instruction_count_of_a_simulated_loop_is_exact_and_per_step():
    """`bench_step.py --opcodes --cases sim` compares two trees by the bytecode instructions of a
    simulated run's loop, per step: the figure stands for the code only if the same tree counts
    the same twice; and it is per step (hundreds of instructions), not the run's total."""
    counts = [run(sys.executable, SCRIPTS / "bench_step.py", "--worker", ROOT, f"simloop:{n}") for n in (30, 30, 60)]
    assert all(c.returncode == 0 for c in counts), counts[0].stderr
    first, again, longer = (float(c.stdout) for c in counts)
    assert first == again
    assert 300 < first < 5000 and 300 < longer < 5000  # a total would be 10^5 or more, twice that at 60


def test_hybrid_compare_s_figure_names_the_prompt_lengths_it_ran():
    sys.path.insert(0, str(SCRIPTS))
    try:
        from hybrid_compare import lengths
    finally:
        sys.path.remove(str(SCRIPTS))
    assert lengths(16384) == "8k-24k" and lengths(2048) == "1k-3k" and lengths(2000) == "1000-3000"


def test_gate_trials_keeps_the_finished_trials_when_stopped_and_heads_an_empty_file(tmp_path, monkeypatch):
    """Ctrl-C in the third trial lost the two finished ones (minutes each); an empty --out file
    got rows with no header, which the next run refused as "not a trials CSV"."""
    import importlib.util

    monkeypatch.syspath_prepend(str(SCRIPTS))  # its script_checks, as running it from scripts/ finds it
    spec = importlib.util.spec_from_file_location("gate_trials", SCRIPTS / "gate_trials.py")
    gate_trials = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate_trials)
    calls = []

    def trial(*args):
        calls.append(args)
        if len(calls) == 3:  # Ctrl-C in the third trial
            raise KeyboardInterrupt
        return dict.fromkeys(gate_trials.COLUMNS, 0)

    out = tmp_path / "trials.csv"
    out.write_text("")
    monkeypatch.setattr(gate_trials, "trial", trial)
    monkeypatch.setattr(sys, "argv", ["gate_trials.py", "--trials", "5", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        gate_trials.main()
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(gate_trials.COLUMNS) and len(lines) == 3  # the header and the two trials
    gate_trials.appendable(out)  # a trials CSV: the next run appends to it
