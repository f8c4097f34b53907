"""A training run is many epochs: every epoch without persistent workers forks new workers from
a main process that ran DALI and the torch stage in the epoch before. What such a worker
inherits must never be freed there (``backends/fork_guard.py`` says why and how), and nothing a
worker is handed may hold main-process state.

Each chain kind of the catalogue runs three epochs with the DataLoader's defaults (fork, workers
not persistent), and the torch stage's kinds again with persistent workers, ``spawn`` and
``forkserver``: the last epoch equals plain torchvision's last epoch for the same seed. On DALI's
CPU backend here; the same tests on the GPU, where an inherited CUDA object freed in a worker
aborts it.
"""
import random
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, last_report, load_all
from photos import MEAN, STD
from PIL import ImageFilter, ImageOps
from test_fidelity import compare

import dali_autoproxy


class SelfSupervisedBlur:
    """A recipe's own Pillow class (DINO's, SwAV's shape): recorded, run on DALI's side."""

    def __call__(self, img):
        if random.random() < 0.5:
            return img
        img = img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))
        return ImageOps.solarize(img, 128) if random.random() < 0.2 else img


KINDS = {  # a chain of each kind: DALI alone, the torch stage's families, the exact resize, recorded Pillow
    "train": (lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),
                                 T.Normalize(MEAN, STD)]), "dali"),
    "color_jitter": (lambda: T.Compose([T.RandomResizedCrop(96), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(),
                                        T.Normalize(MEAN, STD)]), "dali"),
    # a policy turns a resize's level into many (thresholds): with Pillow's resize they are exact
    "rand_augment": (lambda: T.Compose([T.RandomResizedCrop(96), T.RandAugment(), T.PILToTensor()]), "pillow"),
    "trivial_augment_v2": (lambda: v2.Compose([v2.RandomResizedCrop(96), v2.TrivialAugmentWide(),
                                               v2.PILToTensor()]), "pillow"),
    "blur_grayscale_erasing": (lambda: T.Compose([T.RandomResizedCrop(96), T.RandomGrayscale(0.5),
                                                  T.GaussianBlur(9, (0.1, 2.0)), T.ToTensor(),
                                                  T.RandomErasing(0.5)]), "dali"),
    "rotation": (lambda: T.Compose([T.CenterCrop(160), T.RandomRotation(20), T.PILToTensor()]), "dali"),
    "exact_resize": (lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),
                                        T.Normalize(MEAN, STD)]), "pillow"),
    "recorded_pillow_class": (lambda: T.Compose([T.RandomResizedCrop(96), SelfSupervisedBlur(), T.ToTensor()]),
                              "dali"),
    "tensor_jitter_v2": (lambda: v2.Compose([v2.ToImage(), v2.RandomResizedCrop(96), v2.ColorJitter(0.4, 0.4, 0.4, 0.1),
                                             v2.ToDtype(torch.float32, scale=True)]), "dali"),
}
STAGE_KINDS = ["color_jitter", "rand_augment", "exact_resize", "recorded_pillow_class"]
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _three_epochs(root, kind, device, **loader_kw):
    make, resize = KINDS[kind]
    ds = image_folder(root, make())
    kw = dict(seed=5, shuffle=True, batch_size=6, epochs=3, resize=resize, **loader_kw)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device=device, **kw)
    rep = last_report()
    assert rep["proxied"] and rep["decode_on_dali"] and not rep["partial"], rep
    assert dali_autoproxy.report()[-1]["batches"] == 3 * len(out)  # every epoch's batches came through autoproxy
    bounds = dict(mae_max=1.5, psnr_min=36.0) if device == "gpu" else {}
    compare(ref, out, normalized=kind in ("train", "color_jitter", "exact_resize"), **bounds)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_three_epochs_with_the_dataloaders_defaults(photo_root, kind, device):
    _three_epochs(photo_root, kind, device)


LOADER_OPTIONS = {
    "persistent_workers": dict(persistent_workers=True),
    "spawn": dict(multiprocessing_context="spawn"),
    "forkserver": dict(multiprocessing_context="forkserver"),
}


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", sorted(LOADER_OPTIONS))
@pytest.mark.parametrize("kind", STAGE_KINDS)
def test_three_epochs_of_the_torch_stage_with_other_worker_options(photo_root, kind, options, device):
    if device == "cpu" and options != "persistent_workers" and kind != "color_jitter":
        pytest.skip("CPU: spawn and forkserver once (each epoch starts fresh interpreters); all on the GPU")
    _three_epochs(photo_root, kind, device, **LOADER_OPTIONS[options])


