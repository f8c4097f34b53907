"""Recorded size changes: a user's class that crops and resizes (with Pillow's methods or
torchvision's functional API on PIL images) runs on DALI's side, every pixel equal to plain's
(real DataLoader workers, DALI's CPU backend, photographs); what Pillow would do differently
(a box Pillow refuses, a filter it has no exact kernel for, QUAD and MESH) needs pixels and runs in
the worker, exactly plain."""
import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as F2
from helpers import image_folder, last_report, load_all
from PIL import Image, ImageFilter

from dali_autoproxy.plan.record.image import NeedsPixels, RecordingImage, recording


class UserClass:
    """A few-line class of a user's, drawing with Python's random as such code does."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, img):
        return self.fn(img)


def _patch(img):
    w, h = img.size
    x, y = random.randint(0, w - 50), random.randint(0, h - 40)
    img = img.crop((x, y, x + 50, y + 40))
    if random.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(random.uniform(0.1, 2)))
    return img.resize((48, 48), random.choice([Image.NEAREST, Image.BILINEAR, Image.BICUBIC, Image.BOX]))


GEOMETRY = {
    "crop_in_bounds": lambda img: img.crop((5, 7, 69, 55)),
    "crop_past_the_edges": lambda img: img.crop((img.width - 50, -4, img.width + 9, 50)),
    "crop_float_box": lambda img: img.crop((3.4, 2.6, 60.5, 41.49)),
    "resize_default_bicubic": lambda img: img.resize((130, 70)),
    "resize_each_filter": lambda img: img.resize((45, 37), random.choice([0, 1, 2, 3, 4, 5])),
    "resize_lanczos_up": lambda img: img.resize((130, 101), Image.LANCZOS),
    "resize_a_random_box": lambda img: img.resize(
        (40, 30), random.choice([0, 1, 2, 3, 4, 5]),
        box=(random.uniform(0, 20), random.uniform(0, 10), random.uniform(40, img.width), img.height - 0.5)),
    "reduce": lambda img: img.reduce(random.choice([2, 3])).resize((40, 30), Image.BILINEAR),
    "reduce_a_box": lambda img: img.reduce((2, 3), box=(4, 2, 91, 60)),
    "resize_reducing_gap": lambda img: img.resize((20, 15), Image.BILINEAR, reducing_gap=1.5),
    "resize_a_box_reducing_gap": lambda img: img.resize((33, 21), random.choice([1, 2, 3, 4, 5]),
                                                        box=(3.5, 2, 90, 60), reducing_gap=2.0),
    "resize_a_box_to_its_size": lambda img: img.resize((50, 40), Image.HAMMING, box=(3, 2, 53, 42)),
    "resize_reducing_gap_no_reduction": lambda img: img.resize((80, 57), Image.BILINEAR, reducing_gap=8.0),
    "tf_resize_center_crop": lambda img: TF.center_crop(TF.resize(img, 80), 64),
    "tf_resized_crop": lambda img: TF.resized_crop(img, random.randint(0, 20), random.randint(0, 30), 60, 70,
                                                   [48, 40]),
    "v2_resized_crop_nearest": lambda img: F2.resized_crop(img, 10, 12, 50, 61, [33, 29],
                                                           interpolation=T.InterpolationMode.NEAREST),
    "crop_blur_resize": _patch,
    "rotate_nearest": lambda img: img.crop((0, 0, 80, 60)).rotate(random.uniform(-30, 30)),
    "rotate_bilinear_some": lambda img: (img.resize((64, 48), Image.BILINEAR) if random.random() < 0.5 else
                                         img.resize((64, 48), Image.BILINEAR).rotate(
                                             random.uniform(-45, 45), Image.BILINEAR, fillcolor=(9, 200, 40))),
    "tf_perspective_some": lambda img: TF.perspective(
        TF.center_crop(img, [64, 80]), [[0, 0], [79, 0], [79, 63], [0, 63]],
        [[3, 5], [75, 1], [70, 60], [random.randint(0, 9), 58]],
        interpolation=random.choice([T.InterpolationMode.NEAREST, T.InterpolationMode.BILINEAR]),
    ) if random.random() < 0.7 else TF.center_crop(img, [64, 80]),
    "blend_with_a_blurred_branch": lambda img: Image.blend(
        img.crop((0, 0, 64, 48)), img.crop((0, 0, 64, 48)).filter(ImageFilter.GaussianBlur(random.uniform(0.5, 2))),
        random.random()),
    "rotate_expand": lambda img: img.crop((0, 0, 80, 60)).rotate(random.uniform(-40, 40), expand=True).resize(
        (72, 72), Image.BILINEAR),  # each image its own size until the resize
    "rotate_expand_bilinear_fill": lambda img: img.rotate(random.choice([17.0, 33.5]), Image.BILINEAR, expand=True,
                                                          fillcolor=(200, 30, 90)).crop((0, 0, 90, 90)),
    "quarter_turns_non_square": lambda img: img.crop((0, 0, 70, 50)).transpose(random.choice(
        [Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_270, Image.Transpose.TRANSPOSE,
         Image.Transpose.TRANSVERSE])),
    "rotate_90_expand": lambda img: img.crop((3, 3, 63, 43)).rotate(90, expand=True),
    "transform_to_another_size": lambda img: img.transform((50, 70), Image.Transform.AFFINE,
                                                           (0.9, 0.1, 3.0, -0.1, 0.8, 5.0)),
    "perspective_to_another_size": lambda img: img.transform(
        (60, 40), Image.Transform.PERSPECTIVE, (1.0, 0.05, 2.0, 0.02, 1.1, 1.0, 0.0005, 0.001), Image.BILINEAR),
    "tf_rotate_affine": lambda img: TF.affine(TF.rotate(TF.center_crop(img, [70, 90]), 17.0), angle=5.0,
                                              translate=[3, -2], scale=1.1, shear=[4.0, 0.0]),
}


def _epochs(ds, **kw):
    runs = []
    for proxied in (False, True):
        random.seed(11)
        np.random.seed(11)
        runs.append(load_all(ds, autoproxy=proxied, seed=2, **kw))
    return runs


@pytest.mark.parametrize("name", sorted(GEOMETRY))
def test_a_users_crops_and_resizes_run_on_dali_equal_to_plain(photo_root, name):
    ds = image_folder(photo_root, T.Compose([UserClass(GEOMETRY[name]), T.RandomHorizontalFlip(), T.PILToTensor()]))
    ref, out = _epochs(ds)
    assert len(ref) == len(out)
    for (xa, ya), (xb, yb) in zip(ref, out):
        assert torch.equal(ya, yb) and xa.shape == xb.shape
        assert torch.equal(xa, xb), int((xa.int() - xb.int()).abs().max())
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


def test_size_changes_after_a_torchvision_crop_and_before_normalize(photo_root):
    """After RandomResizedCrop (DALI's crop, the exact resize) and before ToTensor/Normalize."""
    chain = T.Compose([T.RandomResizedCrop(96), UserClass(_patch), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
    ref, out = _epochs(image_folder(photo_root, chain), resize="pillow")
    for (xa, _), (xb, _) in zip(ref, out):
        assert float((xa - xb).abs().max()) < 1e-5  # the same uint8 image, normalised in float32
    assert last_report()["decode"] == "DALI 100%"


def _record(fn, size=(96, 64)):
    recording.active += 1
    try:
        return fn(RecordingImage(size, "RGB"))
    finally:
        recording.active -= 1


def test_recorded_sizes_are_pillows(pillow_hooks):
    for fn in list(GEOMETRY.values())[:-1]:
        random.seed(3)
        got = _record(fn)
        random.seed(3)
        want = fn(Image.new("RGB", (96, 64)))
        assert got.size == want.size and got.mode == want.mode


@pytest.mark.parametrize("call", [
    lambda img: img.resize((40, 30), box=(0, 0, 97, 40)),
    lambda img: img.resize((40, 30), box=(20, 0, 10, 40)),
    lambda img: img.reduce(2.5),
    lambda img: img.reduce(2, box=(0, 0, 200, 10)),
    lambda img: img.resize((20.5, 15)),
    lambda img: img.crop((10, 10, 10, 20)),
    lambda img: img.crop((30, 10, 20, 20)),
    lambda img: img.rotate(20, Image.BICUBIC),
    lambda img: img.rotate(20, fillcolor=128),
    lambda img: img.transform((40.5, 30), Image.Transform.AFFINE, (1, 0, 0, 0, 1, 0)),
    lambda img: img.transform((96, 64), Image.Transform.PERSPECTIVE, (1, 0, 0, 0, 1, 0, 0, 0), Image.BICUBIC),
    lambda img: img.transform((96, 64), Image.Transform.QUAD, (0, 0, 0, 64, 96, 64, 96, 0)),
], ids=["box_past_the_edge", "box_reversed", "reduce_by_a_float", "reduce_box_past_the_edge", "float_size",
        "empty_crop", "reversed_crop",
        "bicubic_rotate", "int_fill", "affine_float_size", "bicubic_perspective", "quad"])
def test_what_pillow_does_otherwise_needs_pixels(call):
    with pytest.raises(NeedsPixels):
        _record(call)


@pytest.mark.parametrize("name", ["box", "reversed"])
def test_a_class_whose_size_change_needs_pixels_is_plains(photo_root, name):
    """A class converting to a mode without a kernel runs in the worker with the rest of the
    class; a reversed crop box raises Pillow's own ValueError, as plain."""
    fn = {"box": lambda img: img.crop((0, 0, 80, 60)).reduce(2).convert("HSV").convert("RGB"),
          "reversed": lambda img: img.crop((30, 10, 20, 20))}[name]
    ds = image_folder(photo_root, T.Compose([UserClass(fn), T.PILToTensor()]))
    if name == "reversed":
        for proxied in (False, True):
            with pytest.raises(ValueError, match="Coordinate 'right' is less than 'left'"):
                load_all(ds, autoproxy=proxied)
        return
    ref, out = _epochs(ds)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ref, out))
    rep = last_report()
    assert "worker" in rep["decode"] and "UserClass" in str(rep["worker_transforms"] or rep["decode"]), rep


def test_a_size_change_inside_random_apply(photo_root):
    """RandomApply around a class that crops and resizes back: applied to some samples only, the
    others pass; the whole RandomApply is recorded (its coin drawn as plain draws it)."""
    zoom = UserClass(lambda img: img.crop((8, 8, 88, 88)).resize((96, 96), Image.BILINEAR))
    chain = T.Compose([T.RandomResizedCrop(96), T.RandomApply([zoom], p=0.5), T.PILToTensor()])
    ref, out = _epochs(image_folder(photo_root, chain), resize="pillow")
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ref, out))
    rep = last_report()
    assert rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


