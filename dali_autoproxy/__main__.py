"""``python -m dali_autoproxy script.py args...`` == ``dali-autoproxy run script.py args...``."""
import sys

from .cli import main, run_script

if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):
    run_script(sys.argv[1], sys.argv[2:])
else:
    sys.exit(main())