def test_a_forked_worker_frees_nothing_it_inherited(tmp_path):
    """CPython frees two things in a forked child by itself: the other threads' thread-local
    values, and garbage cycles its collector finds. State a pipeline thread keeps (registered
    with ``fork_guard.keep``, as the stage's staging ring is) and any garbage cycle survive in a
    real DataLoader worker over two epochs; the control, an unregistered thread-local value, is
    freed there (so the check can fail)."""
    script = tmp_path / "inherit.py"
    script.write_text(textwrap.dedent("""
        import gc, threading, weakref, torch
        from dali_autoproxy.backends import fork_guard

        class State:  # stands for a pinned ring, a CUDA event, a stage's device tables
            pass

        local = threading.local()
        refs = {}
        ready, stop = threading.Event(), threading.Event()

        def pipeline_thread():
            local.kept = fork_guard.keep(State())
            local.control = State()
            refs["thread_local_kept"] = weakref.ref(local.kept)
            refs["thread_local_control"] = weakref.ref(local.control)
            ready.set()
            stop.wait()

        threading.Thread(target=pipeline_thread, daemon=True).start()
        ready.wait()
        gc.disable()  # the parent leaves this cycle to its collector, as a dropped loader may be
        cycle = [State()]
        cycle.append(cycle)
        refs["garbage_cycle"] = weakref.ref(cycle[0])
        del cycle

        class Probe(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                gc.collect()  # the worker collects what it can
                return {name: ref() is not None for name, ref in sorted(refs.items())}

        loader = torch.utils.data.DataLoader(Probe(), batch_size=2, num_workers=2)
        for epoch in range(2):
            for batch in loader:
                print({k: v.tolist() for k, v in batch.items()})
    """))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [eval(line) for line in res.stdout.splitlines()]
    assert len(lines) == 4
    for seen in lines:
        assert seen["thread_local_kept"] == [True, True] and seen["garbage_cycle"] == [True, True], seen
        assert seen["thread_local_control"] == [False, False], seen  # CPython did clear the thread's values


def _main_process_state(roots, limit=200_000):
    """Objects reachable from ``roots`` that belong to the main process: objects of
    ``dali_autoproxy.backends``, DALI's own objects, tensors off the CPU, CUDA streams, events
    and graphs. Follows instances, containers, closures and bound methods, never a module, a
    class or a function's globals (those a worker imports afresh or never touches)."""
    import gc
    import types
    seen, found, todo = set(), [], list(roots)
    skip = (types.ModuleType, type, types.FrameType, types.CodeType)
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        module = type(obj).__module__ or ""
        if module.startswith(("dali_autoproxy.backends", "nvidia.dali", "torch.cuda")) or \
                (isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta")):
            found.append(type(obj).__qualname__)
            continue
        if isinstance(obj, types.FunctionType):
            todo.extend(c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None)
            todo.extend(obj.__defaults__ or ())
            continue
        todo.extend(gc.get_referents(obj))
    return found


@pytest.mark.parametrize("device", DEVICES)
def test_what_a_worker_is_handed_holds_no_main_process_state(photo_root, device):
    """After an epoch that ran the torch stage, everything the DataLoader hands its next
    workers (the dataset with its transforms, the collate, the worker_init_fn, the worker's
    arguments) reaches no runner, stage, DALI pipeline or device tensor: under ``spawn`` it
    would be pickled into the worker, under ``fork`` a worker replacing an attribute frees it."""
    import multiprocessing
    handed = []

    class Recording(type(multiprocessing.get_context("fork"))):
        def Process(self, *args, **kwargs):  # noqa: N802 - the context's own name
            handed.append(kwargs.get("args"))
            return super().Process(*args, **kwargs)

    ds = image_folder(photo_root, KINDS["color_jitter"][0]())
    dali_autoproxy.enable(device=device, log_level="WARNING")
    loader = torch.utils.data.DataLoader(ds, batch_size=6, num_workers=2, multiprocessing_context=Recording())
    for epoch in range(2):
        for x, _ in loader:
            pass
    assert last_report()["proxied"] and len(handed) == 4
    assert _main_process_state([loader.dataset, loader.collate_fn, loader.worker_init_fn] + handed) == []
