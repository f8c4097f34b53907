"""The three ways to turn autoproxy on, each on an unchanged script in a fresh process."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torchvision
    import torchvision.transforms as T
    from torch.utils.data import DataLoader
    assert __name__ == "__main__"
    root = sys.argv[1]
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
    loader = DataLoader(torchvision.datasets.ImageFolder(root, transform=tf), batch_size=4, num_workers=2)
    n = sum(len(y) for x, y in loader)
    proxied = None
    if "dali_autoproxy" in sys.modules and sys.modules["dali_autoproxy"].report():
        proxied = sys.modules["dali_autoproxy"].report()[-1]["proxied"]
    print(json.dumps({"argv": sys.argv[1:], "n": n, "proxied": proxied}))
    sys.exit(int(sys.argv[2]))
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


def _run(cmd, env_extra=None):
    env = dict(os.environ)
    env.pop("DALI_AUTOPROXY", None)
    env.update(env_extra or {})
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    return res, (json.loads(lines[-1]) if lines else None)


def test_env_variable_on_unchanged_script(script, photo_root):
    res, out = _run([sys.executable, script, photo_root, "3"],
                    {"DALI_AUTOPROXY": "1", "DALI_AUTOPROXY_DEVICE": "cpu"})
    assert res.returncode == 3, res.stderr
    assert out["proxied"] is True and out["n"] == 24 and out["argv"] == [photo_root, "3"]


def test_python_dash_m(script, photo_root):
    res, out = _run([sys.executable, "-m", "dali_autoproxy", script, photo_root, "0"],
                    {"DALI_AUTOPROXY_DEVICE": "cpu"})
    assert res.returncode == 0, res.stderr
    assert out["proxied"] is True and out["argv"] == [photo_root, "0"]


def test_console_script_run(script, photo_root):
    exe = shutil.which("dali-autoproxy", path=os.path.dirname(sys.executable)) or shutil.which("dali-autoproxy")
    assert exe, "the dali-autoproxy console script is not installed"
    res, out = _run([exe, "run", script, photo_root, "5"], {"DALI_AUTOPROXY_DEVICE": "cpu"})
    assert res.returncode == 5, res.stderr
    assert out["proxied"] is True and out["n"] == 24


def test_startup_hook_is_installed_and_free_when_off():
    pth = os.path.join(sysconfig.get_paths()["purelib"], "dali_autoproxy.pth")
    assert os.path.exists(pth), "dali_autoproxy.pth is not in site-packages"
    code = "import sys; print('torch' in sys.modules, 'dali_autoproxy' in sys.modules)"
    for value in (None, "0", ""):
        res, _ = _run([sys.executable, "-c", code], {} if value is None else {"DALI_AUTOPROXY": value})
        assert res.stdout.split() == ["False", "False"], (value, res.stdout, res.stderr)
    res, _ = _run([sys.executable, "-c", code], {"DALI_AUTOPROXY": "1"})
    assert res.stdout.split() == ["False", "True"]  # enabled, still without importing torch


def test_bad_env_value_stops_the_program_before_it_runs(script, photo_root):
    """A bad value is not missed: the script never runs (exit status 2, the value named), as
    enable() raises ValueError; the variable unset runs plain."""
    for env, named in (({"DALI_AUTOPROXY": "maybe"}, "DALI_AUTOPROXY='maybe'"),
                       ({"DALI_AUTOPROXY": "1", "DALI_AUTOPROXY_DEVICE": "banana"}, "DALI_AUTOPROXY_DEVICE='banana'"),
                       ({"DALI_AUTOPROXY": "1", "DALI_AUTOPROXY_RESIZE": "foo"}, "DALI_AUTOPROXY_RESIZE='foo'")):
        res = subprocess.run([sys.executable, script, photo_root, "0"], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=300)
        assert res.returncode == 2 and res.stdout == "", (env, res.stdout, res.stderr)
        assert named in res.stderr and "accepted values" in res.stderr and "not started" in res.stderr
