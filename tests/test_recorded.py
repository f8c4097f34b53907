"""Transforms without a translation, recorded on a recording image: every recorded Pillow call
against Pillow on photographs, every pixel (the torch stage's kernel and the CPU replay); users'
classes through real DataLoader workers on DALI's CPU backend, equal to plain for the same seeds;
classes that read pixels, mutate the image, raise, or change its mode: exactly plain's result or
exception, with the reason (class, call, file:line) in the report."""
import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as F2
from helpers import image_folder, last_report, load_all
from photos import photographs
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageOps

from dali_autoproxy.backends.cpu_replay import CPU_KERNELS
from dali_autoproxy.backends.torch_stage import TORCH_KERNELS
from dali_autoproxy.backends.torch_stage.registry import Batch
from dali_autoproxy.plan.pillow_ops import CALL_CODE, PillowCall
from dali_autoproxy.plan.planning import build_plan
from dali_autoproxy.plan.record.image import NeedsPixels, RecordingImage, recording
from dali_autoproxy.plan.record.learnt import LEARNT

# each recorded call, as user code writes it on a PIL image
USER_CALLS = {
    "gaussian_blur": lambda img, r: img.filter(ImageFilter.GaussianBlur(radius=r * 3)),
    "gaussian_blur_xy": lambda img, r: img.filter(ImageFilter.GaussianBlur((r * 2, r * 5))),
    "box_blur": lambda img, r: img.filter(ImageFilter.BoxBlur(r * 4)),
    "smooth": lambda img, r: img.filter(ImageFilter.SMOOTH),
    "builtin_kernels": lambda img, r: img.filter([ImageFilter.BLUR, ImageFilter.CONTOUR, ImageFilter.DETAIL,
                                                  ImageFilter.EDGE_ENHANCE, ImageFilter.EDGE_ENHANCE_MORE,
                                                  ImageFilter.EMBOSS, ImageFilter.FIND_EDGES, ImageFilter.SHARPEN,
                                                  ImageFilter.SMOOTH_MORE][int(r * 8)]),
    "unsharp_mask": lambda img, r: img.filter(ImageFilter.UnsharpMask(radius=0.5 + 3 * r, percent=int(50 + 200 * r),
                                                                      threshold=int(6 * r))),
    "unsharp_mask_default": lambda img, r: img.filter(ImageFilter.UnsharpMask()),
    "detail_then_box": lambda img, r: img.filter(ImageFilter.DETAIL).filter(ImageFilter.BoxBlur(r)),
    "mirror": lambda img, r: ImageOps.mirror(img),
    "flip": lambda img, r: ImageOps.flip(img),
    "rotate_180": lambda img, r: img.transpose(Image.Transpose.ROTATE_180),
    "grayscale_rgb": lambda img, r: ImageOps.grayscale(img).convert("RGB"),
    "invert": lambda img, r: ImageOps.invert(img),
    "solarize": lambda img, r: ImageOps.solarize(img, threshold=int(64 + 128 * r)),
    "posterize": lambda img, r: ImageOps.posterize(img, 1 + int(6 * r)),
    "point_lambda": lambda img, r: img.point(lambda x: 255 - x if x >= 100 else x),
    "equalize": lambda img, r: ImageOps.equalize(img),
    "autocontrast": lambda img, r: ImageOps.autocontrast(img),
    "brightness": lambda img, r: ImageEnhance.Brightness(img).enhance(0.3 + 1.4 * r),
    "contrast": lambda img, r: ImageEnhance.Contrast(img).enhance(0.3 + 1.4 * r),
    "color": lambda img, r: ImageEnhance.Color(img).enhance(0.1 + 1.8 * r),
    "sharpness": lambda img, r: ImageEnhance.Sharpness(img).enhance(2.0 * r),
    "gray_then_sharpen": lambda img, r: ImageEnhance.Sharpness(img.convert("L")).enhance(1.5).convert("RGB"),
    # torchvision's functional API on PIL images, as a user's class writes it
    "tf_colour": lambda img, r: TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(
        img, 0.5 + r), 1.5 - r), 0.2 + r),
    "tf_hue": lambda img, r: TF.adjust_hue(img, r - 0.5),
    "tf_gray3": lambda img, r: TF.rgb_to_grayscale(img, 3),
    "tf_flips_sharpness": lambda img, r: TF.adjust_sharpness(TF.vflip(TF.hflip(img)), 2.0 * r),
    "tf_policy_ops": lambda img, r: TF.equalize(TF.autocontrast(TF.posterize(TF.solarize(img, 200 * r), 4))),
    "v2_functional": lambda img, r: F2.invert(F2.adjust_saturation(F2.horizontal_flip(img), 0.25 + r)),
    "v2_hue": lambda img, r: F2.adjust_hue(img, r - 0.5),
    # Image.blend of the image with a branch made from it, either order, inside and outside [0, 1]
    "blend_with_blurred": lambda img, r: Image.blend(img, img.filter(ImageFilter.BoxBlur(1 + 3 * r)), 0.2 + 0.6 * r),
    "blend_reversed_extrapolated": lambda img, r: Image.blend(ImageOps.invert(ImageOps.mirror(img)), img,
                                                              1.7 * r - 0.3),
    "blend_then_more": lambda img, r: ImageOps.solarize(Image.blend(ImageOps.grayscale(img).convert("RGB"),
                                                                    img, r), 128),
}


