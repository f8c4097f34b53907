"""Each operation of the augmentation policies, as the torch stage computes it, against
torchvision's own ``_apply_op`` on PIL images (Pillow's maths), on photographs, at several
magnitudes: every pixel equal."""
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import _apply_op

from dali_autoproxy.ir import AUGMENT_OPS, Augment
from dali_autoproxy.torch_stage import augment
from photos import photographs

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
    from dali_autoproxy.ir import TensorColorJitter
    from dali_autoproxy.torch_stage import tensor_color_jitter
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
