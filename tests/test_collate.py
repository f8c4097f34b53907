"""Custom collate functions keep their semantics: they run in the main process on DALI's
tensors, under the worker's random states, after a shape-only run in the worker that keeps the
worker's generators where plain torchvision would have them. Real workers, real DALI (CPU)."""
import multiprocessing
import os
import random
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, last_report, load_all
from photos import MEAN, STD
from test_fidelity import compare
from torch.utils.data import default_collate

TRAIN = lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),  # noqa: E731
                           T.Normalize(MEAN, STD)])
EVAL_VARIABLE = lambda: T.Compose([T.Resize(64), T.ToTensor()])  # noqa: E731  (sizes differ per image)

MIX = v2.RandomChoice([v2.CutMix(num_classes=3), v2.MixUp(num_classes=3)])


def mixup_cutmix(batch):
    """The torchvision classification references' --mixup-alpha/--cutmix-alpha collate."""
    return MIX(*default_collate(batch))


def numpy_mix(batch):
    """A collate drawing with numpy and Python's random (timm's FastCollateMixup draws with numpy)."""
    x, y = default_collate(batch)
    lam = float(np.random.beta(0.4, 0.4))
    if random.random() < 0.5:
        x = lam * x + (1 - lam) * x.flip(0)
    return x, y, torch.tensor(lam)


def detection_style(batch):
    return tuple(zip(*batch))


def drop_class_one(batch):
    return default_collate([b for b in batch if b[1] != 1])


def reads_pixels(batch):
    """Looks at pixel values (cannot run on shape-only stand-ins): still correct."""
    x, y = default_collate(batch)
    return x, y, x.mean(dim=(1, 2, 3))


def _proxied():
    rep = last_report()
    assert rep["proxied"] and rep["decode_on_dali"], rep
    return rep


def _tensors(batches):
    return [tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in b) for b in batches]


def test_mixup_cutmix_collate_is_proxied_with_the_same_draws(photo_root):
    ds = image_folder(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, seed=5, shuffle=True, collate_fn=mixup_cutmix)
    out = load_all(ds, autoproxy=True, seed=5, shuffle=True, collate_fn=mixup_cutmix)
    _proxied()
    assert ref[0][1].dtype == torch.float32 and ref[0][1].shape == (8, 3)  # soft labels: the collate ran
    assert all(torch.equal(a[1], b[1].cpu()) for a, b in zip(ref, out))  # the same mixing draws
    # the same crops, flips and mixing: images within the fidelity bound (a mix of two images
    # has the bound of each); soft labels compared above
    compare([(a[0], torch.zeros(1)) for a in ref], [(b[0].cpu(), torch.zeros(1)) for b in out])


def test_numpy_and_python_random_draws_in_a_collate_are_kept(photo_root):
    ds = image_folder(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, seed=6, shuffle=True, collate_fn=numpy_mix)
    out = load_all(ds, autoproxy=True, seed=6, shuffle=True, collate_fn=numpy_mix)
    _proxied()
    assert [float(a[2]) for a in ref] == [float(b[2]) for b in out]
    compare([(a[0], a[1]) for a in ref], [(b[0].cpu(), b[1]) for b in out])


def test_detection_style_collate_gets_per_sample_tensors_of_their_own_size(photo_root):
    ds = image_folder(photo_root, EVAL_VARIABLE())
    ref = load_all(ds, autoproxy=False, collate_fn=detection_style)
    out = load_all(ds, autoproxy=True, collate_fn=detection_style)
    _proxied()
    assert len(ref) == len(out)
    for a, b in zip(ref, out):
        assert isinstance(b, tuple) and b[1] == a[1]  # the labels, as a tuple of ints
        assert [x.shape for x in a[0]] == [x.shape for x in b[0]] and len({x.shape for x in a[0]}) > 1
        compare([(x[None], torch.zeros(1)) for x in a[0]], [(x[None].cpu(), torch.zeros(1)) for x in b[0]],
                normalized=False)


def test_a_collate_that_drops_samples(photo_root):
    ds = image_folder(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, seed=7, shuffle=True, collate_fn=drop_class_one)
    out = load_all(ds, autoproxy=True, seed=7, shuffle=True, collate_fn=drop_class_one)
    _proxied()
    assert sum(len(a[1]) for a in ref) == len(ds) * 2 // 3
    compare(ref, [(b[0].cpu(), b[1]) for b in out])


def test_a_collate_that_reads_pixel_values(photo_root):
    ds = image_folder(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, seed=8, shuffle=True, collate_fn=reads_pixels)
    out = load_all(ds, autoproxy=True, seed=8, shuffle=True, collate_fn=reads_pixels)
    _proxied()
    compare([(a[0], a[1]) for a in ref], [(b[0].cpu(), b[1]) for b in out])
    for a, b in zip(ref, out):
        assert torch.allclose(a[2], b[2].cpu(), atol=2e-2)


@pytest.mark.parametrize("workers", [0, 2])
def test_custom_collate_with_num_workers(photo_root, workers):
    ds = image_folder(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, seed=9, shuffle=True, num_workers=workers, collate_fn=mixup_cutmix)
    out = load_all(ds, autoproxy=True, seed=9, shuffle=True, num_workers=workers, collate_fn=mixup_cutmix)
    _proxied()
    assert all(torch.equal(a[1], b[1].cpu()) for a, b in zip(ref, out))


