"""Joint image-and-target transforms (detection, segmentation) taken over for their image: real
COCO- and VOC-format sets made from photographs, torchvision's own datasets and its v2 wrapper,
real worker processes; targets bit-equal to plain's, images equal on every pixel."""
import math
import os
import sys
from collections import defaultdict

import pytest
import torch
import torchvision.transforms.v2 as v2
from coco import make_coco, make_voc
from helpers import last_report, load_all
from torchvision import tv_tensors
from torchvision.datasets import CocoDetection, VOCSegmentation, wrap_dataset_for_transforms_v2

import dali_autoproxy

MEAN = (123.0, 117.0, 104.0)
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
GPU_MAE, GPU_PSNR = 1.5, 36.0  # nvJPEG's decode against libjpeg-turbo's (test_gpu.py); the ops are exact


TENSOR_RESIZE_LEVELS = 0


def assert_same_image(a, b, device, scale=255.0, levels=0):
    """Every pixel equal on the CPU backend (libjpeg-turbo's decode, as Pillow's), or within
    ``levels`` of the uint8 image; on the GPU within nvJPEG's decoding tolerance."""
    b = b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    if device == "cpu":
        worst = float((a.double() - b.double()).abs().max()) * scale if a.numel() else 0.0
        assert worst <= levels + 1e-3, worst
        return
    err = (a.double() - b.double()) * scale
    mse = float((err ** 2).mean())
    assert float(err.abs().mean()) <= GPU_MAE and (mse == 0 or 10 * math.log10(255 ** 2 / mse) >= GPU_PSNR)


def detection_preset(augmentation: str) -> v2.Compose:
    """torchvision's detection references' v2 presets (PIL backend), at sizes for small images."""
    head = {
        "hflip": [v2.RandomHorizontalFlip(p=0.5)],
        "lsj": [v2.ScaleJitter(target_size=(256, 256), antialias=True), v2.RandomCrop(256, pad_if_needed=True,
                                                                                        fill=MEAN[0]),
                v2.RandomHorizontalFlip(p=0.5)],
        "multiscale": [v2.RandomShortestSize(min_size=(160, 192, 224), max_size=400), v2.RandomHorizontalFlip(p=0.5)],
        "ssd": [v2.RandomPhotometricDistort(), v2.RandomZoomOut(fill=defaultdict(lambda: MEAN, {tv_tensors.Mask: 0})),
                v2.RandomIoUCrop(), v2.RandomHorizontalFlip(p=0.5)],
        "ssdlite": [v2.RandomIoUCrop(), v2.RandomHorizontalFlip(p=0.5)],
    }[augmentation]
    return v2.Compose(head + [v2.ToImage(), v2.ToDtype(torch.float, scale=True),
                              v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
                              v2.SanitizeBoundingBoxes(), v2.ToPureTensor()])


class Preset:
    """As the references wrap their chain: ``__call__(img, target)``."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img, target):
        return self.transforms(img, target)


def collate_fn(batch):
    return tuple(zip(*batch))  # the detection references' utils.collate_fn


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("coco"))
    return root, make_coco(root, n=12)


def coco_dataset(coco_root, transforms, keys=("boxes", "labels", "image_id", "masks")):
    root, annotations = coco_root
    ds = CocoDetection(os.path.join(root, "images"), annotations, transforms=transforms)
    return wrap_dataset_for_transforms_v2(ds, target_keys=list(keys))


def assert_same_detection(ref, out, device="cpu", levels=0):
    assert len(ref) == len(out)
    for (images_a, targets_a), (images_b, targets_b) in zip(ref, out):
        for a, b in zip(images_a, images_b):
            assert_same_image(a, b, device, levels=levels)
        for a, b in zip(targets_a, targets_b):
            assert a.keys() == b.keys()
            for k in a:
                x, y = a[k], b[k]
                assert type(x) is type(y), k
                assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, k


def assert_on_dali_as_plain(ds, device, seed, levels=0, resize=None):
    """One shuffled epoch plain and proxied: targets and images plain's, every image decoded on DALI."""
    kw = dict(collate_fn=collate_fn, batch_size=4, shuffle=True, seed=seed)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device=device, resize=resize, **kw)
    assert_same_detection(ref, out, device, levels)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    return rep


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("augmentation", ["hflip", "lsj", "multiscale", "ssd", "ssdlite"])
def test_detection_presets_go_to_dali_with_plains_targets(coco_root, augmentation, device):
    """Each preset: every image decoded on DALI, each with its own size, its boxes, labels, masks and
    image id what plain torchvision makes for the same seed, its pixels plain's on every pixel."""
    ds = coco_dataset(coco_root, Preset(detection_preset(augmentation)))
    kw = dict(collate_fn=collate_fn, batch_size=4, shuffle=True, seed=5)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device=device, **kw)
    assert_same_detection(ref, out, device)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep
    joint = rep["dali_transforms"][1:]  # the outermost joint call, with the steps it holds
    assert len(joint) == 1 and joint[0].startswith("Preset with its targets (v2."), rep
    if augmentation != "lsj":
        assert len({tuple(x.shape) for images, _ in out for x in images}) > 1  # sizes of their own


@pytest.mark.parametrize("device", DEVICES)
def test_segmentation_preset_goes_to_dali_with_plains_masks(tmp_path, device):
    """The segmentation references' v2 preset on a VOC-format set: random resize, flip, a padded
    random crop (masks padded with 255), normalised images; masks bit-equal, images equal."""
    preset = v2.Compose([v2.RandomResize(min_size=96, max_size=320), v2.RandomHorizontalFlip(0.5),
                         v2.RandomCrop(160, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                         v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
                         v2.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), v2.ToPureTensor()])
    ds = wrap_dataset_for_transforms_v2(VOCSegmentation(make_voc(str(tmp_path)), image_set="train", transforms=preset))
    ref = load_all(ds, autoproxy=False, batch_size=4, seed=2)
    out = load_all(ds, autoproxy=True, device=device, batch_size=4, seed=2)
    assert len(ref) == len(out) == 2
    for (xa, ma), (xb, mb) in zip(ref, out):
        assert torch.equal(ma, mb) and xa.shape == xb.shape
        if device == "cpu":
            assert float((xa - xb).abs().max()) < 1e-5  # Normalize's float32 maths
        else:
            assert_same_image(xa, xb, device, scale=255.0 * 0.229)  # in levels (the largest std: no error understated)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep


@pytest.mark.parametrize("device,context", [("cpu", None), ("cpu", "spawn"),
                                            pytest.param("gpu", None, marks=pytest.mark.gpu)])
