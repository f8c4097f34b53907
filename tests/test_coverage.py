"""Transforms beyond the core set: exact against torchvision on DALI's CPU backend (the
CPU decoder is libjpeg-turbo like PIL, and these operations do no resampling, so every
uint8 pixel must be equal), v1 and v2, fixed and random settings, same seed."""
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.ir import Unsupported
from dali_autoproxy.planning import build_plan
from helpers import image_folder, last_report, load_all

CASES = {
    "pad_int": lambda m: [m.Pad(7)],
    "pad_ltrb_fill_rgb": lambda m: [m.Pad([3, 5, 11, 2], fill=(10, 200, 30))],
    "random_crop": lambda m: [m.RandomCrop(150)],
    "random_crop_padding_fill": lambda m: [m.RandomCrop((180, 200), padding=20, fill=77)],
    "random_crop_pad_if_needed": lambda m: [m.CenterCrop((120, 140)), m.RandomCrop(160, pad_if_needed=True, fill=5)],
    "vflip_p1": lambda m: [m.RandomVerticalFlip(1.0), m.CenterCrop(200)],
    "vflip_random": lambda m: [m.RandomVerticalFlip(), m.RandomHorizontalFlip(), m.CenterCrop(200)],
    "invert": lambda m: [m.RandomInvert(0.5), m.CenterCrop(200)],
    "solarize": lambda m: [m.RandomSolarize(100.5, p=0.7), m.CenterCrop(200)],
    "posterize": lambda m: [m.RandomPosterize(3, p=0.6), m.CenterCrop(200)],
    "chain": lambda m: [m.RandomCrop(200, padding=4), m.RandomHorizontalFlip(), m.RandomInvert(0.3),
                        m.RandomPosterize(4, p=0.5), m.RandomSolarize(128, p=0.5)],
}


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_against_torchvision(photo_root, case, api):
    m = T if api == "v1" else v2
    to_tensor = [T.PILToTensor()] if api == "v1" else [v2.PILToTensor()]
    compose = T.Compose if api == "v1" else v2.Compose
    ds = image_folder(photo_root, compose(CASES[case](m) + to_tensor))
    bs = 1 if case.startswith("pad") else 4  # Pad alone keeps the images' varied sizes
    ref = load_all(ds, autoproxy=False, seed=12, shuffle=True, batch_size=bs)
    out = load_all(ds, autoproxy=True, seed=12, shuffle=True, batch_size=bs)
    assert last_report()["proxied"], last_report()
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb)
        assert torch.equal(a, b), (a.int() - b.int()).abs().max()


@pytest.mark.parametrize("tf,reason", [
    (T.Compose([T.Pad(4, padding_mode="reflect"), T.ToTensor()]), "padding_mode='reflect'"),
    (T.Compose([T.RandomCrop(32, padding=4, padding_mode="edge"), T.ToTensor()]), "padding_mode='edge'"),
    (T.Compose([T.ToTensor(), T.RandomInvert()]), "on float tensors"),
    (T.Compose([T.Pad(-2), T.ToTensor()]), "negative"),
])
def test_untranslated_settings_say_why(tf, reason):
    with pytest.raises(Unsupported, match=reason):
        build_plan(tf, "encoded")


def test_crop_larger_than_image_raises_as_torchvision(photo_root):
    ds = image_folder(photo_root, T.Compose([T.RandomCrop(2000), T.PILToTensor()]))
    with pytest.raises(ValueError, match="Required crop size"):
        load_all(ds, autoproxy=False, num_workers=0)
    with pytest.raises(ValueError, match="Required crop size"):
        load_all(ds, autoproxy=True, num_workers=0)
