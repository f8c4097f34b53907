"""Each operation of the augmentation policies, as the torch stage computes it, against
torchvision's own ``_apply_op`` on PIL images (Pillow's maths), on photographs, at several
magnitudes: every pixel equal."""
import numpy as np
import pytest
import torch
from photos import photographs
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import _apply_op

from dali_autoproxy.backends.torch_stage import augment
from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, Augment

CASES = [("ShearX", [0.3, -0.5]), ("ShearY", [0.2, -0.99]), ("TranslateX", [12.7, -20.0]), ("TranslateY", [5.0, -31.0]),
         ("Rotate", [30.0, -77.0, 135.0]), ("Brightness", [0.5, -0.3]), ("Color", [0.4, -0.99]),
         ("Contrast", [-0.6, 0.9]), ("Sharpness", [0.9, -0.5]), ("Posterize", [3.0, 8.0, 1.0]),
         ("Solarize", [100.0, 0.0, 255.0]), ("AutoContrast", [0.0]), ("Equalize", [0.0]), ("Invert", [0.0]),
         ("Identity", [0.0])]


@pytest.mark.parametrize("bilinear", [False, True], ids=["nearest", "bilinear"])
@pytest.mark.parametrize("name,mags", CASES, ids=[c[0] for c in CASES])
def test_policy_operation_is_pillows(name, mags, bilinear):
    imgs = [np.asarray(Image.fromarray(p).convert("RGB").resize((200, 160))) for p in photographs()]
    x = torch.tensor(np.stack(imgs)).permute(0, 3, 1, 2).float()
    fill = (10.0, 20.0, 30.0)
    mode = InterpolationMode.BILINEAR if bilinear else InterpolationMode.NEAREST
    for mag in mags:
        host = np.array([[AUGMENT_OPS.index(name), mag]] * len(imgs))
        out = augment(x, Augment(0, fill, bilinear), host)
        for i, im in enumerate(imgs):
            ref = np.asarray(_apply_op(Image.fromarray(im), name, mag, interpolation=mode, fill=list(fill)))
            assert np.array_equal(ref, out[i].permute(1, 2, 0).numpy().astype(np.uint8)), (name, mag, i)


def test_mixed_operations_in_one_batch_go_to_their_samples():
    imgs = [np.asarray(Image.fromarray(p).convert("RGB").resize((96, 80))) for p in photographs()]
    x = torch.tensor(np.stack(imgs)).permute(0, 3, 1, 2).float()
    ops = [("Rotate", 20.0), ("Equalize", 0.0), ("Identity", 0.0), ("Solarize", 60.0)]
    host = np.array([[AUGMENT_OPS.index(n), m] for n, m in ops])
    out = augment(x, Augment(0, (0.0, 0.0, 0.0)), host)
    for i, (name, mag) in enumerate(ops):
        ref = np.asarray(_apply_op(Image.fromarray(imgs[i]), name, mag, interpolation=InterpolationMode.NEAREST,
                                   fill=[0.0, 0.0, 0.0]))
        assert np.array_equal(ref, out[i].permute(1, 2, 0).numpy().astype(np.uint8)), name


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_batched_tensor_color_jitter_equals_torchvision_per_image(api, dtype):
    """ColorJitter on tensors runs torchvision's tensor kernels batched, one factor per sample,
    each sample in its own order. Against torchvision's functional calls image by image, on
    photographs of odd sizes (vector loops and their tails), random orders and factors incl.
    RandomApply's skip rows: every value equal (uint8), or float rounding only (float32)."""
    import torchvision.transforms.functional as F1
    import torchvision.transforms.v2.functional as F2

    from dali_autoproxy.backends.torch_stage import tensor_color_jitter
    from dali_autoproxy.plan.ir import TensorColorJitter
    F = F2 if api == "v2" else F1
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    rng = np.random.default_rng(5)
    imgs = [np.asarray(Image.fromarray(p).convert("RGB").resize((131, 97))) for p in photographs()] * 3
    u8 = torch.tensor(np.stack(imgs)).permute(0, 3, 1, 2)
    host = np.zeros((len(imgs), 8))
    for i in range(len(imgs)):
        host[i, :4] = rng.permutation(4) if rng.random() > 0.15 else 4
        host[i, 4:7] = rng.uniform(0.0, 2.0, 3)
        host[i, 7] = rng.uniform(-0.5, 0.5)
    op = TensorColorJitter(0, (True, True, True, True), api)
    inp = u8 if dtype == "uint8" else u8.float() / 255
    out = tensor_color_jitter(u8.float() if dtype == "uint8" else inp.clone(), op, host, dtype == "uint8")
    for i in range(len(imgs)):
        ref = inp[i]
        for which in (int(v) for v in host[i, :4]):
            if which < 4:
                ref = adjust[which](ref, float(host[i, 4 + which]))
        if dtype == "uint8":
            assert torch.equal(out[i].to(torch.uint8), ref), i
        else:
            assert (out[i] - ref).abs().max() <= 1e-6, i


