"""The README's commands are what CI runs."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_readme_commands():
    readme = open(os.path.join(ROOT, "README.md")).read()
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    install, run_tests = test_cmd.rsplit(" && ", 1)
    assert install in ci and re.search(rf"^{re.escape(run_tests)}$", ci, re.M)


def test_wheel_ships_the_startup_hook(tmp_path):
    """A normal (non-editable) install gets dali_autoproxy.pth at site-packages' root."""
    import subprocess
    import sys
    import zipfile
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), ROOT], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel = next(tmp_path.glob("dali_autoproxy-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "dali_autoproxy.pth" in names
    package = os.path.join(ROOT, "dali_autoproxy")
    sources = {os.path.relpath(os.path.join(d, f), ROOT) for d, _, files in os.walk(package)
               for f in files if f.endswith(".py")}
    assert sources and sources <= set(names), sorted(sources - set(names))  # every subpackage ships


def test_every_results_file_records_its_commit_or_is_listed_without_one():
    """A figure a user reads names the code it measured: each results file records its commit (a
    JSON's ``"commit"``, a log's or table's first lines, or its JSON twin's), or it is in the list
    of older files without one in docs/benchmarks.md, and that list names only files that exist."""
    import json
    results = os.path.join(ROOT, "benchmarks", "results")
    docs = open(os.path.join(ROOT, "docs", "benchmarks.md")).read()
    listed = set(re.findall(r"^\| `([\w.]+)\.\*` \| [0-9a-f]{7} \|$", docs, re.M))
    unrecorded = set()
    for name in os.listdir(results):
        stem, ext = os.path.splitext(name)
        path = os.path.join(results, name)
        if ext == ".json":
            recorded = bool(json.load(open(path)).get("commit"))
        else:
            twin = os.path.join(results, stem + ".json")
            recorded = bool(re.search(r"\b[0-9a-f]{7,40}\b", open(path).read(600))) or (
                os.path.exists(twin) and bool(json.load(open(twin)).get("commit")))
        if not recorded:
            unrecorded.add(stem)
    assert unrecorded <= listed, sorted(unrecorded - listed)
    stems = {os.path.splitext(n)[0] for n in os.listdir(results)}
    assert listed <= stems, sorted(listed - stems)
