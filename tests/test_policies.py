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


@pytest.mark.parametrize("name,mags", CASES, ids=[c[0] for c in CASES])
def test_policy_operation_is_pillows(name, mags):
    imgs = [np.asarray(Image.fromarray(p).convert("RGB").resize((200, 160))) for p in photographs()]
    x = torch.tensor(np.stack(imgs)).permute(0, 3, 1, 2).float()
    fill = (10.0, 20.0, 30.0)
    for mag in mags:
        host = np.array([[AUGMENT_OPS.index(name), mag]] * len(imgs))
        out = augment(x, Augment(0, fill), host)
        for i, im in enumerate(imgs):
            ref = np.asarray(_apply_op(Image.fromarray(im), name, mag, interpolation=InterpolationMode.NEAREST,
                                       fill=list(fill)))
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