TENSOR_CASES = [("ShearX", [0.3, -0.5, 0.0]), ("ShearY", [0.2, -0.99]), ("TranslateX", [12.7, -20.0]),
                ("TranslateY", [5.0, -31.0]), ("Rotate", [30.0, -77.0, 90.0, 180.0, 0.0]), ("Brightness", [0.5, -0.3]),
                ("Color", [0.4, -0.99]), ("Contrast", [-0.6, 0.9]), ("Sharpness", [0.9, -0.5]),
                ("Posterize", [3.0, 8.0, 0.0]), ("Solarize", [0.4, 0.0, 1.0]), ("AutoContrast", [0.0]),
                ("Equalize", [0.0]), ("Invert", [0.0]), ("Identity", [0.0])]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("interpolation,fill", [("nearest", None), ("bilinear", (10.0, 200.0, 30.0))])
def test_tensor_policy_operations_equal_torchvision_per_image(device, api, interpolation, fill):
    """Policies on uint8 tensors (the v2 recipe): one batch holding every operation at several
    magnitudes (v2's units: Solarize a fraction), run by the stage's batched kernel, against
    torchvision's own policy operation called image by image on the same device. Square
    images, so that rotations by 90 degrees take torchvision's fast path: every value equal."""
    import torchvision.transforms.v2 as v2
    from torchvision.transforms.autoaugment import _apply_op

    from dali_autoproxy.backends.torch_stage.tensor_policies import tensor_augment
    from dali_autoproxy.plan.policy_ops import TensorAugment
    photos = [np.asarray(Image.fromarray(p).convert("RGB").resize((120, 120))) for p in photographs()]
    rows, imgs = [], []
    for k, (name, mags) in enumerate(TENSOR_CASES):
        for j, mag in enumerate(mags):
            if api == "v1" and name == "Solarize":
                mag *= 255.0  # v1 draws levels
            rows.append([AUGMENT_OPS.index(name), mag])
            imgs.append(photos[(k + j) % len(photos)])
    u8 = torch.tensor(np.stack(imgs)).permute(0, 3, 1, 2).to(device)
    out = tensor_augment(u8.float(), TensorAugment(0, fill, interpolation, api), np.array(rows), True)
    mode = InterpolationMode(interpolation)
    apply = v2.RandAugment()._apply_image_or_video_transform
    for i, (code, mag) in enumerate(rows):
        name = AUGMENT_OPS[int(code)]
        if api == "v2":
            ref = apply(u8[i], name, mag, interpolation=mode, fill={"others": None if fill is None else list(fill)})
        else:
            ref = _apply_op(u8[i], name, mag, interpolation=mode, fill=None if fill is None else list(fill))
        assert torch.equal(out[i].to(torch.uint8), ref), (name, mag)


AUGMIX_CHAINS = {  # the catalogue's AugMix rows
    "default": lambda m: [m.CenterCrop(200), m.AugMix(), m.PILToTensor()],
    "severity 5, width 4, depth 2, nearest, fill, not all ops": lambda m: [m.CenterCrop(200), m.AugMix(
        5, 4, 2, alpha=0.5, all_ops=False, interpolation=InterpolationMode.NEAREST, fill=[9, 99, 199]),
        m.PILToTensor()],
    "on a uint8 tensor": lambda m: [m.PILToTensor(), m.CenterCrop(200), m.AugMix()],
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("chain", sorted(AUGMIX_CHAINS))
def test_augmix_in_the_torch_stage_is_torchvisions(photo_root, chain, api, device):
    """AugMix with augmix="stage" (forward's draws in the worker, the copies' operations and the
    float32 mixing in the torch stage): every pixel plain's on the CPU backend (the GPU: Pillow
    decodes in the worker, the operations' CUDA arithmetic within a level); the CPU replay of the
    plan (what a batch DALI fails on gets) equals torchvision for one photograph."""
    import random

    import torchvision
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from helpers import image_folder, last_report, load_all
    from test_catalogue import pil_rgb

    from dali_autoproxy.backends.cpu_replay import run_plan
    from dali_autoproxy.plan.planning import build_plan
    from dali_autoproxy.plan.settings import SETTINGS
    m = T if api == "v1" else v2
    tf = m.Compose(AUGMIX_CHAINS[chain](m))
    ds = image_folder(photo_root, tf) if device == "cpu" else torchvision.datasets.ImageFolder(photo_root, tf,
                                                                                               loader=pil_rgb)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=17)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=17, device=device, augmix="stage", strict=device == "cpu")
    rep = last_report()
    assert rep["proxied"] and not rep["partial"] and any("AugMix" in n for n in rep["dali_transforms"]), rep
    worst, mean = 0.0, 0.0
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb) and a.dtype == b.dtype == torch.uint8
        d = (a.int() - b.cpu().int()).abs().double()
        worst, mean = max(worst, float(d.max())), max(mean, float(d.mean()))
    assert (worst, mean) == (0.0, 0.0) if device == "cpu" else (worst <= 1 and mean <= 1e-3), (worst, mean)
    if device == "cpu":
        before = SETTINGS["augmix"]
        SETTINGS["augmix"] = "stage"
        try:
            plan = build_plan(tf)
        finally:
            SETTINGS["augmix"] = before
        img = pil_rgb(ds.samples[0][0])
        torch.manual_seed(3)
        random.seed(3)
        expected = tf(img)
        torch.manual_seed(3)
        random.seed(3)
        row = plan.draw(img.size[1], img.size[0])
        replayed = run_plan(plan, img, row)
        assert torch.equal(torch.as_tensor(expected), torch.as_tensor(replayed))