# ----------------------------------------------------------------------------- the dataset's own code
class ResizingDataset(torch.utils.data.Dataset):
    """``__getitem__`` opens the file, crops or resizes it with Pillow, then calls the chain."""

    def __init__(self, root, transform, before):
        import torchvision
        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transform, self.before = transform, before

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        img = self.before(Image.open(path).convert("RGB"))
        return self.transform(img), label


BEFORE = {
    "resize_256": lambda img: img.resize((256, 256)),
    "crop_then_resize": lambda img: img.crop((10.4, 5, img.width - 3, img.height - 20)).resize((200, 150),
                                                                                               Image.BILINEAR),
    "random_size": lambda img: img.resize((random.choice([120, 130]), 110), Image.BOX),
    "reads_its_pixels": lambda img: Image.fromarray(np.asarray(img.resize((128, 96))) // 2),
    "resize_with_box": lambda img: img.resize((128, 96), box=(4, 4, 100, 90)),
    "reducing_gap": lambda img: img.resize((128, 96), Image.LANCZOS, reducing_gap=1.5),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_a_datasets_own_crop_and_resize_before_the_chain(photo_root, name):
    """Kept on the encoded JPEG and run on DALI's side before the chain (decode on DALI), every
    pixel plain's; where the dataset reads the pixels, or Pillow would compute it otherwise, the
    image decodes in the worker, as plain."""
    chain = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.PILToTensor()])
    ref, out = _epochs(ResizingDataset(photo_root, chain, BEFORE[name]), resize="pillow")
    for (xa, ya), (xb, yb) in zip(ref, out):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    rep = last_report()
    on_dali = name != "reads_its_pixels"
    assert (rep["decode"] == "DALI 100%") == on_dali, rep
    if on_dali:
        assert rep["dali_transforms"][:2] == ["decode", "DatasetResize"], rep