def test_a_later_epochs_workers_share_one_plan_of_a_joint_chain_built_before_its_first_batch(
        tmp_path, monkeypatch, device, context):
    """Each worker learns the segmentation preset's shape from its first sample (draws of the
    chain before the sample's own: a flip or none, a pad or none) and the main process merges
    what every worker sent, so every batch of every epoch comes under one plan, from the first
    batch on (later epochs' workers, started afresh with the DataLoader's defaults, start from
    the merge; spawned ones find the chain by its path in their copy of the dataset): one DALI
    pipeline for the loader, and the batches stay plain's: masks bit-equal, images equal."""
    from dali_autoproxy.backends.dali import runner
    from dali_autoproxy.main import iterator
    preset = v2.Compose([v2.RandomResize(min_size=96, max_size=320), v2.RandomHorizontalFlip(0.5),
                         v2.RandomCrop(160, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                         v2.PILToTensor(), v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()])
    ds = wrap_dataset_for_transforms_v2(VOCSegmentation(make_voc(str(tmp_path), n=32), image_set="train",
                                                        transforms=preset))
    kw = dict(batch_size=2, num_workers=4, shuffle=True, multiprocessing_context=context)
    epochs = 2 if context else 3  # spawned workers: the later epoch's chain found by its path (forked: it stays)
    ref = load_all(ds, autoproxy=False, seed=5, epochs=epochs, **kw)
    keys, builds, taken, first = [], [], [], []
    units, build, build_first = iterator.pipeline_units, runner.DaliRunner._build, iterator.build_first_pipeline

    def spy_units(proxies, share):
        out = units(proxies, share)
        keys[-1].update(u.key for u in out)
        return out

    def spy_build(self):
        builds.append(len(taken))  # batches taken when it was built
        return build(self)

    def spy_build_first(loader, state, decision, options):
        first.append(next(iter(decision.plans), None))  # the plan whose pipeline is built before the first batch
        return build_first(loader, state, decision, options)
    monkeypatch.setattr(iterator, "pipeline_units", spy_units)
    monkeypatch.setattr(iterator, "build_first_pipeline", spy_build_first)
    monkeypatch.setattr(runner.DaliRunner, "_build", spy_build)
    dali_autoproxy.enable(device=device, log_level="WARNING")
    try:
        torch.manual_seed(5)
        loader = torch.utils.data.DataLoader(ds, **kw)
        for _epoch in range(epochs):
            keys.append(set())
            taken.clear()
            it = iter(loader)
            out = [(x.cpu().clone(), m.cpu().clone()) for x, m in it if not taken.append(1)]
            del it
    finally:
        dali_autoproxy.disable()
    assert first[0] is None, first  # a VOC dataset calls its transforms with the target: no image-only pipeline
    assert len(keys[0]) == 1, keys  # the first epoch too: every worker's first draws learnt the whole shape
    assert all(epoch == {first[1]} for epoch in keys) and len(set(first[1:])) == 1, (keys, first)
    assert builds == [0], builds  # the loader's one pipeline, built for its first batch and kept
    assert len(ref) == len(out) == 16
    for (xa, ma), (xb, mb) in zip(ref, out):
        assert torch.equal(ma, mb)
        if device == "cpu":
            assert torch.equal(xa, xb)
        else:
            assert_same_image(xa, xb, device)
    assert last_report()["decode"] == "DALI 100%"


class OwnGeneratorBrightness(v2.Transform):
    """A user's v2 transform drawing its factor from a generator of its own (each worker's copy
    starts where the dataset's did), not from torch's global one."""

    def __init__(self):
        super().__init__()
        self.generator = torch.Generator().manual_seed(7)

    def make_params(self, flat_inputs):
        return dict(factor=float(0.5 + torch.rand(1, generator=self.generator)))

    def transform(self, inpt, params):
        if isinstance(inpt, tv_tensors.Mask):
            return inpt
        return v2.functional.adjust_brightness(inpt, params["factor"])


class OwnGeneratorBrightnessV1:
    """The same as a v1-style class of the user's code (recorded: its Pillow calls go to DALI)."""

    def __init__(self):
        self.generator = torch.Generator().manual_seed(7)

    def __call__(self, img):
        import torchvision.transforms.functional as F
        return F.adjust_brightness(img, float(0.5 + torch.rand(1, generator=self.generator)))


def test_a_transform_with_a_generator_of_its_own_keeps_plains_draws(tmp_path, photo_root):
    """A draw made again (a plan that grew: a flip where the first samples had none, the first
    recorded call) puts back a transform's own generators with the global ones, and the first
    sample's probe draws are made only for torchvision's own transforms: a user's transform
    holding a generator of its own gets exactly plain's sequence of draws, in a joint chain and
    in an image's chain alike."""
    import torchvision
    import torchvision.transforms as T
    preset = v2.Compose([v2.RandomHorizontalFlip(0.5), OwnGeneratorBrightness(), v2.PILToTensor()])
    ds = wrap_dataset_for_transforms_v2(VOCSegmentation(make_voc(str(tmp_path), n=8), image_set="train",
                                                        transforms=preset))
    kw = dict(batch_size=2, num_workers=2, seed=4, device="cpu", collate_fn=collate_fn)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, strict=True, **kw)
    assert len(ref) == len(out) == 4
    for (xa, ma), (xb, mb) in zip(ref, out):
        assert all(torch.equal(a, b.cpu()) for a, b in zip(xa, xb)), "images differ"
        assert all(torch.equal(a, b) for a, b in zip(ma, mb)), "masks differ"
    images = torchvision.datasets.ImageFolder(photo_root, T.Compose([T.CenterCrop(64), T.RandomHorizontalFlip(),
                                                                     OwnGeneratorBrightnessV1(), T.PILToTensor()]))
    kw = dict(batch_size=4, num_workers=2, seed=4, device="cpu")
    ref, out = load_all(images, autoproxy=False, **kw), load_all(images, autoproxy=True, strict=True, **kw)
    assert len(ref) == len(out) and all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(ref, out))


def test_a_chain_a_dataset_calls_with_its_targets_is_not_planned_for_the_image_alone(tmp_path, photo_root):
    """A v2 chain that a torchvision dataset holds as ``transforms`` (VOC, COCO, and the v2
    wrapper around them call it with the image and its target) is planned in the workers, per
    call: the decision builds no pipeline of the image alone, which no batch would use, and says
    so; the same chain given as an ImageFolder's ``transform`` is the image's, planned up front."""
    from torchvision.datasets import ImageFolder

    from dali_autoproxy.config import Options
    from dali_autoproxy.main.decision import decide
    preset = v2.Compose([v2.RandomResize(min_size=96, max_size=320), v2.RandomHorizontalFlip(0.5),
                         v2.RandomCrop(160, pad_if_needed=True), v2.PILToTensor(), v2.ToDtype(torch.float, scale=True)])
    root, options = make_voc(str(tmp_path), n=2), Options(device="cpu")
    for wrap in (lambda d: d, wrap_dataset_for_transforms_v2):  # the wrapper takes the dataset's transforms
        dataset = wrap(VOCSegmentation(root, image_set="train", transforms=preset))
        decision = decide(torch.utils.data.DataLoader(dataset, batch_size=2), options)
        assert decision.proxied and decision.plans == {}, decision
        assert decision.joint == ["dataset.transforms: v2.Compose"], decision.joint
    decision = decide(torch.utils.data.DataLoader(ImageFolder(photo_root, transform=preset), batch_size=2), options)
    assert decision.proxied and len(decision.plans) == 1 and decision.joint == [], decision


class ImageAndMask(torch.utils.data.Dataset):
    """A user's segmentation set, the references' way: ``self.transforms(image, mask)``."""

    def __init__(self, files, transforms):
        self.files, self.transforms = files, transforms

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image
        img = Image.open(self.files[i]).convert("RGB")
        return self.transforms(img, tv_tensors.Mask(torch.zeros(img.height, img.width, dtype=torch.uint8)))


class ImageOnly(ImageAndMask):
    def __getitem__(self, i):
        from PIL import Image
        return self.transforms(Image.open(self.files[i]).convert("RGB")), 0


