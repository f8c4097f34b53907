from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import torch
import torchvision
from torch.utils.data import DataLoader

import dali_autoproxy

EPOCHS = 1  # epochs load_all runs unless told: 2 for every test marked gpu (conftest.py)


def load_all(dataset, *, autoproxy: bool, device: str = "cpu", seed: int = 0, fidelity: str = "exact",
             resize: Optional[str] = None, epochs: Optional[int] = None, strict: bool = False, augmix: str = "worker",
             log_level: str = "WARNING", **loader_kw) -> List[Tuple]:
    """Iterate ``epochs`` epochs (plain or autoproxied) over one DataLoader and return the last
    epoch's batches, cloned. Each epoch starts its workers afresh unless the loader keeps them
    (the DataLoader's defaults: forked, not persistent): a worker that inherits state from the
    epoch before fails there. ``strict``: anything off DALI raises (a test that claims a path
    runs on DALI cannot pass as a run of plain torchvision). ``resize``: None is the product's
    default (Pillow's arithmetic); "dali" the opt-in."""
    loader_kw.setdefault("batch_size", 8)
    loader_kw.setdefault("num_workers", 2)
    if autoproxy:
        dali_autoproxy.enable(device=device, log_level=log_level, fidelity=fidelity, resize=resize, strict=strict,
                              augmix=augmix)
    else:
        dali_autoproxy.disable()
        loader_kw = plain_loader_kw(loader_kw)
    try:
        torch.manual_seed(seed)
        loader = DataLoader(dataset, **loader_kw)
        for _ in range((epochs or EPOCHS) - 1):
            one_epoch(loader, keep=False)
            if autoproxy and dali_autoproxy.report():
                rep = dali_autoproxy.report()[-1]
                _LAST_EPOCH_FROM[rep["loader"]] = rep
        return one_epoch(loader, keep=True)
    finally:
        dali_autoproxy.disable()


def one_epoch(loader, *, keep: bool = True) -> List:
    """One epoch's batches (cloned where ``keep``). An iterator that an exception leaves (plain
    or autoproxied: the proxy forwards to torch's) is shut down here. Left to the garbage
    collector (the exception's traceback holds it in a cycle), torch's ``__del__`` joins workers
    that never receive their stop (they wait on their index queues) and waits out each one's
    5 s poll, in whichever later test collects it."""
    it = iter(loader)
    try:
        if keep:
            return [_clone(b) for b in it]
        for _batch in it:
            pass
        return []
    except BaseException:
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        raise


def plain_loader_kw(loader_kw: dict) -> dict:
    """Plain torchvision's batches do not depend on how its workers start (each worker's seeds
    come from the main process): its arm forks them, sparing the fresh interpreters that
    ``spawn`` and ``forkserver`` start, for the arm whose start is under test."""
    return {k: v for k, v in loader_kw.items() if k != "multiprocessing_context"}


def _clone(b):
    if isinstance(b, dict):
        return {k: _clone(v) for k, v in b.items()}
    if isinstance(b, (list, tuple)):
        return tuple(_clone(v) for v in b)
    return b.clone() if isinstance(b, torch.Tensor) else b


def image_folder(root, transform):
    return torchvision.datasets.ImageFolder(root, transform=transform)


_LAST_EPOCH_FROM: dict = {}  # a loader's report row (by its number) as load_all's last epoch began
_COUNTS = ("batches", "samples", "decoded_on_dali", "dali_decodes", "cpu_path_samples")


def last_report() -> dict:
    """The last loader's report row; for a loader load_all ran several epochs, its counts are
    the last epoch's (the report itself counts every epoch)."""
    rep = dali_autoproxy.report()[-1]
    start = _LAST_EPOCH_FROM.get(rep["loader"])
    if start is not None:
        for key in _COUNTS:
            rep[key] -= start[key]
        rep["decoded_in_worker"] = {why: n - start["decoded_in_worker"].get(why, 0)
                                    for why, n in rep["decoded_in_worker"].items()
                                    if n - start["decoded_in_worker"].get(why, 0)}
    return rep


@contextlib.contextmanager
def recording_off():
    """Planning as with enable(record="off"): what has no translation says why, statically."""
    from dali_autoproxy.plan.settings import SETTINGS
    before = SETTINGS["record"]
    SETTINGS["record"] = "off"
    try:
        yield
    finally:
        SETTINGS["record"] = before


def why_not(tf) -> str:
    """The reason a chain is not (wholly) offloaded, recording off (with it on, a step without a
    translation is recorded and says why only once a worker finds it needs pixels): a fallback's,
    or a partial split's."""
    from dali_autoproxy.plan.ir import Unsupported
    from dali_autoproxy.plan.planning import build_plan
    try:
        with recording_off():
            plan = build_plan(tf)
    except Unsupported as exc:
        return str(exc)
    assert plan.split_reason, "fully offloaded"
    return plan.split_reason


def falls_back_identically(ds, reason_part: str, **kw) -> dict:
    """Plain and autoproxied runs give the same batches, and the report says why it fell back."""
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, **kw)
    rep = last_report()
    assert not rep["proxied"] and reason_part in rep["reason"], rep
    assert rep["batches"] == len(out) and rep["samples"] == len(ds), rep  # counted though it fell back
    for a, b in zip(ref, out):
        for u, v in zip(a, b):
            assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v
    return rep


def compile_for_a_gpu(kernel, signature: dict, constants: dict) -> None:
    """Triton's front end (Python to its IR, where types are checked) for an sm_90 target; no
    GPU needed. Raises what a first launch on a GPU would. Its callers skip where Triton is not."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": 4, "enable_fp_fusion": False})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(kernel, {**signature, **{name: "constexpr" for name in constants}}, constants)
    source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)


def in_tritons_interpreter(test_file: str) -> dict:
    """Run ``test_file`` as a script (its ``__main__`` prints one JSON line) in Triton's
    interpreter on the CPU, in a subprocess so that no other test sees an interpreted kernel."""
    import json
    import os
    import subprocess
    import sys

    import pytest
    triton = pytest.importorskip("triton")
    if tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit()) < (3, 8):
        pytest.skip("Triton's interpreter before 3.8 cannot take a runtime loop bound under NumPy 2")
    here = os.path.dirname(os.path.abspath(test_file))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.dirname(here))
    out = subprocess.run([sys.executable, os.path.abspath(test_file), "cpu"], capture_output=True, text=True,
                         timeout=600, env=env, cwd=here)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