def _record(fn, size, r):
    recording.active += 1
    try:
        return fn(RecordingImage(size, "RGB"), r).calls
    finally:
        recording.active -= 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", sorted(USER_CALLS))
@pytest.mark.parametrize("size", [(96, 64), (7, 5)], ids=["96x64", "7x5"])
def test_every_recorded_call_equals_pillow_every_pixel(pillow_hooks, name, size, device):
    """A batch of photograph crops, each with its own argument: the torch stage's kernel (on the
    CPU, and on the GPU: the same torch ops) and the CPU replay give Pillow's own result on every
    pixel, the border included."""
    _check_against_pillow(USER_CALLS[name], size, device)


# quarter turns keep the size of square images only (a non-square one needs pixels)
SQUARE_CALLS = {
    "rotate_90": lambda img, r: img.transpose(Image.Transpose.ROTATE_90),
    "rotate_270_then_blur": lambda img, r: img.transpose(Image.Transpose.ROTATE_270).filter(ImageFilter.BoxBlur(r)),
    "transpose_transverse": lambda img, r: img.transpose([Image.Transpose.TRANSPOSE,
                                                          Image.Transpose.TRANSVERSE][int(r > 0.5)]),
    "rotate_method_90": lambda img, r: img.rotate(90 * (1 + int(r * 2.9))),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", sorted(SQUARE_CALLS))
@pytest.mark.parametrize("size", [(48, 48), (5, 5)], ids=["48x48", "5x5"])
def test_quarter_turns_of_square_images_equal_pillow_every_pixel(pillow_hooks, name, size, device):
    _check_against_pillow(SQUARE_CALLS[name], size, device)
    if name != "rotate_method_90":  # of a non-square image: a size change, recorded (test_recorded_geometry)
        calls = _record(SQUARE_CALLS[name], (size[0] + 1, size[1]), 0.3)
        assert calls[0][0] == "warp" and calls[0][3:5] == (size[0] + 1, size[1]), calls


# torchvision's gaussian_blur on PIL (a float32 convolution in torchvision; float64 here): within one level
TORCHVISION_BLURS = {
    "tf_gaussian_blur": lambda img, r: TF.gaussian_blur(img, 5, 0.3 + 2 * r),
    "tf_gaussian_blur_rectangular": lambda img, r: TF.gaussian_blur(img, [3, 7], [0.5 + r, 2.0 - r]),
    "tf_gaussian_blur_default_sigma": lambda img, r: TF.gaussian_blur(TF.hflip(img), [1, 5]),
    "v2_gaussian_blur": lambda img, r: F2.gaussian_blur(img, [5, 5], [0.3 + 2 * r]),
    "class_calls_gaussian_blur": lambda img, r: T.GaussianBlur(9, (0.1, 2.0))(img),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", sorted(TORCHVISION_BLURS))
@pytest.mark.parametrize("size", [(96, 64), (7, 5)], ids=["96x64", "7x5"])
def test_torchvisions_blur_on_pil_within_one_level(pillow_hooks, name, size, device):
    torch.manual_seed(5)
    _check_against_pillow(TORCHVISION_BLURS[name], size, device, bound=1)


def _check_against_pillow(fn, size, device, bound: int = 0) -> None:
    w, h = size
    photos = [Image.fromarray(p) for p in photographs()]
    crops = [photos[k % 4].crop((23 * k, 11 * k, 23 * k + w, 11 * k + h)) for k in range(8)]
    draws = [k / 7 for k in range(8)]
    draw_states = []
    recorded = []
    for r in draws:
        draw_states.append(torch.get_rng_state())
        recorded.append(_record(fn, size, r))
    width = max(len(c) for c in recorded)
    assert width >= 1
    n = PillowCall.width()
    ops = [PillowCall(n * k) for k in range(width)]
    rows = np.zeros((len(crops), n * width))
    for i, calls in enumerate(recorded):
        for k, (call, *values) in enumerate(calls):
            rows[i, n * k:n * k + n] = (CALL_CODE[call], *values)
    x = torch.stack([torch.from_numpy(np.array(c)).permute(2, 0, 1) for c in crops]).float().to(device)
    batch = Batch(rows, torch.from_numpy(rows).to(device))
    for op in ops:
        x = TORCH_KERNELS[op](x, op, batch)
    for i, crop in enumerate(crops):
        state = torch.get_rng_state()
        torch.set_rng_state(draw_states[i])
        want = np.asarray(fn(crop, draws[i]).convert("RGB"))
        torch.set_rng_state(state)
        got = x[i].permute(1, 2, 0).to(torch.uint8).cpu().numpy()
        assert int(np.abs(got.astype(int) - want).max()) <= bound, (i, int(np.abs(got.astype(int) - want).max()))
        replayed = crop
        for op in ops:
            replayed = CPU_KERNELS[op](replayed, op, rows[i], False)
        assert np.array_equal(np.asarray(replayed), want), i


def test_calls_that_need_pixels_say_which_and_where(pillow_hooks):
    def reads(img, r):
        return np.asarray(img)  # this line is named
    with pytest.raises(NeedsPixels) as info:
        _record(reads, (8, 8), 0)
    assert "test_recorded.py" in info.value.where and info.value.what == "Image.__array_interface__"
    for fn in (lambda img: img.reduce(2.5), lambda img: img.getpixel((0, 0)),
               lambda img: img.point(lambda v: v // 2), lambda img: img.filter(ImageFilter.Kernel((3, 3), [1] * 9)),
               lambda img: ImageDraw.Draw(img), lambda img: img.convert("HSV"), lambda img: img.tobytes(),
               lambda img: Image.blend(img.filter(ImageFilter.BLUR), img.filter(ImageFilter.SMOOTH), 0.5),
               lambda img: ImageOps.equalize(img, mask=img)):
        with pytest.raises(NeedsPixels):
            _record(lambda img, r: fn(img), (8, 8), 0)
    with pytest.raises(RuntimeError, match="used after the transform returned"):
        RecordingImage((8, 8), "RGB").load()  # kept by the user's code, touched outside a recording


# ----------------------------------------------------------------------------- users' classes
class SelfSupervisedBlur:
    """A recipe's own few-line class: a random-radius Gaussian blur, a solarize, a sharpen."""

    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        if random.random() < self.p:
            img = img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))
        if random.random() < 0.3:
            img = ImageOps.solarize(img)
        if random.random() < 0.5:
            img = ImageEnhance.Contrast(img).enhance(random.uniform(0.6, 1.4))
        return img


class ManyCalls:
    """More calls than a recorded step plans at first (its plan grows)."""

    def __call__(self, img):
        for _ in range(random.randint(1, 5)):
            img = ImageOps.mirror(img) if random.random() < 0.5 else img.filter(ImageFilter.BoxBlur(1))
        return img


class TorchvisionBlur:
    """A class written with torchvision's functional blur on PIL images (v1 and v2)."""

    def __call__(self, img):
        if random.random() < 0.5:
            return TF.gaussian_blur(img, [5, 9], random.uniform(0.1, 2.0))
        return F2.gaussian_blur(img, 7, [random.uniform(0.1, 2.0), 1.0])


def test_torchvisions_functional_blur_on_pil_runs_on_dali_within_one_level(photo_root):
    ds = image_folder(photo_root, _chain(TorchvisionBlur, normalize=False))
    ref, out = _runs(ds)
    assert len(ref) == len(out)
    for (xa, ya), (xb, yb) in zip(ref, out):
        assert torch.equal(ya, yb) and xa.shape == xb.shape
        assert int((xa.int() - xb.int()).abs().max()) <= 1
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


class ReadsPixels:
    def __call__(self, img):
        if np.asarray(img).mean() > 300:  # never true: the pixels are only read
            return ImageOps.invert(img)
        return img.filter(ImageFilter.GaussianBlur(1.5))


class PastesInPlace:
    def __call__(self, img):
        img = img.copy()
        img.paste((255, 0, 0), (0, 0, 5, 5))
        return img


class Raises:
    def __call__(self, img):
        img = ImageOps.solarize(img)
        raise ValueError("this augmentation refuses every image")


class ReturnsGray:
    def __call__(self, img):
        return ImageOps.grayscale(img)


def _chain(cls, size=48, normalize=True):
    tail = [T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)] if normalize else [T.RandomVerticalFlip(),
                                                                                  T.PILToTensor()]
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), cls()] + tail)


