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
            monkeypatch.setattr(crop_draws, "uniform", lambda u=u: float(u))
            g = SampleGeometry(4, 4)
            coin_drawer(p)(g)
            assert g.params == [int(bool(torch.tensor([u], dtype=torch.float32) < p))], (p, u)
