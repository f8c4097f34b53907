"""The fidelity="fast" opt-in: ColorJitter by DALI's own colour operator with torchvision's draws,
through real DataLoader workers and real DALI pipelines (here the CPU backend; test_gpu.py has
the GPU twin). Bounds per adjustment, as published in docs/benchmarks.md."""
import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, last_report, load_all
from photos import psnr
from test_fidelity import MEAN, STD

import dali_autoproxy
from dali_autoproxy.config import resolve_options
from dali_autoproxy.plan.ir import FastColorJitter, split_at_takeover
from dali_autoproxy.plan.planning import SETTINGS, build_plan

# adjustment -> (ColorJitter kwargs, PSNR floor in dB). Brightness and saturation: float maths
# where Pillow rounds; contrast: DALI pivots on mid-grey, Pillow on the mean luma; hue: DALI
# rotates linearly, Pillow shifts HSV hue. Measured 51 / 24 / 51 / 25 dB on photographs.
BOUNDS = {"brightness": ({"brightness": 0.4}, 45.0), "contrast": ({"contrast": 0.4}, 20.0),
          "saturation": ({"saturation": 0.4}, 45.0), "hue": ({"hue": 0.1}, 20.0)}


def fast_against_torchvision(root, tf, device="cpu", **kw):
    ds = image_folder(root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=3, **kw)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=3, fidelity="fast", device=device, **kw)
    rep = last_report()
    assert rep["proxied"] and not rep["partial"], rep
    for (_, la), (_, lb) in zip(ref, out):
        assert torch.equal(la, lb.cpu()), "labels differ"
    a = torch.cat([x for x, _ in ref]).double().numpy()
    b = torch.cat([x.cpu() for x, _ in out]).double().numpy()
    return a, b


@pytest.mark.parametrize("name", sorted(BOUNDS))
@pytest.mark.parametrize("api", ["v1", "v2"])
def test_each_adjustment_within_its_published_bound(photo_root, name, api):
    m = T if api == "v1" else v2
    factor, floor = BOUNDS[name]
    a, b = fast_against_torchvision(photo_root, m.Compose([m.CenterCrop(200), m.ColorJitter(**factor),
                                                           m.PILToTensor()]))
    assert psnr(a, b) >= floor, (name, psnr(a, b))
    # the same draws: a factor drawn differently would move whole images, far beyond rounding
    per_image = [psnr(x, y) for x, y in zip(a, b)]
    assert min(per_image) >= floor - 6, per_image


def test_heavy_chain_runs_on_dali_alone_and_stays_close(photo_root):
    chain = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
                       T.RandomGrayscale(0.2), T.PILToTensor()])
    SETTINGS["fidelity"] = "fast"
    try:
        plan = build_plan(chain)
    finally:
        SETTINGS["fidelity"] = "exact"
    dali_ops, torch_ops = split_at_takeover(plan.ops)
    assert torch_ops == [] and any(isinstance(op, FastColorJitter) for op in dali_ops)
    a, b = fast_against_torchvision(photo_root, chain)
    assert psnr(a, b) >= 20.0


def test_exact_stays_the_default_and_the_option_is_validated(monkeypatch):
    assert resolve_options(environ={}).fidelity == "exact"
    assert resolve_options(environ={"DALI_AUTOPROXY_FIDELITY": "fast"}).fidelity == "fast"
    with pytest.raises(ValueError, match="DALI_AUTOPROXY_FIDELITY='quick'"):
        resolve_options(environ={"DALI_AUTOPROXY_FIDELITY": "quick"})
    dali_autoproxy.enable(device="cpu", fidelity="fast", log_level="WARNING")
    assert SETTINGS["fidelity"] == "fast"
    dali_autoproxy.disable()
    assert SETTINGS["fidelity"] == "exact"


def test_a_failed_batch_is_recomputed_exactly():
    """The CPU replay of a fast ColorJitter runs torchvision's own adjustments in the drawn order."""
    from photos import photographs
    from PIL import Image

    from dali_autoproxy.backends.cpu_replay import CPU_KERNELS
    img = Image.fromarray(photographs()[0]).convert("RGB")
    row = [1.0, 1.0, 1.0, 0.0] * 4
    row[4 * 0 + 2], row[4 * 1 + 3], row[4 * 2 + 0], row[4 * 3 + 1] = 1.3, 0.049, 0.7, 1.2
    op = FastColorJitter(0)
    out = CPU_KERNELS[op](img, op, row, False)
    F = T.functional
    ref = F.adjust_contrast(F.adjust_brightness(F.adjust_hue(F.adjust_saturation(img, 1.3), 0.049), 0.7), 1.2)
    assert np.array_equal(np.asarray(out), np.asarray(ref))


def test_normalized_float_output_is_proxied(photo_root):
    chain = T.Compose([T.RandomResizedCrop(128), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(),
                       T.Normalize(MEAN, STD)])
    a, b = fast_against_torchvision(photo_root, chain)
    assert a.shape == b.shape and np.isfinite(b).all()
