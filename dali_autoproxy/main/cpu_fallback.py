"""When DALI fails on a batch, in the main process: its samples replayed through PIL and
torchvision's functional ops (``backends/cpu_replay.py``) with the params the worker drew, so
the loop gets Pillow's pixels for them, or Pillow's own error naming the sample."""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from dali_autoproxy.backends.cpu_replay import decode_like_pil_loader, run_plan
from dali_autoproxy.config import logger
from dali_autoproxy.main.state import LoaderState
from dali_autoproxy.plan.planning import walk
from dali_autoproxy.transport import ENCODED, ProxyGroup


def replay_group(state: LoaderState, group: ProxyGroup, batch_index: int, dali_error: Any,
                 dataset: Any) -> List[torch.Tensor]:
    """DALI failed on this batch: replay its samples through PIL and torchvision's
    functional ops with the params drawn in the worker (PIL's pixels, or PIL's error)."""
    plan = state.plans[group.key]
    out = []
    for k, (view, path) in enumerate(zip(group.payload_views(), group.paths)):
        try:
            img = decode_like_pil_loader(view.tobytes()) if group.kind == ENCODED else view
            out.append(run_plan(plan, img, group.params[k].tolist()))
        except Exception as exc:
            msg = (f"{exc} [{describe(dataset, path)}; batch {batch_index}; "
                   f"DALI failed on it too: {dali_error}]")
            try:
                err = type(exc)(msg)
            except Exception:
                err = RuntimeError(msg)
            raise err from exc
    logger.warning("DataLoader #%d: DALI failed on batch %d (%s); its %d samples were computed by "
                   "PIL and torchvision instead", state.record["loader"], batch_index,
                   str(dali_error).strip().splitlines()[-1][:200], len(out))
    state.record["cpu_path_samples"] += len(out)
    return out


def describe(dataset: Any, path: Optional[str]) -> str:
    """'dataset index N, file F' where the dataset lists its files, else what is known."""
    if path is None:
        return "pixels produced by the dataset"
    for folder in walk(dataset).folders:
        for i, sample in enumerate(getattr(folder, "samples", ()) or ()):
            if sample[0] == path:
                return f"{type(folder).__name__} index {i}, file {path}"
    return f"file {path}"