class EitherWay(ImageAndMask):
    def __getitem__(self, i):
        from PIL import Image
        img = Image.open(self.files[i]).convert("RGB")
        if i % 2:
            return self.transforms(img), 0
        return self.transforms(img, tv_tensors.Mask(torch.zeros(img.height, img.width, dtype=torch.uint8)))


@pytest.mark.parametrize("dataset,image_alone", [(ImageAndMask, False), (ImageOnly, True), (EitherWay, True)])
def test_a_users_dataset_that_calls_its_chain_with_targets_gets_no_pipeline_of_the_image_alone(photo_root, dataset,
                                                                                               image_alone):
    """A user's dataset whose methods call the chain with the image and its target (every call)
    gets no pipeline of the image alone before the first batch; one that calls it with the image,
    even once, gets it; and the proxied loader's batches are plain's either way."""
    from dali_autoproxy.config import Options
    from dali_autoproxy.main.decision import decide
    files = sorted(os.path.join(root, f) for root, _, names in os.walk(photo_root) for f in names)[:8]
    preset = v2.Compose([v2.RandomResize(min_size=48, max_size=96), v2.RandomHorizontalFlip(0.5),
                         v2.RandomCrop(40, pad_if_needed=True), v2.PILToTensor()])
    ds = dataset(files, preset)
    decision = decide(torch.utils.data.DataLoader(ds, batch_size=2), Options(device="cpu"))
    assert decision.proxied and (len(decision.plans) == 1) == image_alone, decision
    assert decision.joint == ([] if image_alone else ["dataset.transforms: v2.Compose"]), decision
    kw = dict(collate_fn=collate_fn, batch_size=2, device="cpu", seed=3)
    for (a, ta), (b, tb) in zip(load_all(ds, autoproxy=False, **kw), load_all(ds, autoproxy=True, **kw)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), "images differ"
        assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(ta, tb)), "targets differ"
    assert last_report()["proxied"]


def test_an_image_without_objects_raises_plains_error(tmp_path):
    """v2's wrapper gives an image without objects no labels: SanitizeBoundingBoxes raises; the
    proxied loader raises the same error (from the worker's run of the chain as written)."""
    root = str(tmp_path)
    ds = coco_dataset((root, make_coco(root, n=4, empty=True)), Preset(detection_preset("hflip")))
    errors = []
    for proxied in (False, True):
        with pytest.raises(ValueError) as info:
            load_all(ds, autoproxy=proxied, collate_fn=collate_fn, batch_size=2, device="cpu")
        errors.append(str(info.value).splitlines()[-1])
    assert errors[0] == errors[1] and "labels" in errors[0]


class JPEGFiles(torch.utils.data.Dataset):
    """A set's JPEGs, each through ``transforms`` with targets the subclass makes."""

    def __init__(self, root, transforms):
        self.files = sorted(os.path.join(root, "images", f) for f in os.listdir(os.path.join(root, "images")))
        self.transforms = transforms

    def __len__(self):
        return len(self.files)


class WrongSizedMask(JPEGFiles):
    def __getitem__(self, i):
        from PIL import Image
        img = Image.open(self.files[i]).convert("RGB")
        mask = tv_tensors.Mask(torch.zeros(img.height + 1, img.width, dtype=torch.uint8))
        return self.transforms(img, {"masks": mask})


def test_a_mask_of_the_wrong_size_raises_plains_error(coco_root):
    ds = WrongSizedMask(coco_root[0], v2.Compose([v2.RandomResizedCrop(64), v2.PILToTensor()]))
    errors = []
    for proxied in (False, True):
        with pytest.raises(ValueError) as info:
            load_all(ds, autoproxy=proxied, collate_fn=collate_fn, batch_size=2, device="cpu")
        errors.append(str(info.value).splitlines()[-1])
    assert errors[0] == errors[1], errors


class TensorPresetThatRaises:
    """The segmentation references' v1 tensor backend's shape (PILToTensor first, then v1's
    functional ops on tensors, Python's ``random``) raising on some samples only: whether it
    raises depends on the draws before it."""

    def __call__(self, image, target):
        import random

        import numpy as np
        import torchvision.transforms.functional as F
        image = F.pil_to_tensor(image)
        target = torch.as_tensor(np.array(target), dtype=torch.int64)
        size = random.randint(80, 320)
        image = F.resize(image, size)
        target = F.resize(target[None], size, interpolation=F.InterpolationMode.NEAREST)[0]
        if random.random() < 0.5:
            image, target = F.hflip(image), F.hflip(target)
        if image.shape[-1] > 400:
            raise ValueError(f"too wide: {list(image.shape[-2:])}")
        image, target = F.center_crop(image, 128), F.center_crop(target, 128)
        return F.convert_image_dtype(image, torch.float), target


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_that_raises_on_some_samples_raises_plains_error_at_plains_sample(tmp_path, workers):
    """The error plain raises, on the same sample (its message names the size the draws made),
    with plain's traceback: nothing of ours chained to it."""
    import random
    import traceback
    ds = VOCSegmentation(make_voc(str(tmp_path), n=16), image_set="train", transforms=TensorPresetThatRaises())
    said = []
    for proxied in (False, True):
        random.seed(0)  # the main process's draws at num_workers=0
        with pytest.raises(ValueError) as info:
            load_all(ds, autoproxy=proxied, batch_size=2, num_workers=workers, shuffle=True, seed=0, device="cpu")
        text = "".join(traceback.format_exception(info.value))
        assert "During handling" not in text and 'raise ValueError(f"too wide' in text, text  # the raising line
        said.append(str(info.value).splitlines()[-1])
    assert said[0] == said[1] and "too wide" in said[0], said


def test_a_joint_chain_that_needs_pixels_runs_as_written_and_says_why(coco_root):
    """A resize of a float tensor (after ToDtype: no longer the image's uint8 values as they are)
    is not recorded: the chain runs in the worker (plain's results) and the report says which
    joint transform and why; nothing is shown as proxied."""
    chain = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
                        v2.RandomShortestSize(min_size=(160, 192), max_size=400),
                        v2.SanitizeBoundingBoxes(), v2.ToPureTensor()])
    ds = coco_dataset(coco_root, Preset(chain))
    ref = load_all(ds, autoproxy=False, collate_fn=collate_fn, batch_size=4, seed=1)
    out = load_all(ds, autoproxy=True, collate_fn=collate_fn, batch_size=4, seed=1, device="cpu")
    assert_same_detection(ref, out)
    rep = last_report()
    assert not rep["proxied"] and rep["dali_transforms"] == [], rep
    assert rep["reason"].startswith("no sample reached DALI: joint image-and-target transform "), rep
    assert ": needs pixels (tensor resize) at torchvision/" in rep["reason"], rep


TENSOR_PRESET_HEADS = {
    "hflip": lambda: [v2.RandomHorizontalFlip(p=0.5)],
    "ssdlite": lambda: [v2.RandomIoUCrop(), v2.RandomHorizontalFlip(p=0.5)],
    "multiscale": lambda: [v2.RandomShortestSize(min_size=(160, 192, 224), max_size=400),
                           v2.RandomHorizontalFlip(p=0.5)],
    "ssd": lambda: [v2.RandomPhotometricDistort(p=0.75),
                    v2.RandomZoomOut(fill=defaultdict(lambda: MEAN, {tv_tensors.Mask: 0})),
                    v2.RandomIoUCrop(), v2.RandomHorizontalFlip(p=0.5)],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["tensor", "tv_tensor"])