def test_timm_fast_collate_has_an_on_device_equivalent():
    """The stacked batch equals timm's own fast_collate (which copies into a CPU batch)."""
    from timm.data.loader import fast_collate

    from dali_autoproxy.main.collate import on_device
    batch = [(torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8), i % 3) for i in range(5)]
    ours, theirs = on_device(fast_collate)(batch), fast_collate(batch)
    assert on_device(fast_collate) is not fast_collate and on_device(mixup_cutmix) is mixup_cutmix
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1]) and ours[1].dtype == theirs[1].dtype
    arrays = [(x.numpy(), y) for x, y in batch]  # numpy inputs: timm's own code
    assert torch.equal(on_device(fast_collate)(arrays)[0], fast_collate(arrays)[0])


def test_small_plain_tensors_of_a_sample_travel_inline_and_come_back_equal():
    """A sample's small CPU tensors (a detection target's boxes, labels, a 0-d id) travel as their
    bytes: back with the same dtype, shape and values; tensor subclasses, tensors that need grad,
    large ones and dtypes numpy lacks travel as the DataLoader sends them."""
    import pickle

    from torchvision import tv_tensors

    from dali_autoproxy.transport import INLINE_BYTES, InlineTensor
    small = [torch.tensor([[1.5, -0.0, float("nan"), 3.0]]), torch.tensor([7, 8]), torch.tensor(3),
             torch.tensor([True, False]), torch.arange(12, dtype=torch.int16).view(3, 4).t()]
    for t in small:
        assert InlineTensor.fits(t)
        back = pickle.loads(pickle.dumps(InlineTensor(t))).tensor()
        assert type(back) is torch.Tensor and back.dtype == t.dtype and back.shape == t.shape
        torch.testing.assert_close(back, t, rtol=0, atol=0, equal_nan=True)
    boxes = tv_tensors.BoundingBoxes([[0, 0, 4, 4]], format="XYXY", canvas_size=(8, 8))
    for t in (boxes, torch.ones(2, requires_grad=True), torch.zeros(INLINE_BYTES // 4 + 1),
              torch.ones(2, dtype=torch.bfloat16)):
        assert not InlineTensor.fits(t)


class CountingCollate:
    """A collate with a side effect: a step counter shared by the workers (I-JEPA's mask
    collator keeps one in a multiprocessing.Value and seeds its draws from it)."""

    def __init__(self, then=default_collate):
        self.calls = multiprocessing.Value("i", 0)
        self.then = then

    def __call__(self, batch):
        with self.calls.get_lock():
            self.calls.value += 1
        return self.then(batch)


@pytest.mark.parametrize("then", [default_collate, mixup_cutmix, detection_style, reads_pixels])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_users_collate_is_called_once_per_batch(photo_root, workers, then):
    """Plain calls a collate once per batch, and so does autoproxy: one that batches the images,
    mixes them (v2 MixUp/CutMix), hands them on per sample, or computes from them (means)."""
    ds = image_folder(photo_root, TRAIN())
    counts, runs = [], []
    for autoproxy in (False, True):
        collate = CountingCollate(then)
        runs.append(_tensors(load_all(ds, autoproxy=autoproxy, seed=4, shuffle=True, num_workers=workers,
                                      collate_fn=collate)))
        counts.append(collate.calls.value)
    _proxied()
    batches = len(runs[0])
    assert counts == [batches, batches], counts
    if then is detection_style:
        runs = [[(torch.stack(b[0]), torch.tensor(b[1])) for b in run] for run in runs]
    for a, b in zip(*runs):
        assert torch.equal(a[1], b[1])  # labels, soft labels: MixUp's and CutMix's draws
        if then is reads_pixels:
            assert torch.allclose(a[2], b[2], atol=0.02)  # the images' means, from DALI's images
    compare([a[:2] for a in runs[0]], [b[:2] for b in runs[1]], mae_max=2.0 if then is mixup_cutmix else 0.5)


@pytest.mark.skipif(not os.environ.get("IJEPA_DIR"), reason="needs a checkout of facebookresearch/ijepa in IJEPA_DIR")
@pytest.mark.parametrize("workers", [0, 2])
def test_ijepa_mask_collator_unchanged(photo_root, workers):
    """I-JEPA's own MaskCollator (src/masks/multiblock.py, unchanged) seeds each batch's masks from
    a step counter shared by the workers: called once per batch, as plain calls it, every mask
    equals plain's (at 0 workers the order of the steps is fixed; with workers, the counter's
    final value and the set of masks drawn)."""
    sys.path.insert(0, os.environ["IJEPA_DIR"])
    from src.masks.multiblock import MaskCollator
    ds = image_folder(photo_root, T.Compose([T.RandomResizedCrop(224, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
                                             T.ToTensor(), T.Normalize(MEAN, STD)]))
    runs, steps = [], []
    for autoproxy in (False, True):
        collator = MaskCollator(input_size=(224, 224), patch_size=16, pred_mask_scale=(0.15, 0.2),
                                enc_mask_scale=(0.85, 1.0), aspect_ratio=(0.75, 1.5), nenc=1, npred=4,
                                allow_overlap=False, min_keep=10)
        runs.append(load_all(ds, autoproxy=autoproxy, seed=6, shuffle=True, num_workers=workers,
                             collate_fn=collator))
        steps.append(collator._itr_counter.value)
    _proxied()
    assert steps[0] == steps[1] == len(runs[0]) - 1
    masks = [[tuple(m for part in b[1:] for m in part) for b in run] for run in runs]
    if workers == 0:
        for (a, b) in zip(*runs):
            assert torch.equal(a[0][1], b[0][1])  # labels
            assert all(torch.equal(u, v) for u, v in zip(a[1] + a[2], b[1] + b[2]))  # every mask
        compare([a[0] for a in runs[0]], [b[0] for b in runs[1]])
    else:
        key = sorted(tuple(m.flatten().tolist()) for ms in masks[0] for m in ms)
        assert key == sorted(tuple(m.flatten().tolist()) for ms in masks[1] for m in ms)
