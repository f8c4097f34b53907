"""How an error of a fetch reaches the user: the frames plain's traceback shows, and none that
would keep the iterator (and its workers) alive once the error is stored for its place in the
batch order. Runs in the main process."""

from __future__ import annotations

import os
import traceback
import types

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def raised_here(exc: BaseException) -> BaseException:
    """An error of this process's fetch (``num_workers=0``: the dataset's own code ran here),
    kept with the frames plain's traceback shows: this package's frames taken out, the others'
    locals cleared. Their callers' frames may still hold this iterator until the error is gone:
    without workers, nothing but memory waits on it. The exceptions chained to it lose their
    frames (``without_frames``)."""
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_OURS):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    traceback.clear_frames(rebuilt)
    for chained in (exc.__cause__, exc.__context__):
        if chained is not None:
            without_frames(chained)
    return exc.with_traceback(rebuilt)


def without_frames(exc: BaseException) -> BaseException:
    """``exc`` (and the exceptions chained to it) without tracebacks, to be raised later in its
    place in the batch order. A kept traceback holds its frames, and each frame its caller
    (``f_back``): the iterator's own frames among them, a cycle that would keep the iterator,
    and the DataLoader's workers, alive after a ``break`` until the next garbage collection.
    What the user reads stays: a worker's error carries the worker's traceback in its message,
    as the DataLoader raises it."""
    seen, todo = set(), [exc]
    while todo:  # every exception chained to it, through its cause and its context alike
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]
    return exc