# ----------------------------------------------------------------------------- classes that end in a tensor
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
ENDS_IN_A_TENSOR = {
    "tf_to_tensor_normalize": lambda img: TF.normalize(TF.to_tensor(TF.center_crop(TF.resize(img, 80), 64)),
                                                       MEAN, STD),
    "tf_pil_to_tensor": lambda img: TF.pil_to_tensor(img.resize((64, 48), Image.BILINEAR)),
    "tf_convert_dtype": lambda img: TF.convert_image_dtype(TF.pil_to_tensor(img.crop((0, 0, 64, 64))), torch.float32),
    "v2_functional": lambda img: F2.normalize(F2.to_dtype(F2.to_image(F2.resized_crop(img, 4, 8, 60, 70, [48, 48])),
                                                          torch.float32, scale=True), MEAN, STD),
    "class_calls_totensor": lambda img: T.Normalize(MEAN, STD)(T.ToTensor()(img.resize((56, 56)))),
}


@pytest.mark.parametrize("name", sorted(ENDS_IN_A_TENSOR))
def test_a_class_that_returns_a_tensor_runs_on_dali(photo_root, name):
    """``return TF.normalize(TF.to_tensor(img), ...)``: recorded as the transforms it equals."""
    ds = image_folder(photo_root, T.Compose([UserClass(ENDS_IN_A_TENSOR[name])]))
    ref, out = _epochs(ds)
    for (xa, ya), (xb, yb) in zip(ref, out):
        assert xa.dtype == xb.dtype and xa.shape == xb.shape and torch.equal(ya, yb)
        assert float((xa.double() - xb.double()).abs().max()) <= (0 if xa.dtype == torch.uint8 else 1e-6)
    rep = last_report()
    assert rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


