"""DALI's side of the main process: a plan lowered to one DALI graph (``lowering.py``) and run by
one pipeline and its thread (``runner.py``, imported when a first pipeline is built)."""


class PipelineError(RuntimeError):
    """A batch the pipeline itself failed on: DALI's error or the torch stage's, or no output in
    time. The loader's own errors (a worker's exception, a dead worker reported by the
    DataLoader's SIGCHLD handler wherever the main thread is) are never one."""
