"""RandomResizedCrop's box drawn on reused tensors equals torchvision's own draws (v1's
get_params, v2's make_params), value for value, with the generator left where torchvision
leaves it; the fallback (no box found in ten attempts) included."""
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from dali_autoproxy.plan.translate.crop_draws import log_ratio, resized_crop_box

SIZES = [(375, 500), (500, 375), (224, 224), (1, 1), (2, 900), (900, 3), (17, 31), (4000, 3000)]
SETTINGS = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.4, 1.0), (3 / 4, 4 / 3)), ((0.05, 0.4), (0.5, 2.0)),
            ((0.9, 1.0), (1.0, 1.0)), ((0.14, 1.0), (3 / 4, 4 / 3))]


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("scale,ratio", SETTINGS)
def test_the_same_boxes_and_generator_state_as_torchvision(api, scale, ratio):
    logs = log_ratio(ratio)
    t2 = v2.RandomResizedCrop(8, scale=scale, ratio=ratio)
    for seed in range(40):
        for height, width in SIZES:
            torch.manual_seed(seed)
            if api == "v1":
                want = T.RandomResizedCrop.get_params(torch.empty(3, height, width), scale, ratio)
            else:
                p = t2.make_params([torch.empty(3, height, width)]) if hasattr(t2, "make_params") else \
                    t2._get_params([torch.empty(3, height, width)])
                want = (p["top"], p["left"], p["height"], p["width"])
            after = torch.rand(1)
            torch.manual_seed(seed)
            got = resized_crop_box(height, width, scale, ratio, logs)
            assert got == tuple(int(v) for v in want), (seed, height, width)
            assert torch.equal(torch.rand(1), after)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0, 1 / 3, 0.7000000000000001])
def test_the_coin_is_torchs_rand_compared_as_torch_compares(p):
    from dali_autoproxy.plan.steps import SampleGeometry
    from dali_autoproxy.plan.translate.registry import coin_drawer
    draw = coin_drawer(p)
    for seed in range(300):
        torch.manual_seed(seed)
        want = [int(bool(torch.rand(1) < p)) for _ in range(20)]
        torch.manual_seed(seed)
        g = SampleGeometry(4, 4)
        for _ in range(20):
            draw(g)
        assert g.params == want, seed


def test_the_coin_compares_in_float32_as_torch_does(monkeypatch):
    """Draws just below, at and above p's float32: the decision is torch's ``rand(1) < p``."""
    import numpy as np

    from dali_autoproxy.plan.steps import SampleGeometry
    from dali_autoproxy.plan.translate import crop_draws
    from dali_autoproxy.plan.translate.registry import coin_drawer
    for p in (0.1, 0.3, 1 / 3, 0.7000000000000001, 0.9):
        p32 = np.float32(p)
        for u in (np.nextafter(p32, np.float32(0)), p32, np.nextafter(p32, np.float32(1))):
            monkeypatch.setattr(crop_draws, "copies_hold", lambda: True)  # the copy itself, its input set
            monkeypatch.setattr(crop_draws, "uniform", lambda u=u: float(u))
            g = SampleGeometry(4, 4)
            coin_drawer(p)(g)
            assert g.params == [int(bool(torch.tensor([u], dtype=torch.float32) < p))], (p, u)


def test_the_copies_are_checked_against_the_installed_torchvision():
    from dali_autoproxy.plan.translate import crop_draws
    crop_draws.same_as_torchvision.cache_clear()
    state = torch.get_rng_state()
    assert crop_draws.same_as_torchvision()
    assert torch.equal(torch.get_rng_state(), state)  # the caller's generator where it was


class _OwnBox(T.RandomResizedCrop):
    """A subclass drawing its own box (a fixed-size crop at a random place)."""

    @staticmethod
    def get_params(img, scale, ratio):
        _, height, width = img.shape[-3:] if isinstance(img, torch.Tensor) else (3, img.height, img.width)
        return int(torch.randint(0, height // 2 + 1, (1,))), int(torch.randint(0, width // 2 + 1, (1,))), \
            height // 2, width // 2


def _changed_get_params(original):
    def get_params(img, scale, ratio):  # a release that draws one more number first
        torch.rand(1)
        return original(img, scale, ratio)
    return staticmethod(get_params)


@pytest.mark.parametrize("case", ["a subclass's own get_params", "a torchvision that draws otherwise"])
def test_draws_that_are_not_the_copies_run_torchvisions_own(photo_root, monkeypatch, case):
    """Where the copied draws would not be the installed code's (a subclass overrides
    get_params; torchvision's own changed), the plan calls that code: every batch equal to plain."""
    from helpers import image_folder, last_report, load_all

    from dali_autoproxy.plan.translate import crop_draws
    crop = T.RandomResizedCrop
    if case != "a subclass's own get_params":
        monkeypatch.setattr(T.RandomResizedCrop, "get_params", _changed_get_params(T.RandomResizedCrop.get_params))
        crop_draws.same_as_torchvision.cache_clear()
        monkeypatch.setattr(crop_draws, "_warned", [])
    else:
        crop = _OwnBox
    try:
        ds = image_folder(photo_root, T.Compose([crop(40), T.RandomHorizontalFlip(), T.PILToTensor()]))
        ref = load_all(ds, autoproxy=False)
        out = load_all(ds, autoproxy=True, resize="pillow", strict=True)
        assert last_report()["decode"] == "DALI 100%"
        assert len(ref) == len(out) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                            for a, b in zip(ref, out))
        assert crop_draws.same_as_torchvision() == (case == "a subclass's own get_params")
    finally:
        monkeypatch.undo()
        crop_draws.same_as_torchvision.cache_clear()
