"""Random transforms: the distribution of what autoproxy applies against what torchvision
applies, observed in the output pixels (not in our own bookkeeping), with independent seeds.
A wrong range or unit (hue in degrees instead of turns, a factor drawn around 0 instead of 1,
a probability inverted) moves these distributions far outside the tests' bounds.

Two-sample Kolmogorov-Smirnov tests at level 0.001 over 320 samples per side; rates within
4 standard errors."""
import colorsys

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import last_report, load_all
from PIL import Image
from scipy import stats

N = 320
COLOUR = (200, 90, 40)


class FlatColour(torch.utils.data.Dataset):
    """N small flat-colour PIL images (the pixels travel raw, no JPEG error)."""

    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(Image.new("RGB", (32, 24), COLOUR)), 0


def _mean_colours(tf, autoproxy, seed):
    out = load_all(FlatColour(tf), autoproxy=autoproxy, seed=seed, batch_size=40, num_workers=2)
    if autoproxy:
        assert last_report()["proxied"] and not last_report()["partial"], last_report()
    return torch.cat([x for x, _ in out]).double().mean(dim=(2, 3)).numpy()  # [N, 3] in 0..255 or 0..1


def _hue(rgb):
    return np.array([colorsys.rgb_to_hsv(*(c / 255.0))[0] for c in rgb])


def _saturation(rgb):
    return np.array([colorsys.rgb_to_hsv(*(c / 255.0))[1] for c in rgb])


OBSERVE = {
    "brightness": (lambda m: m.ColorJitter(brightness=0.4), lambda rgb: rgb.mean(1) / np.mean(COLOUR)),
    "contrast_on_flat_is_identity": (lambda m: m.ColorJitter(contrast=0.4), lambda rgb: rgb.mean(1)),
    "saturation": (lambda m: m.ColorJitter(saturation=0.4), _saturation),
    "hue": (lambda m: m.ColorJitter(hue=0.1), _hue),
    "hue_wide": (lambda m: m.ColorJitter(hue=(-0.5, 0.5)), _hue),
    "all_four": (lambda m: m.ColorJitter(0.4, 0.4, 0.4, 0.1), lambda rgb: np.c_[_hue(rgb), _saturation(rgb)]),
}


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("what", sorted(OBSERVE))
def test_colour_jitter_distributions(what, api):
    m = T if api == "v1" else v2
    make, observe = OBSERVE[what]
    tf = (T.Compose if api == "v1" else v2.Compose)([make(m), m.PILToTensor()])
    ref = np.atleast_2d(observe(_mean_colours(tf, False, seed=1)).T).T
    out = np.atleast_2d(observe(_mean_colours(tf, True, seed=2)).T).T
    for k in range(ref.shape[1]):
        if np.ptp(ref[:, k]) == 0:
            assert np.ptp(out[:, k]) == 0 and out[0, k] == ref[0, k]
        else:
            assert stats.ks_2samp(ref[:, k], out[:, k]).pvalue > 1e-3, (what, k)


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_apply_probabilities(p):
    """RandomGrayscale, RandomApply and RandomInvert: the share of samples changed is p."""
    for make in (lambda: T.RandomGrayscale(p), lambda: v2.RandomApply([v2.RandomInvert(1.0)], p=p),
                 lambda: T.RandomApply([T.ColorJitter(hue=(0.3, 0.3))], p=p)):
        tf = T.Compose([make(), T.PILToTensor()])
        rgb = _mean_colours(tf, True, seed=3)
        changed = np.abs(rgb - np.array(COLOUR)).max(1) > 1
        se = np.sqrt(p * (1 - p) / N)
        assert abs(changed.mean() - p) < 4 * se, (make(), changed.mean())


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_random_erasing_area_and_aspect(api):
    m = T if api == "v1" else v2
    conv = [T.ToTensor()] if api == "v1" else [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    tf = (T.Compose if api == "v1" else v2.Compose)(conv + [m.RandomErasing(p=0.9, scale=(0.05, 0.3), value=-1.0)])

    def boxes(autoproxy, seed):
        out = load_all(FlatColour(tf), autoproxy=autoproxy, seed=seed, batch_size=40)
        rows = []
        for x, _ in out:
            erased = (x[:, 0] == -1.0)
            area = erased.double().mean(dim=(1, 2))
            hs = erased.any(2).sum(1).double()
            ws = erased.any(1).sum(1).double()
            for a, h, w in zip(area, hs, ws):
                rows.append((float(a), np.log(float(h) / float(w)) if a > 0 else np.nan))
        return np.array(rows)
    ref, out = boxes(False, 4), boxes(True, 5)
    assert abs(np.mean(out[:, 0] > 0) - np.mean(ref[:, 0] > 0)) < 4 * np.sqrt(2 * 0.09 / N)
    assert stats.ks_2samp(ref[:, 0], out[:, 0]).pvalue > 1e-3
    r, o = ref[~np.isnan(ref[:, 1]), 1], out[~np.isnan(out[:, 1]), 1]
    assert stats.ks_2samp(r, o).pvalue > 1e-3


def test_colour_jitter_order_is_a_fresh_permutation_per_sample():
    """Brightness then contrast differs from contrast then brightness on a two-tone image;
    both orders occur, at torchvision's rate."""
    from dali_autoproxy.plan.planning import build_plan
    plan = build_plan(T.Compose([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor()]))
    torch.manual_seed(0)
    orders = np.array([plan.draw(10, 10)[:4] for _ in range(2000)])
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    first = np.bincount(orders[:, 0].astype(int), minlength=4) / len(orders)
    assert np.all(np.abs(first - 0.25) < 4 * np.sqrt(0.25 * 0.75 / len(orders)))
