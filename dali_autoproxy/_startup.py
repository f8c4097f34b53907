"""Run by dali_autoproxy.pth at interpreter start when DALI_AUTOPROXY is set.

A bad value (of DALI_AUTOPROXY or of an option's variable) stops the program before it runs,
with the message on stderr and exit status 2, as ``enable()`` raises ValueError: a typo must
not turn into a run of plain torchvision that looks like a run on DALI. Any other failure
(DALI missing, a broken install) is logged and the program runs plain torchvision, as
``enable()`` falls back. Nothing raises inside interpreter start-up.
"""
import os
import sys


def _start() -> None:
    try:
        from dali_autoproxy.config import enable_requested
        if enable_requested():
            from dali_autoproxy import enable
            enable()
    except ValueError as exc:  # a bad value: stop, as enable() would
        sys.stderr.write(f"[dali_autoproxy] ERROR: {exc}. The program was not started (exit status 2): "
                         "correct the value, or unset DALI_AUTOPROXY to run without it.\n")
        sys.stderr.flush()
        os._exit(2)
    except Exception as exc:  # never break interpreter start-up
        sys.stderr.write(f"[dali_autoproxy] ERROR: not enabled, running plain torchvision: {exc}\n")


_start()