def _runs(ds, **kw):
    runs = []
    for proxied in (False, True):
        random.seed(3)
        runs.append(load_all(ds, autoproxy=proxied, resize="pillow", **kw))
    return runs


def _assert_equal(ref, out):
    assert len(ref) == len(out)
    for (xa, ya), (xb, yb) in zip(ref, out):
        assert xa.shape == xb.shape and torch.equal(xa, xb), float((xa - xb).abs().max())
        assert torch.equal(ya, yb)


@pytest.mark.parametrize("cls", [SelfSupervisedBlur, ManyCalls], ids=lambda c: c.__name__)
def test_a_users_pillow_class_runs_on_dali_equal_to_plain(photo_root, cls):
    ds = image_folder(photo_root, _chain(cls))
    ref, out = _runs(ds)
    _assert_equal(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    assert rep["worker_transforms"] == [] and rep["partial"] is None, rep


class TwoViews:
    """VICReg's and Barlow Twins' shape: two chains of the same classes with other odds."""

    def __init__(self):
        self.first = T.Compose([T.RandomResizedCrop(40), SelfSupervisedBlur(p=1.0), T.ToTensor()])
        self.second = T.Compose([T.RandomResizedCrop(40), SelfSupervisedBlur(p=0.1), T.ToTensor()])

    def __call__(self, img):
        return self.first(img), self.second(img)


def test_two_chains_of_the_same_steps_are_both_reported(photo_root):
    """Each distinct chain is listed with its steps (a chain planned again per draw once):
    two views' chains whose steps have the same names are two entries, and both equal plain."""
    ds = image_folder(photo_root, TwoViews())
    random.seed(3)
    ref = load_all(ds, autoproxy=False, resize="pillow")
    random.seed(3)
    out = load_all(ds, autoproxy=True, resize="pillow")
    for (va, ya), (vb, yb) in zip(ref, out):
        assert all(torch.equal(a, b) for a, b in zip(va, vb)) and torch.equal(ya, yb)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    assert rep["dali_transforms"].count("SelfSupervisedBlur") == 2, rep


@pytest.mark.parametrize("cls", [ReadsPixels, PastesInPlace, ReturnsGray], ids=lambda c: c.__name__)
def test_a_class_that_needs_pixels_runs_in_the_worker_as_plain(photo_root, cls):
    LEARNT.pixel_readers.pop(cls, None)  # what the main process learnt in an earlier test
    ds = image_folder(photo_root, _chain(cls, normalize=False))  # DALI's normalize: within 1 ulp
    ref, out = _runs(ds)
    _assert_equal(ref, out)
    rep = last_report()
    if cls is ReturnsGray:  # an "L" image after it: the rest of the chain runs in the worker too, so
        assert rep["decode"].startswith("worker 100%"), rep  # no sample reached DALI
        assert not rep["proxied"] and rep["reason"].startswith("no sample reached DALI"), rep
        return
    assert rep["proxied"], rep
    assert cls.__name__ in rep["worker_transforms"] and cls.__name__ in rep["partial"], rep
    if cls is ReadsPixels:
        assert "(Image.__array_interface__) at" in rep["partial"] and "test_recorded.py:" in rep["partial"], rep


def test_a_class_that_needs_pixels_at_the_end_of_its_chain_is_reported(photo_root):
    """Nothing worth moving is left after it: the chain runs as written, the report says why."""
    LEARNT.pixel_readers.pop(ReadsPixels, None)
    ds = image_folder(photo_root, T.Compose([T.RandomResizedCrop(48), ReadsPixels(), T.PILToTensor()]))
    ref, out = _runs(ds)
    _assert_equal(ref, out)
    rep = last_report()
    assert "worker 100% (a recorded transform needs pixels" in rep["decode"], rep
    assert "ReadsPixels has no DALI translation; recorded, needs pixels (Image.__array_interface__) at" in rep["decode"]


def test_a_class_that_raises_raises_as_plain(photo_root):
    ds = image_folder(photo_root, _chain(Raises))
    for proxied in (False, True):
        with pytest.raises(ValueError, match="refuses every image"):
            load_all(ds, autoproxy=proxied, resize="pillow")


def test_recording_is_planned_only_on_rgb_pil_images():
    chain = T.Compose([T.RandomResizedCrop(32), SelfSupervisedBlur(), T.PILToTensor()])
    assert [type(op).__name__ for op in build_plan(chain).ops].count("PillowCall") == 2
    after_tensor = T.Compose([T.RandomResizedCrop(32), T.PILToTensor(), SelfSupervisedBlur()])
    from dali_autoproxy.plan.ir import Unsupported
    with pytest.raises(Unsupported, match="has no DALI translation"):  # a tensor by then: not recorded
        build_plan(after_tensor)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["num_workers=0", "spawn"])
def test_recorded_and_replanned_in_the_main_process_and_in_spawned_workers(photo_root, how):
    """The same outcomes where the chain runs in the main process (no workers) and in spawned
    workers (which start from the defaults and get the patches and settings from the installer)."""
    kw = {"num_workers": 0} if how == "num_workers=0" else {"multiprocessing_context": "spawn"}
    for cls in (SelfSupervisedBlur, ReadsPixels):
        LEARNT.pixel_readers.pop(cls, None)
        ds = image_folder(photo_root, _chain(cls, normalize=False))
        ref, out = _runs(ds, **kw)
        _assert_equal(ref, out)
        rep = last_report()
        assert rep["proxied"], rep
        if cls is SelfSupervisedBlur:
            assert rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep
        else:
            assert "ReadsPixels" in rep["worker_transforms"], rep