@pytest.mark.parametrize("augmentation", list(TENSOR_PRESET_HEADS))
def test_the_tensor_backends_go_to_dali(coco_root, augmentation, backend, device):
    """The presets' tensor backends (PILToTensor or ToImage first): v2's kernels on the uint8
    tensor are recorded as the image's calls, in chain order, before the tensor steps: crops and
    flips; RandomPhotometricDistort's brightness, contrast, saturation and hue (torchvision's
    tensor arithmetic) and channel permutation; RandomZoomOut's pad with the mean's uint8 values;
    RandomShortestSize's bilinear resize (Pillow's, within a level of torch's uint8 resize).
    Targets plain's bit for bit; every image decoded on DALI."""
    first = v2.PILToTensor() if backend == "tensor" else v2.ToImage()
    chain = v2.Compose([first] + TENSOR_PRESET_HEADS[augmentation]() + [
        v2.ToDtype(torch.float, scale=True), v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
        v2.SanitizeBoundingBoxes(), v2.ToPureTensor()])
    levels = TENSOR_RESIZE_LEVELS if augmentation == "multiscale" else 0
    assert_on_dali_as_plain(coco_dataset(coco_root, Preset(chain)), device, seed=12, levels=levels)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend,interpolation,resize", [("tensor", "bilinear", "pillow"),
                                                          ("tv_tensor", "bilinear", "pillow"),
                                                          ("tensor", "bicubic", "dali")])
def test_a_tensor_backends_resize_is_torchvisions(coco_root, backend, interpolation, resize, device):
    """The multiscale tensor preset's resize recorded as torchvision's own (ir.TensorResize): with
    resize="pillow", and for a bicubic one whatever the setting (it ran in the worker before):
    every pixel plain's on the CPU backend, the targets plain's, decoded on DALI."""
    first = v2.PILToTensor() if backend == "tensor" else v2.ToImage()
    mode = v2.InterpolationMode(interpolation)
    chain = v2.Compose([first, v2.RandomShortestSize(min_size=(160, 192, 224), max_size=400, interpolation=mode),
                        v2.RandomHorizontalFlip(p=0.5), v2.ToDtype(torch.float, scale=True), v2.ToPureTensor()])
    rep = assert_on_dali_as_plain(coco_dataset(coco_root, Preset(chain)), device, seed=12, resize=resize)
    assert rep["worker_transforms"] == [], rep


class JointTensorDistort(torch.nn.Module):
    """The references' v1 style on a tensor: v1's functional colour ops, pad, resize, crop and
    flip of the uint8 tensor, the boxes computed here."""

    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        image = F.pil_to_tensor(image)
        r = torch.rand(6)
        image = F.adjust_brightness(image, 0.875 + 0.25 * float(r[0]))
        image = F.adjust_contrast(image, 0.5 + float(r[1]))
        image = F.adjust_saturation(image, 0.5 + float(r[2]))
        image = F.adjust_hue(image, 0.1 * float(r[3]) - 0.05)
        _, h, w = F.get_dimensions(image)
        left, top = int(40 * r[4]), int(30 * r[5])
        image = F.pad(image, [left, top, 7, 5], fill=0)
        target["boxes"][:, 0::2] += left
        target["boxes"][:, 1::2] += top
        new_h, new_w = 200, 240
        image = F.resize(image, [new_h, new_w])
        target["boxes"][:, 0::2] *= new_w / (w + left + 7)
        target["boxes"][:, 1::2] *= new_h / (h + top + 5)
        image = F.crop(image, 10, 20, 150, 200)
        image = F.hflip(image)
        return F.convert_image_dtype(image, torch.float), target


@pytest.mark.parametrize("device", DEVICES)
def test_v1_functional_ops_on_a_tensor_go_to_dali(coco_root, device):
    """v1's functional ops on the image's uint8 tensor inside a user's joint class: recorded in
    order (colour with torchvision's tensor arithmetic, pad, Pillow's bilinear resize within a
    level of v1's float resize, crop, flip); the boxes plain's; decoded on DALI."""
    chain = ReferencesStyleCompose([JointTensorDistort()])
    assert_on_dali_as_plain(CocoWithTarget(coco_root, chain), device, seed=3, levels=TENSOR_RESIZE_LEVELS)


class JointTensorZoomOut(torch.nn.Module):
    """A zoom-out on a uint8 tensor as the references' v1 RandomZoomOut writes it: a pad with
    zeros, then the fill written into the border's strips (all four, or ``strips`` of them)."""

    def __init__(self, strips=4):
        super().__init__()
        self.strips = strips

    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        image = F.pil_to_tensor(image)
        _, h, w = F.get_dimensions(image)
        r = torch.rand(2)
        left, top = int(30 * r[0]), int(20 * r[1])
        right, bottom = 30 - left, 20 - top
        image = F.pad(image, [left, top, right, bottom], fill=0)
        v = torch.tensor([123.0, 117.0, 104.0], device=image.device, dtype=image.dtype).view(-1, 1, 1)
        strips = [(Ellipsis, slice(None, top), slice(None)), (Ellipsis, slice(None), slice(None, left)),
                  (Ellipsis, slice(top + h, None), slice(None)), (Ellipsis, slice(None), slice(left + w, None))]
        for index in strips[:self.strips]:
            image[index] = v
        target["boxes"][:, 0::2] += left
        target["boxes"][:, 1::2] += top
        return F.convert_image_dtype(image, torch.float), target


@pytest.mark.parametrize("device", DEVICES)
def test_a_pads_border_written_with_its_fill_goes_to_dali(coco_root, device):
    """A pad with zeros whose four border strips are then written with one colour is a pad with
    that colour: recorded, decoded on DALI, plain's pixels and boxes."""
    chain = ReferencesStyleCompose([JointTensorZoomOut(), JointFlip()])
    assert_on_dali_as_plain(CocoWithTarget(coco_root, chain), device, seed=8)


def test_a_half_written_border_needs_pixels(coco_root):
    """Two of the four strips written: no recorded pad is that image; the class runs as written
    (plain's results) and the report says why."""
    ds = CocoWithTarget(coco_root, ReferencesStyleCompose([JointTensorZoomOut(strips=2)]))
    ref = load_all(ds, autoproxy=False, collate_fn=collate_fn, batch_size=4, seed=2)
    out = load_all(ds, autoproxy=True, collate_fn=collate_fn, batch_size=4, seed=2, device="cpu")
    assert_same_detection(ref, out)
    rep = last_report()
    assert not rep["proxied"] and "needs pixels (tensor __setitem__)" in rep["reason"], rep


class SometimesHalfWritten(torch.nn.Module):
    """Half the samples written into half a pad's border (needs pixels), the others only made a tensor."""

    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        if torch.rand(1) < 0.5:
            return JointTensorZoomOut(strips=2)(image, target)
        return F.convert_image_dtype(F.pil_to_tensor(image), torch.float), target


