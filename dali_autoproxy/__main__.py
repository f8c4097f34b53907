"""``python -m dali_autoproxy script.py args...`` == ``dali-autoproxy run script.py args...``."""
import sys

from dali_autoproxy.tools.cli import main

if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):
    sys.exit(main(["run"] + sys.argv[1:]))
sys.exit(main())
