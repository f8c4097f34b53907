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

DESCRIPTION = ("Run a PyTorch training script with its DataLoaders' JPEG decoding and torchvision "
               "transforms moved onto NVIDIA DALI (run), compare it plain and with autoproxy (ab), "
               "or try it on a generated dataset (demo).")


class UsageError(Exception):
    """A mistake on the command line: one line on stderr, exit status 2, no traceback."""


def check_script(script: Optional[str]) -> None:
    if not script:
        raise UsageError("a script to run is needed: dali-autoproxy ab [options] train.py [its arguments]")
    if not os.path.isfile(script):
        raise UsageError(f"no such script: {script}")


def check_options() -> None:
    """The DALI_AUTOPROXY_* variables, validated before anything runs."""
    from dali_autoproxy.config import resolve_options
    try:
        resolve_options()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_script(script: str, args: List[str]) -> None:
    from dali_autoproxy import enable
    check_script(script)
    check_options()
    enable()
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"dali-autoproxy: error: {exc}", file=sys.stderr)
        return 2


def _main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="dali-autoproxy", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a training script with autoproxy enabled")
    run.add_argument("script", help="the training script, run as __main__ with autoproxy enabled")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    from dali_autoproxy.tools import ab, demo
    ab.add_arguments(sub.add_parser("ab", help="compare a script plain (A) and with autoproxy (B)"))
    demo.add_arguments(sub.add_parser("demo", help="A/B on a generated ImageNet-like dataset"))
    ns = parser.parse_args(argv)
    if ns.command == "run":
        run_script(ns.script, ns.args)
        return 0
    if ns.command == "ab":
        check_script(ns.script)
        check_options()
        return ab.run(ns)
    check_options()
    return demo.run(ns)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