def test_images_a_declined_joint_call_decodes_count_in_the_decode_share(coco_root):
    """Once a joint class needs pixels, its later samples run as written and Pillow decodes their
    JPEGs in the worker: the report's decode share counts every sample once, DALI's and the
    worker's (with the reason), not only those that reached DALI."""
    ds = CocoWithTarget(coco_root, ReferencesStyleCompose([SometimesHalfWritten()]))
    ref = load_all(ds, autoproxy=False, collate_fn=collate_fn, batch_size=4, seed=2)
    out = load_all(ds, autoproxy=True, collate_fn=collate_fn, batch_size=4, seed=2, device="cpu")
    assert_same_detection(ref, out)
    rep = last_report()
    in_worker = sum(rep["decoded_in_worker"].values())
    assert rep["decoded_on_dali"] + in_worker == len(ds) and in_worker > 0, rep
    assert "worker" in rep["decode"] and "needs pixels (tensor __setitem__)" in rep["decode"], rep


class JointBadBrightness(torch.nn.Module):
    """A joint class passing a factor torchvision refuses."""

    def forward(self, image, target=None):
        return v2.functional.adjust_brightness(image, -1.0), target


def test_a_factor_torchvision_refuses_raises_plains_error(coco_root):
    """A factor torchvision refuses (a negative brightness) is not recorded: the call runs as
    written and raises torchvision's own error, as plain does."""
    ds = CocoWithTarget(coco_root, ReferencesStyleCompose([JointPILToTensor(), JointBadBrightness()]))
    errors = []
    for proxied in (False, True):
        with pytest.raises(Exception) as info:
            load_all(ds, autoproxy=proxied, collate_fn=collate_fn, batch_size=2, device="cpu")
        errors.append(str(info.value).splitlines()[-1])
    assert errors[0] == errors[1] and "brightness_factor" in errors[0], errors


def test_the_detection_references_presets_unchanged(coco_root):
    """torchvision's own ``references/detection/presets.py`` and ``transforms.py`` (set
    TORCHVISION_REFERENCES to a checkout's ``references`` folder), every augmentation as
    ``train.py`` builds it (v2's lsj raises plain's error: its v1 FixedSizeCrop returns plain
    tensors, and SanitizeBoundingBoxes finds no boxes): v2 with the PIL, tensor and tv_tensor
    backends, and v1 with the tensor backend (the references' own classes on a tensor; v1's PIL
    backend: the test below). Targets equal plain's;
    images equal, within a level where a tensor is resized (torch's uint8 resize against
    Pillow's); every image decoded on DALI (v1's tensor ``ssd`` too: its RandomZoomOut pads with
    zeros and writes the fill into the border's four strips, recorded as a pad with the fill)."""
    where = os.environ.get("TORCHVISION_REFERENCES")
    if not where:
        pytest.skip("set TORCHVISION_REFERENCES to the references folder of a pytorch/vision checkout")
    sys.path.insert(0, os.path.join(where, "detection"))
    try:
        import presets
        for use_v2, backend in ((True, "pil"), (True, "tensor"), (True, "tv_tensor"), (False, "tensor")):
            for augmentation in ("hflip", "multiscale", "ssd", "ssdlite"):
                train = presets.DetectionPresetTrain(data_augmentation=augmentation, backend=backend, use_v2=use_v2)
                ds = coco_dataset(coco_root, train) if use_v2 else CocoWithTarget(coco_root, train)
                ref = load_all(ds, autoproxy=False, collate_fn=collate_fn, batch_size=4, seed=9)
                out = load_all(ds, autoproxy=True, collate_fn=collate_fn, batch_size=4, seed=9, device="cpu")
                levels = TENSOR_RESIZE_LEVELS if backend != "pil" and augmentation == "multiscale" else 0
                assert_same_detection(ref, out, levels=levels)
                rep = last_report()
                assert rep["proxied"] and rep["decode"] == "DALI 100%", (use_v2, backend, augmentation, rep)
        for backend in ("pil", "tensor"):
            ds = coco_dataset(coco_root, presets.DetectionPresetTrain(data_augmentation="lsj", backend=backend,
                                                                      use_v2=True))
            errors = []
            for proxied in (False, True):
                with pytest.raises(ValueError) as info:
                    load_all(ds, autoproxy=proxied, collate_fn=collate_fn, batch_size=4, seed=9, device="cpu")
                errors.append(str(info.value).strip().splitlines()[-1])
            assert errors[0] == errors[1] and "No bounding boxes" in errors[0], errors
    finally:
        sys.path.remove(os.path.join(where, "detection"))
        sys.modules.pop("presets", None)
        sys.modules.pop("transforms", None)
    dali_autoproxy.disable()


def test_the_detection_references_v1_data_path_unchanged(tmp_path, coco_root):
    """torchvision's references' v1 path unchanged (TORCHVISION_REFERENCES): ``coco_utils.get_coco``
    (its CocoDetection and ConvertCocoPolysToMask: boxes, labels, masks from the polygons, image
    id, area, iscrowd; images without annotations removed) with ``presets.DetectionPresetTrain(
    use_v2=False)`` of the references' own ``transforms.py``. Targets equal plain's for every
    augmentation, and every one decodes on DALI (ssd's channel shuffle, which goes through a
    float tensor and back to a PIL image, recorded as the image's channel permutation)."""
    where = os.environ.get("TORCHVISION_REFERENCES")
    if not where:
        pytest.skip("set TORCHVISION_REFERENCES to the references folder of a pytorch/vision checkout")
    root, annotations = coco_root
    os.symlink(os.path.join(root, "images"), tmp_path / "train2017")
    (tmp_path / "annotations").mkdir()
    os.symlink(annotations, tmp_path / "annotations" / "instances_train2017.json")
    sys.path.insert(0, os.path.join(where, "detection"))
    decodes = {}
    try:
        import coco_utils
        import presets
        for augmentation in ("hflip", "lsj", "multiscale", "ssd", "ssdlite"):
            train = presets.DetectionPresetTrain(data_augmentation=augmentation, backend="pil", use_v2=False)
            ds = coco_utils.get_coco(str(tmp_path), "train", train)
            kw = dict(collate_fn=collate_fn, batch_size=4, seed=9, shuffle=True)
            ref = load_all(ds, autoproxy=False, **kw)
            out = load_all(ds, autoproxy=True, device="cpu", **kw)
            assert_same_detection(ref, out)
            rep = last_report()
            decodes[augmentation] = rep["decode"] if rep["proxied"] else rep["reason"]
    finally:
        sys.path.remove(os.path.join(where, "detection"))
        for name in ("presets", "transforms", "coco_utils"):
            sys.modules.pop(name, None)
    assert decodes == dict.fromkeys(("hflip", "lsj", "multiscale", "ssd", "ssdlite"), "DALI 100%"), decodes


def _references_module_path(folder):
    where = os.environ.get("TORCHVISION_REFERENCES")
    if not where:
        pytest.skip("set TORCHVISION_REFERENCES to the references folder of a pytorch/vision checkout")
    return os.path.join(where, folder)


