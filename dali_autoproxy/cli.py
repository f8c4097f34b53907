"""The command line: ``dali-autoproxy run|ab|demo`` (``run`` also as ``python -m dali_autoproxy``).

``run`` executes the script in this process as ``__main__`` with its own sys.argv, after
enable(); ``ab`` and ``demo`` run it in fresh processes (ab.py).
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import List, Optional


def run_script(script: str, args: List[str]) -> None:
    from . import enable
    enable()
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="dali-autoproxy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a training script with autoproxy enabled")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    from . import ab, demo
    ab.add_arguments(sub.add_parser("ab", help="compare a script plain (A) and with autoproxy (B)"))
    demo.add_arguments(sub.add_parser("demo", help="A/B on a generated ImageNet-like dataset"))
    ns = parser.parse_args(argv)
    if ns.command == "run":
        run_script(ns.script, ns.args)
        return 0
    if ns.command == "ab":
        return ab.run(ns)
    return demo.run(ns)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
