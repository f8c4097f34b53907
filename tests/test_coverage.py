"""Transforms beyond the core set: exact against torchvision on DALI's CPU backend (the
CPU decoder is libjpeg-turbo like PIL, and these operations do no resampling, so every
uint8 pixel must be equal), v1 and v2, fixed and random settings, same seed."""
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.ir import Unsupported
from dali_autoproxy.planning import build_plan
from helpers import image_folder, last_report, load_all, why_not
from photos import MEAN, STD

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
    "jitter": lambda m: [m.ColorJitter(0.4, 0.4, 0.4, 0.1), m.CenterCrop(200)],
    "jitter_brightness_contrast": lambda m: [m.ColorJitter(brightness=0.5, contrast=(0.2, 1.8)), m.CenterCrop(200)],
    "jitter_saturation_hue": lambda m: [m.ColorJitter(saturation=(0.0, 2.0), hue=0.5), m.CenterCrop(200)],
    "grayscale_1": lambda m: [m.Grayscale(), m.CenterCrop(200)],
    "grayscale_3": lambda m: [m.Grayscale(3), m.CenterCrop(200)],
    "random_grayscale": lambda m: [m.RandomGrayscale(0.5), m.CenterCrop(200)],
    "random_apply_jitter_invert": lambda m: [m.CenterCrop(200), m.RandomApply(
        [m.ColorJitter(0.4, 0.4, 0.4, 0.1), m.RandomInvert(1.0)], p=0.6)],
    "identity_in_compose": lambda m: [m.CenterCrop(200)] + ([m.Identity()] if m is v2 else []),
    "chain": lambda m: [m.RandomCrop(200, padding=4), m.RandomHorizontalFlip(), m.RandomInvert(0.3),
                        m.RandomPosterize(4, p=0.5), m.RandomSolarize(128, p=0.5)],
    "colour_chain": lambda m: [m.RandomCrop(200), m.RandomHorizontalFlip(), m.ColorJitter(0.4, 0.4, 0.4, 0.1),
                               m.RandomGrayscale(0.2)],
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
    assert reason in why_not(tf)



def test_crop_larger_than_image_raises_as_torchvision(photo_root):
    ds = image_folder(photo_root, T.Compose([T.RandomCrop(2000), T.PILToTensor()]))
    with pytest.raises(ValueError, match="Required crop size"):
        load_all(ds, autoproxy=False, num_workers=0)
    with pytest.raises(ValueError, match="Required crop size"):
        load_all(ds, autoproxy=True, num_workers=0)


BLURS = {
    "blur_random_sigma": lambda m: [m.CenterCrop(200), m.GaussianBlur(9, sigma=(0.1, 3.0))],
    "blur_rectangular_kernel": lambda m: [m.CenterCrop(200), m.GaussianBlur((3, 11), sigma=(1.0, 2.0))],
    "blur_in_random_apply": lambda m: [m.CenterCrop(200), m.RandomApply([m.GaussianBlur(9, (0.1, 2.0))], p=0.5)],
    "blur_on_uint8_tensor": lambda m: [m.CenterCrop(200), m.PILToTensor(), m.GaussianBlur(5, sigma=1.5)],
}


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("case", sorted(BLURS))
def test_gaussian_blur_within_bound(photo_root, case, api):
    """Float accumulation order differs (DALI: separable; torch: one 2-D convolution), so a
    pixel may round the other way: at most 1 level, on at most 1% of the pixels."""
    m = T if api == "v1" else v2
    chain = BLURS[case](m)
    if not any(isinstance(t, (T.PILToTensor, v2.PILToTensor)) for t in chain):
        chain.append(m.PILToTensor())
    ds = image_folder(photo_root, (T.Compose if api == "v1" else v2.Compose)(chain))
    ref = load_all(ds, autoproxy=False, seed=5, shuffle=True, batch_size=4)
    out = load_all(ds, autoproxy=True, seed=5, shuffle=True, batch_size=4)
    assert last_report()["proxied"], last_report()
    for (a, _), (b, _) in zip(ref, out):
        d = (a.int() - b.int()).abs()
        assert d.max() <= 1 and (d > 0).float().mean() < 0.01, (d.max(), (d > 0).float().mean())


ERASING = {
    "erase_zero": lambda m: m.RandomErasing(p=0.8),
    "erase_per_channel": lambda m: m.RandomErasing(p=1.0, scale=(0.1, 0.5), ratio=(0.5, 2.0), value=(0.5, -1.0, 2.0)),
}


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("case", sorted(ERASING))
def test_random_erasing_matches_torchvision(photo_root, case, api):
    """The erased box is the same (same draws); elsewhere only ToTensor/Normalize float rounding."""
    if api == "v1":
        tf = T.Compose([T.CenterCrop(200), T.ToTensor(), T.Normalize(MEAN, STD), ERASING[case](T)])
    else:
        tf = v2.Compose([v2.CenterCrop(200), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                         v2.Normalize(MEAN, STD), ERASING[case](v2), v2.ToPureTensor()])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, seed=6, shuffle=True, batch_size=4)
    out = load_all(ds, autoproxy=True, seed=6, shuffle=True, batch_size=4)
    assert last_report()["proxied"], last_report()
    erased = 0
    for (a, _), (b, _) in zip(ref, out):
        assert (a - b).abs().max() < 1e-5
        erased += int(((a == b) & (a != 0)).all(0).any())
    assert erased  # some boxes were erased with the value


def test_untranslated_colour_settings_say_why():
    for tf, reason in [
        (T.Compose([T.ToTensor(), T.ColorJitter(0.4)]), "on tensors"),
        (T.Compose([T.ToTensor(), T.RandomErasing(value="random")]), "normal noise"),
        (T.Compose([T.RandomErasing(), T.ToTensor()]), "float tensors only"),
        (T.Compose([T.RandomApply([T.RandomResizedCrop(64)]), T.ToTensor()]), "cannot be skipped per sample"),
        (T.Compose([T.RandomApply([T.Grayscale(1)]), T.ToTensor()]), "cannot be skipped per sample"),
        (T.Compose([T.RandomChoice([T.RandomInvert(), T.RandomSolarize(9)]), T.ToTensor()]), "picks or orders"),
        (T.Compose([T.RandomOrder([T.RandomInvert(), T.RandomSolarize(9)]), T.ToTensor()]), "picks or orders"),
    ]:
        assert reason in why_not(tf)