@pytest.mark.parametrize("source,use_v2", [("voc", False), ("coco", False), ("coco", True)])
def test_the_segmentation_references_presets_unchanged(tmp_path, coco_root, source, use_v2):
    """torchvision's own ``references/segmentation`` (TORCHVISION_REFERENCES; its ``v2_extras.py``
    with PadIfSmaller's methods named ``make_params`` and ``transform``, which torchvision 0.29's
    v2.Transform calls, where older copies say ``_get_params`` and ``_transform``): ``presets.py``'s
    train and eval presets, v1 (its ``transforms.py``: Python's ``random``, the PIL mask resized
    with NEAREST, padded with 255) and v2 (``v2_extras.PadIfSmaller``), over a VOC-format set
    and ``coco_utils.get_coco`` (its category remap, the polygons merged into one mask, the
    images without annotations removed; v2: ``CocoDetectionToVOCSegmentation``), as its
    ``train.py`` builds them. Masks bit-equal to plain's, images within Normalize's float32
    rounding, decode on DALI."""
    folder = _references_module_path("segmentation")
    if source == "coco":
        root, annotations = coco_root
        os.symlink(os.path.join(root, "images"), tmp_path / "train2017")
        (tmp_path / "annotations").mkdir()
        os.symlink(annotations, tmp_path / "annotations" / "instances_train2017.json")
    else:
        make_voc(str(tmp_path))
    sys.path.insert(0, folder)
    try:
        import presets
        for train in (True, False):
            preset = (presets.SegmentationPresetTrain(base_size=160, crop_size=128, use_v2=use_v2) if train
                      else presets.SegmentationPresetEval(base_size=160, use_v2=use_v2))
            if source == "coco":
                import coco_utils
                ds = coco_utils.get_coco(str(tmp_path), "train", preset, use_v2=use_v2)
            else:
                ds = VOCSegmentation(str(tmp_path), image_set="train", transforms=preset)
            kw = dict(batch_size=4, seed=3, shuffle=True) if train else dict(batch_size=4, collate_fn=collate_fn)
            ref = load_all(ds, autoproxy=False, **kw)
            out = load_all(ds, autoproxy=True, device="cpu", **kw)
            assert len(ref) == len(out) > 0
            for (xa, ma), (xb, mb) in zip(ref, out):
                if not train:
                    assert [x.shape for x in xa] == [x.shape for x in xb]
                    xa, xb = torch.cat([x.flatten() for x in xa]), torch.cat([x.flatten() for x in xb])
                    ma, mb = torch.cat([m.flatten() for m in ma]), torch.cat([m.flatten() for m in mb])
                assert ma.dtype == mb.dtype and torch.equal(ma, mb)
                assert xa.shape == xb.shape and float((xa - xb).abs().max()) < 1e-5
            rep = last_report()
            assert rep["proxied"] and rep["decode"] == "DALI 100%", (train, rep)
    finally:
        sys.path.remove(folder)
        for name in ("presets", "transforms", "coco_utils", "v2_extras"):
            sys.modules.pop(name, None)


def test_the_stage_takes_samples_of_their_own_sizes_as_one_padded_batch():
    """A joint plan's calls on samples of different sizes, padded into one batch: per-pixel calls on
    all at once, a contrast (a mean) on each sample's own region, flips within each sample: equal
    to each sample computed alone."""
    import numpy as np
    from photos import photographs

    from dali_autoproxy.backends.torch_stage import TorchStage
    from dali_autoproxy.plan.ir import Flip
    from dali_autoproxy.plan.pillow_ops import CALL_CODE, RaggedPillowCall
    photo = photographs()[1]
    samples = [torch.from_numpy(np.ascontiguousarray(photo[:h, :w])) for h, w in ((40, 64), (57, 33), (21, 90))]
    ops = [RaggedPillowCall(0), RaggedPillowCall(4), Flip(8), Flip(9, vertical=True)]
    rows = np.array([[CALL_CODE["contrast"], 0.6, 0, 0, CALL_CODE["hue"], 12, 0, 0, 1, 0],
                     [CALL_CODE["brightness"], 1.3, 0, 0, CALL_CODE["permute"], 2, 0, 1, 0, 1],
                     [CALL_CODE["contrast"], 1.7, 0, 0, CALL_CODE["color"], 0.2, 0, 0, 1, 1]], dtype=np.float64)
    together = TorchStage(ops)(samples, rows)
    for k, s in enumerate(samples):
        alone = TorchStage(ops)(s.unsqueeze(0), rows[k:k + 1])[0]
        assert torch.equal(together[k], alone), k


def test_the_stage_runs_torchvisions_tensor_colour_kernels_on_samples_of_their_own_sizes():
    """The recorded tensor colour calls (v1's and v2's adjust_contrast, hue, saturation,
    brightness) on a padded batch of photographs of different sizes, each contrast over its
    sample's own region in one pass: every pixel equal to torchvision's own kernels on each
    sample alone."""
    import numpy as np
    import torchvision.transforms.functional as F1
    import torchvision.transforms.v2.functional as F2
    from photos import photographs

    from dali_autoproxy.backends.torch_stage import TorchStage
    from dali_autoproxy.plan.pillow_ops import CALL_CODE, RaggedPillowCall
    code = CALL_CODE
    rows = np.array([[code["tv_contrast"], 0.6, 1, 0, code["tv_hue"], 0.03, 1, 0],
                     [code["tv_contrast"], 1.3, 0, 0, code["tv_saturation"], 1.4, 0, 0],
                     [code["tv_contrast"], 1.7, 1, 0, code["tv_brightness"], 0.9, 1, 0],
                     [code["tv_saturation"], 0.5, 1, 0, code["tv_contrast"], 1.45, 0, 0]], dtype=np.float64)
    names = {c: n[len("tv_"):] for n, c in code.items() if n.startswith("tv_")}
    for photo in photographs()[:3]:
        samples = [torch.from_numpy(np.ascontiguousarray(photo[:h, :w]))
                   for h, w in ((140, 164), (157, 133), (121, 190), (90, 90))]
        together = TorchStage([RaggedPillowCall(0), RaggedPillowCall(4)])(samples, rows)
        for k, sample in enumerate(samples):
            expected = sample.permute(2, 0, 1).contiguous()
            for at in (0, 4):
                functional = F2 if rows[k, at + 2] else F1
                expected = getattr(functional, f"adjust_{names[rows[k, at]]}")(expected, float(rows[k, at + 1]))
            got = together[k].permute(2, 0, 1) if together[k].shape[-1] == 3 else together[k]
            assert torch.equal(got, expected), k


@pytest.mark.parametrize("sliced", [False, True])
def test_a_pad_then_a_crop_inside_it_is_one_crop(sliced, monkeypatch):
    """RandomZoomOut's canvas then RandomIoUCrop inside it, with unused recorded-call positions
    between them: one crop of the image at the composed box, the fill outside the image; equal
    to the two crops run one after the other, by the gather and by the per-sample copies; a
    second box that leaves the first runs both crops."""
    import numpy as np
    from photos import photographs

    from dali_autoproxy.backends.torch_stage import TorchStage, resample
    from dali_autoproxy.plan.ir import Crop
    from dali_autoproxy.plan.pillow_ops import CALL_CODE, RaggedPillowCall
    monkeypatch.setattr(resample, "SLICED_CROP_PIXELS", 0 if sliced else 1 << 40)
    monkeypatch.setattr(resample, "SLICED_CROP_SAMPLES", 0)  # the canvas's size decides
    photo = photographs()[0]
    samples = [torch.from_numpy(np.ascontiguousarray(photo[:h, :w])) for h, w in ((40, 64), (57, 33), (21, 90))]
    ops = [Crop(0, fill=(123.0, 117.0, 104.0)), RaggedPillowCall(4), Crop(8), RaggedPillowCall(12)]
    canvases = [[-10, -7, 61, 80], [0, 0, 57, 33], [-30, -5, 90, 110]]  # (top, left, height, width)
    for inner, fused in (([[3, 2, 50, 70], [5, 6, 20, 20], [0, 0, 90, 110]], True),
                         ([[3, 2, 60, 70], [5, 6, 20, 20], [0, 0, 90, 110]], False)):  # 3 + 60 > 61: not fused
        rows = np.zeros((3, 16))
        rows[:, 0:4], rows[:, 8:12] = canvases, inner
        rows[1, 12:16] = [CALL_CODE["brightness"], 1.3, 0, 0]  # after the crops: used
        calls = []
        real = resample.crop_boxes
        monkeypatch.setattr(resample, "crop_boxes", lambda *a: calls.append(1) or real(*a))
        together = TorchStage(ops)(samples, rows)
        assert len(calls) == (1 if fused else 2)
        from dali_autoproxy.backends.torch_stage.registry import FUSED_RUNS
        monkeypatch.setitem(FUSED_RUNS, Crop, lambda *a: None)
        apart = TorchStage(ops)(samples, rows)
        monkeypatch.undo()
        monkeypatch.setattr(resample, "SLICED_CROP_PIXELS", 0 if sliced else 1 << 40)
        monkeypatch.setattr(resample, "SLICED_CROP_SAMPLES", 0)  # the canvas's size decides
        for a, b in zip(together, apart):
            assert torch.equal(a, b)


