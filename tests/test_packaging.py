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