def test_arithmetic_on_the_tensor_runs_in_the_worker(photo_root):
    ds = image_folder(photo_root, T.Compose([UserClass(lambda img: TF.to_tensor(img.resize((32, 32))) * 2 - 1)]))
    ref, out = _epochs(ds)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ref, out))
    assert "worker" in last_report()["decode"]


# ----------------------------------------------------------------------------- the kernels, CPU and GPU
def _padded(images):
    h, w = max(i.shape[0] for i in images), max(i.shape[1] for i in images)
    x = torch.zeros(len(images), 3, h, w)
    for b, im in enumerate(images):
        x[b, :, :im.shape[0], :im.shape[1]] = torch.from_numpy(im).permute(2, 0, 1).float()
    return x, np.array([i.shape[:2] for i in images])


def _same_as_pillow(out, refs) -> int:
    """Samples of a padded output that differ from Pillow's images anywhere (padding included)."""
    bad = 0
    for b, ref in enumerate(refs):
        h, w = ref.shape[:2]
        got = out[b, :, :h, :w].permute(1, 2, 0).cpu().numpy().astype(np.uint8)
        bad += int(not np.array_equal(got, ref) or bool(out[b, :, h:, :].any() or out[b, :, :, w:].any()))
    return bad


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_reduce_and_warps_to_other_sizes_equal_pillow_every_pixel(device):
    """Image.reduce (factors 1-8, partial blocks at the edges) and affine/perspective transforms
    to another size (nearest and bilinear, fill outside), samples of different sizes in one padded
    batch: the torch stage's kernels against Pillow on photographs."""
    from photos import photographs

    from dali_autoproxy.backends.torch_stage.geometry import perspective, warp
    from dali_autoproxy.backends.torch_stage.resample import pillow_reduce
    rng = np.random.default_rng(7)
    photos = photographs()
    images = [np.ascontiguousarray(photos[k % len(photos)][:int(rng.integers(2, 90)), :int(rng.integers(2, 120))])
              for k in range(24)]
    x, in_hw = _padded(images)
    factors = rng.integers(1, 9, (24, 2))
    refs = [np.asarray(Image.fromarray(im).reduce((int(fx), int(fy)))) for im, (fy, fx) in zip(images, factors)]
    assert _same_as_pillow(pillow_reduce(x.to(device), in_hw, factors), refs) == 0
    out_hw = np.stack([rng.integers(5, 130, 24), rng.integers(5, 130, 24)], 1)
    matrices = np.stack([rng.uniform(0.7, 1.3, 24), rng.uniform(-0.3, 0.3, 24), rng.uniform(-10, 10, 24),
                         rng.uniform(-0.3, 0.3, 24), rng.uniform(0.7, 1.3, 24), rng.uniform(-10, 10, 24)], 1)
    fill = (30.0, 200.0, 90.0)
    for bilinear in (False, True):
        resample = Image.BILINEAR if bilinear else Image.NEAREST
        refs = [np.asarray(Image.fromarray(im).transform((int(w), int(h)), Image.Transform.AFFINE, list(m), resample,
                                                         fillcolor=(30, 200, 90)))
                for im, (h, w), m in zip(images, out_hw, matrices)]
        if bilinear:
            out = perspective(x.to(device), np.concatenate([matrices, np.zeros((24, 2))], 1), fill, True, in_hw, out_hw)
            assert _same_as_pillow(out, refs) == 0
            continue
        singles = [warp(x[b:b + 1, :, :h, :w].to(device), matrices[b:b + 1], fill, None, out_hw[b:b + 1])
                   for b, (h, w) in enumerate(in_hw)]
        assert sum(_same_as_pillow(o, [r]) for o, r in zip(singles, refs)) == 0
        assert _same_as_pillow(warp(x.to(device), matrices, fill, in_hw, out_hw), refs) == 0