def test_joint_shapes_merge_into_one_supersequence():
    from dali_autoproxy.plan.translate.recorded import _supersequence
    assert _supersequence(("pad", "crop", "hflip"), ("crop", "vflip")) == ("pad", "crop", "hflip", "vflip")
    assert _supersequence((), ("resize",)) == ("resize",)


def test_two_workers_joint_shapes_merge_into_one_that_fits_both():
    from dali_autoproxy.plan.record.learnt import MAX_SIZE_CHANGES
    from dali_autoproxy.plan.translate.recorded import fit, merged_joint_shape
    tail = (("tensor", "pil_to_tensor"),)
    a = (("resize", "hflip", "crop") + tail, (1, 2, 0, 0, 0))
    b = (("resize", ("pad", 0), "crop") + tail, (0, 0, 3, 0, 0))
    merged = merged_joint_shape(a, b)
    assert merged[0] == ("resize", "hflip", ("pad", 0), "crop") + tail
    for shape in (a, b):  # a sample either fitted fits the merge (its calls too: the widest runs)
        tokens = shape[0]
        runs = [[("call",)] * w for w in shape[1]]
        assert fit(merged, tokens, runs) is not None
    assert merged_joint_shape(a, (("resize",) + (("tensor", "to_tensor"),), (0, 0, 0))) is None  # other tensor steps
    too_long = (tuple(("pad", k) for k in range(MAX_SIZE_CHANGES)) + tail, (0,) * (MAX_SIZE_CHANGES + 2))
    assert merged_joint_shape(a, too_long) is None


def test_detr_data_path_unchanged(tmp_path):
    """DETR's own ``datasets/coco.py`` and ``datasets/transforms.py`` (set DETR_DIR to a checkout of
    facebookresearch/detr), its training transforms and collate, run unchanged in a subprocess plain
    and with DALI_AUTOPROXY=1: decode on DALI, the boxes (normalised cxcywh), masks, labels and
    padded batches equal to plain's."""
    where = os.environ.get("DETR_DIR")
    if not where:
        pytest.skip("set DETR_DIR to a checkout of facebookresearch/detr")
    import subprocess
    root = str(tmp_path)
    annotations = make_coco(root, n=8, large=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "detr_data.py")
    runs = []
    for env in ({}, {"DALI_AUTOPROXY": "1", "DALI_AUTOPROXY_DEVICE": "cpu"}):
        out = str(tmp_path / f"run{len(runs)}.pt")
        e = {k: v for k, v in os.environ.items() if k != "DALI_AUTOPROXY"}
        res = subprocess.run([sys.executable, script, os.path.join(root, "images"), annotations, out],
                             env=dict(e, **env), capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(torch.load(out))
    plain, auto = runs
    rep = auto["report"]
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    for a, b in zip(plain["batches"], auto["batches"]):
        assert torch.equal(a["mask"], b["mask"])
        assert float((a["tensors"] - b["tensors"]).abs().max()) < 1e-5  # Normalize's float32 maths
        for ta, tb in zip(a["targets"], b["targets"]):
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


class ReferencesStyleCompose:
    """Joint transforms written as the detection references' v1 ``transforms.py`` writes them (the
    user's own classes: ``__call__(image, target)``, torchvision's v1 functional ops on the PIL
    image, the boxes changed in place)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for t in self.transforms:
            image, target = t(image, target)
        return image, target


class JointFlip(torch.nn.Module):
    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        if torch.rand(1) < 0.5:
            image = F.hflip(image)
            _, _, width = F.get_dimensions(image)
            target["boxes"][:, [0, 2]] = width - target["boxes"][:, [2, 0]]
        return image, target


class JointZoomOut(torch.nn.Module):
    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        if torch.rand(1) >= 0.5:
            return image, target
        _, h, w = F.get_dimensions(image)
        r = 1 + torch.rand(1) * 1.5
        left, top = int((int(w * r) - w) * torch.rand(1)), int((int(h * r) - h) * torch.rand(1))
        image = F.pad(image, [left, top, int(w * r) - w - left, int(h * r) - h - top], fill=(123, 117, 104))
        target["boxes"][:, 0::2] += left
        target["boxes"][:, 1::2] += top
        return image, target


class JointToTensor(torch.nn.Module):
    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        return F.convert_image_dtype(F.pil_to_tensor(image), torch.float), target


class CocoWithTarget(torch.utils.data.Dataset):
    """The references' ``coco_utils`` shape: a dataset that builds each target dict and calls
    ``self._transforms(img, target)``."""

    def __init__(self, coco_root, transforms):
        from torchvision.datasets import CocoDetection as Coco
        self.coco = Coco(os.path.join(coco_root[0], "images"), coco_root[1])
        self._transforms = transforms

    def __len__(self):
        return len(self.coco)

    def __getitem__(self, i):
        img, anns = self.coco[i]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        target = {"boxes": boxes, "labels": torch.tensor([a["category_id"] for a in anns]), "image_id": i}
        return self._transforms(img, target)


@pytest.mark.parametrize("device", DEVICES)
def test_users_own_joint_classes_go_to_dali(coco_root, device):
    """Joint classes of the user's own code (the references' v1 style): the outermost one is taken,
    its calls recorded (flips, a pad with the mean colour, the tensor), the boxes plain's."""
    chain = ReferencesStyleCompose([JointZoomOut(), JointFlip(), JointToTensor()])
    ds = CocoWithTarget(coco_root, chain)
    ref = load_all(ds, autoproxy=False, collate_fn=collate_fn, batch_size=4, seed=6, shuffle=True)
    out = load_all(ds, autoproxy=True, collate_fn=collate_fn, batch_size=4, seed=6, shuffle=True, device=device)
    assert_same_detection(ref, out, device)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    assert rep["dali_transforms"][1:] == ["ReferencesStyleCompose with its targets (JointZoomOut -> JointFlip -> "
                                          "JointToTensor)"], rep


class JointChannelShuffle(torch.nn.Module):
    """The detection references' v1 channel shuffle as users copy it: a PIL image through a
    float tensor, its channels indexed, back to a PIL image (``order`` fixed: a repeated channel
    is no permutation)."""

    def __init__(self, order=None):
        super().__init__()
        self.order = order

    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        if torch.rand(1) < 0.5:
            order = torch.randperm(3) if self.order is None else torch.tensor(self.order)
            image = F.convert_image_dtype(F.pil_to_tensor(image))
            image = F.to_pil_image(image[..., order, :, :])
        return image, target


