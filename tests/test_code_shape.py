"""The shape of the code, as CI holds it: the layer contract (setup.cfg, import-linter), no import
circle between any two modules (function-level imports and package ``__init__``s counted), the
linter (ruff.toml), and no module over 400 lines."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dali_autoproxy")
MAX_LINES = 400


def _tool(name: str) -> str:
    exe = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: it comes with the test extra (pip install -e '.[dali,test]')")
    return exe


def test_the_layer_contracts_hold():
    res = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def test_no_import_circle_between_modules():
    """Any cycle among the package's modules, at any depth (grimp counts imports inside functions)."""
    import grimp
    graph = grimp.build_graph("dali_autoproxy", cache_dir=None)
    modules = sorted(graph.modules)
    # Tarjan's strongly connected components over the module graph
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(m):
        index[m] = low[m] = counter[0]
        counter[0] += 1
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for m in modules:
        if m not in index:
            visit(m)
    assert cycles == [], cycles


def test_ruff_finds_nothing():
    res = subprocess.run([_tool("ruff"), "check", "dali_autoproxy", "tests", "benchmarks"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]


def test_no_module_over_400_lines():
    long = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    n = sum(1 for _ in f)
                if n > MAX_LINES:
                    long.append((os.path.relpath(path, ROOT), n))
    assert long == [], long
