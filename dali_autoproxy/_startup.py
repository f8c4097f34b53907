"""Run by dali_autoproxy.pth at interpreter start when DALI_AUTOPROXY is set.

It must never raise inside interpreter start-up: a bad value or a failure is logged to
stderr and the feature stays off.
"""
import sys


def _start() -> None:
    try:
        from dali_autoproxy.config import enable_requested
        if enable_requested():
            from dali_autoproxy import enable
            enable()
    except Exception as exc:  # never break interpreter start-up
        sys.stderr.write(f"[dali_autoproxy] ERROR: not enabled: {exc}\n")


_start()