@pytest.mark.parametrize("device", DEVICES)
def test_a_channel_shuffle_through_a_tensor_goes_to_dali(coco_root, device):
    """PIL -> float tensor -> channels indexed -> PIL is the image's channel permutation (every
    uint8 value survives the float round trip): recorded, decoded on DALI, plain's pixels."""
    chain = ReferencesStyleCompose([JointChannelShuffle(), JointFlip(), JointToTensor()])
    assert_on_dali_as_plain(CocoWithTarget(coco_root, chain), device, seed=4)


def test_a_repeated_channel_index_needs_pixels(coco_root):
    chain = ReferencesStyleCompose([JointChannelShuffle(order=[0, 0, 2]), JointToTensor()])
    ds = CocoWithTarget(coco_root, chain)
    kw = dict(collate_fn=collate_fn, batch_size=4, seed=4)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device="cpu", **kw)
    assert_same_detection(ref, out)
    rep = last_report()  # the shuffled samples: decoded in the worker, for that reason
    assert rep["decode_on_dali"] and "needs pixels (tensor __getitem__)" in rep["decode"], rep


class WithKeypoints(JPEGFiles):
    """Samples with boxes and keypoints (v2's ``tv_tensors.KeyPoints``) through a v2 chain."""

    def __getitem__(self, i):
        from PIL import Image
        img = Image.open(self.files[i]).convert("RGB")
        w, h = img.size
        points = torch.tensor([[w * 0.2, h * 0.3], [w * 0.7, h * 0.6], [w * 0.5, h * 0.9]])
        target = {"boxes": tv_tensors.BoundingBoxes([[1, 2, w // 2, h // 2], [w // 4, h // 4, w - 1, h - 1]],
                                                   format="XYXY", canvas_size=(h, w)),
                  "keypoints": tv_tensors.KeyPoints(points, canvas_size=(h, w)), "labels": torch.tensor([1, 2])}
        return self.transforms(img, target)


def test_keypoints_are_plains(coco_root):
    if not hasattr(tv_tensors, "KeyPoints"):
        pytest.skip("this torchvision has no tv_tensors.KeyPoints")
    chain = v2.Compose([v2.RandomHorizontalFlip(), v2.RandomZoomOut(p=0.5), v2.RandomIoUCrop(),
                        v2.RandomShortestSize(min_size=(96, 128), max_size=256), v2.PILToTensor(),
                        v2.SanitizeBoundingBoxes()])
    ds = WithKeypoints(coco_root[0], chain)
    ref = load_all(ds, autoproxy=False, collate_fn=collate_fn, batch_size=4, seed=8, shuffle=True)
    out = load_all(ds, autoproxy=True, collate_fn=collate_fn, batch_size=4, seed=8, shuffle=True, device="cpu")
    assert_same_detection(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep


class JointShuffleChannels(torch.nn.Module):
    """The references' v1 RandomPhotometricDistort in short: a ColorJitter on the PIL image (a
    chain taken on its own, inside a joint call that is not), then the channels rolled on a
    tensor (``torch.roll``: pixels needed), then back to a PIL image."""

    def __init__(self):
        super().__init__()
        import torchvision.transforms as T1
        self.jitter = T1.ColorJitter(brightness=0.3)

    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        image = self.jitter(image)
        shuffled = F.convert_image_dtype(F.pil_to_tensor(image)).roll(int(torch.randint(1, 3, (1,))), dims=0)
        return F.to_pil_image(shuffled), target


class JointPILToTensor(torch.nn.Module):
    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        return F.pil_to_tensor(image), target


class JointToFloat(torch.nn.Module):
    def forward(self, image, target=None):
        import torchvision.transforms.functional as F
        return F.convert_image_dtype(image, torch.float), target


def test_a_subsets_batch_that_fails_on_a_proxied_result_runs_plain(coco_root):
    """The references' v1 ssd shape in a Subset, which fetches its batch with ``__getitems__``:
    the outer joint call needs pixels and runs as written, a later joint call alone (the tensor
    conversion) is taken, and the next one fails on its proxied result. The whole batch runs
    again from the same RNG state with those calls plain: plain's samples, not the dataset's
    error."""
    chain = ReferencesStyleCompose([JointShuffleChannels(), JointFlip(), JointPILToTensor(), JointToFloat()])
    ds = torch.utils.data.Subset(CocoWithTarget(coco_root, chain), range(10))
    kw = dict(collate_fn=collate_fn, batch_size=4, seed=8, shuffle=True)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device="cpu", **kw)
    assert_same_detection(ref, out)


def test_random_iou_crops_params_are_torchvisions_own():
    """The workers' RandomIoUCrop.make_params (numpy float32): for 800 samples (boxes in
    every format, image sizes from tiny to COCO's, the options' every overlap) the same crop and
    the same boxes inside it as torchvision's own method, the same draws from torch's generator
    (its state after equal), the same exception for an image too small to crop."""
    import numpy as np

    from dali_autoproxy.worker import iou_crop
    assert iou_crop.SAME_CODE, "torchvision's RandomIoUCrop.make_params is not the code iou_crop replaces"
    rng = np.random.default_rng(0)
    crop, raised = v2.RandomIoUCrop(), 0
    for k in range(800):
        h, w = (int(rng.integers(1, 4)), int(rng.integers(1, 700))) if k % 50 == 0 else (
            int(rng.integers(20, 700)), int(rng.integers(20, 700)))
        n = int(rng.integers(0 if k % 97 == 0 else 1, 8))
        x0, y0 = rng.uniform(-5, w, n), rng.uniform(-5, h, n)
        xyxy = np.stack([x0, y0, x0 + rng.uniform(0, w, n), y0 + rng.uniform(0, h, n)], 1).astype(np.float32)
        fmt = ("XYXY", "XYWH", "CXCYWH")[k % 3]
        boxes = tv_tensors.BoundingBoxes(torch.from_numpy(xyxy), format="XYXY", canvas_size=(h, w))
        boxes = v2.ConvertBoundingBoxFormat(fmt)(boxes)
        flat = [tv_tensors.Image(torch.zeros(3, h, w, dtype=torch.uint8)), boxes]
        if n == 0:  # torchvision loops until it draws the leave-as-is option
            crop.options = [0.5, 1.0]
        outcomes = []
        for run in (lambda: v2.RandomIoUCrop.make_params(crop, flat),
                    lambda: iou_crop.iou_crop_params(None, crop, (flat,), {})):
            torch.manual_seed(k)
            try:
                out = run()
            except ZeroDivisionError:
                out = "ZeroDivisionError"
            outcomes.append((out, torch.get_rng_state()))
        crop.options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
        (a, state_a), (b, state_b) = outcomes
        assert torch.equal(state_a, state_b), k
        raised += a == "ZeroDivisionError"
        if isinstance(a, str) or not a:
            assert a == b, (k, a, b)
            continue
        assert a.keys() == b.keys() and all(a[key] == b[key] for key in ("top", "left", "height", "width")), (k, a, b)
        assert torch.equal(a["is_within_crop_area"], b["is_within_crop_area"]), k
    assert raised > 0
