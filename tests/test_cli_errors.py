"""A mistake on the command line is one clear line and a non-zero exit, whatever the entry point;
never a traceback, and the plain arm of ``ab`` never fails on autoproxy's options."""
import os
import subprocess
import sys

import pytest


def _cli(*args, **env_extra):
    env = dict(os.environ)
    env.pop("DALI_AUTOPROXY", None)
    env.update(env_extra)
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, env=env)


ENTRY_POINTS = {
    "run": lambda *a: [sys.executable, "-m", "dali_autoproxy.tools.cli", "run", *a],
    "python -m": lambda *a: [sys.executable, "-m", "dali_autoproxy", *a],
    "ab": lambda *a: [sys.executable, "-m", "dali_autoproxy.tools.cli", "ab", "--batches", "2", *a],
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_missing_script_is_one_line(entry, tmp_path):
    res = _cli(*ENTRY_POINTS[entry](str(tmp_path / "nosuch.py")))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [f"dali-autoproxy: error: no such script: {tmp_path / 'nosuch.py'}"]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_bad_option_variable_is_one_line(entry, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    res = _cli(*ENTRY_POINTS[entry](str(script)), DALI_AUTOPROXY_DEVICE="quantum")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "ran" not in res.stdout, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "DALI_AUTOPROXY_DEVICE='quantum'" in lines[0], lines


def test_help_texts_are_plain():
    top = _cli(sys.executable, "-m", "dali_autoproxy.tools.cli", "--help")
    assert top.returncode == 0 and "``" not in top.stdout
    demo = _cli(sys.executable, "-m", "dali_autoproxy.tools.cli", "demo", "--help")
    for option in ("--images", "--epochs", "--workers", "--repeat", "--cache", "--json", "--plot"):
        line = next(ln for ln in demo.stdout.splitlines() if ln.strip().startswith(option))
        assert len(line.split()) > 2 or option in ("--json", "--plot"), line  # a help text follows
    assert "generated dataset" in demo.stdout and "JSON" in demo.stdout


def test_corpus_script_runs(tmp_path):
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    res = _cli(sys.executable, os.path.join(bench, "corpus.py"), str(tmp_path / "c"), "--images", "12",
               "--classes", "3")
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(list((tmp_path / "c").rglob("*.jpg"))) == 12 and "'images': 12" in res.stdout


def test_print_report_says_when_not_enabled(capsys):
    import dali_autoproxy
    dali_autoproxy.disable()
    if not dali_autoproxy.report():
        dali_autoproxy.print_report()
        assert "not enabled" in capsys.readouterr().out
    dali_autoproxy.enable(device="cpu", log_level="ERROR")
    from dali_autoproxy.main.report import format_report
    assert "not enabled" not in format_report([])


@pytest.mark.parametrize("argv,expected", [
    (["--batches", "0"], "--batches: '0' is not a whole number of at least 1"),
    (["--batches", "-5"], "--batches: '-5' is not a whole number of at least 1"),
    (["--seconds", "0"], "--seconds: '0' is not a number of seconds above 0"),
    (["--repeat", "0"], "--repeat: '0' is not a whole number of at least 1"),
    (["--warmup", "-1"], "--warmup: '-1' is not a whole number of at least 0"),
])
def test_ab_numbers_out_of_range_are_refused_before_any_arm(argv, expected, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    res = _cli(sys.executable, "-m", "dali_autoproxy.tools.cli", "ab", *argv, str(script))
    assert res.returncode == 2 and "ran" not in res.stdout and expected in res.stderr, res.stderr


def test_ab_without_a_script_says_a_script_is_needed():
    res = _cli(sys.executable, "-m", "dali_autoproxy.tools.cli", "ab", "--batches", "3")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "error: the following arguments are required: script" in res.stderr.strip().splitlines()[-1]


def test_help_says_what_each_argument_does():
    """The script is required (not ``[script]``), the defaults are shown, --batches says it counts
    the warm-up, and ``run`` describes its arguments."""
    ab = _cli(sys.executable, "-m", "dali_autoproxy.tools.cli", "ab", "--help").stdout
    assert "script ..." in ab and "[script]" not in ab
    flat = " ".join(ab.split())
    assert "(default: 5)" in flat and "the warm-up included" in flat and "(default: 1)" in flat
    run = " ".join(_cli(sys.executable, "-m", "dali_autoproxy.tools.cli", "run", "--help").stdout.split())
    assert "run as __main__ with autoproxy enabled" in run and "the script's own arguments" in run


def test_a_bad_triton_switch_is_an_error_naming_the_variable(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    res = _cli(*ENTRY_POINTS["run"](str(script)), DALI_AUTOPROXY_TRITON="maybe")
    assert res.returncode == 2 and "DALI_AUTOPROXY_TRITON='maybe'; accepted values: 1, 0" in res.stderr, res.stderr
