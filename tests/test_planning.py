"""Unit tests of the translation layer against torchvision's own functions."""
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
import torchvision.transforms.v2 as v2
from helpers import why_not

from dali_autoproxy.plan import planning
from dali_autoproxy.plan.ir import Crop, Flip, Normalize, PillowResize, Resize, ToCHW, ToFloat, Unsupported
from dali_autoproxy.plan.planning import build_plan
from dali_autoproxy.plan.translate.geometry import center_crop_box, resized_output_size


@pytest.mark.parametrize("hw", [(300, 400), (401, 299), (256, 256), (100, 1000)])
@pytest.mark.parametrize("size,max_size", [(256, None), ([224], None), ((200, 300), None), (256, 300), (None, 300)])
def test_resized_output_size_matches_torchvision(hw, size, max_size):
    if size is None:
        tf = v2.Resize(size=None, max_size=max_size)
    else:
        tf = v2.Resize(size, max_size=max_size)
    img = torch.zeros(3, *hw, dtype=torch.uint8)
    assert resized_output_size(*hw, tf.size, max_size) == tuple(tf(img).shape[-2:])


@pytest.mark.parametrize("hw", [(300, 400), (225, 223), (100, 150), (224, 224), (50, 500)])
@pytest.mark.parametrize("crop", [(224, 224), (101, 99), (300, 120)])
def test_center_crop_box_matches_torchvision(hw, crop):
    img = (torch.arange(hw[0] * hw[1]).reshape(1, *hw) % 251 + 1).to(torch.uint8)
    expected = F.center_crop(img, list(crop))
    top, left = center_crop_box(*hw, *crop)
    padded = torch.zeros(1, hw[0] + 2 * crop[0], hw[1] + 2 * crop[1], dtype=torch.uint8)
    padded[:, crop[0]:crop[0] + hw[0], crop[1]:crop[1] + hw[1]] = img
    got = padded[:, crop[0] + top:crop[0] + top + crop[0], crop[1] + left:crop[1] + left + crop[1]]
    assert torch.equal(got, expected)


@pytest.mark.parametrize("tf", [T.RandomResizedCrop(224, scale=(0.2, 1.0)),
                                v2.RandomResizedCrop(224, ratio=(0.5, 2.0))])
def test_random_resized_crop_draws_torchvisions_boxes(tf, monkeypatch):
    monkeypatch.setitem(planning.SETTINGS, "resize", "pillow")
    plan = build_plan(T.Compose([tf, T.ToTensor()]) if isinstance(tf, T.RandomResizedCrop)
                      else v2.Compose([tf, v2.ToImage()]))
    img = torch.zeros(3, 333, 500, dtype=torch.uint8)
    for seed in range(50):
        torch.manual_seed(seed)
        if isinstance(tf, T.RandomResizedCrop):
            expected = list(T.RandomResizedCrop.get_params(img, tf.scale, tf.ratio))
        else:
            p = tf.make_params([img])
            expected = [p["top"], p["left"], p["height"], p["width"]]
        torch.manual_seed(seed)
        h, w = expected[2], expected[3]
        # the box, then the exact resize's row (its box: the whole crop)
        assert plan.draw(333, 500) == expected + [h, w, 224, 224, 2, 0, 0, h, w]


def test_flip_draw_matches_torchvision():
    plan = build_plan(T.Compose([T.RandomHorizontalFlip(0.3), T.PILToTensor()]))
    img = torch.arange(6, dtype=torch.uint8).reshape(1, 2, 3)
    for seed in range(40):
        torch.manual_seed(seed)
        flipped = not torch.equal(T.RandomHorizontalFlip(0.3)(img), img)
        torch.manual_seed(seed)
        assert plan.draw(2, 3) == [int(flipped)]


def test_ops_of_the_imagenet_train_chain(monkeypatch):
    plan = build_plan(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                 T.Normalize([0.5] * 3, [0.25] * 3)]))  # the default: Pillow's arithmetic
    assert [type(op) for op in plan.ops] == [Crop, PillowResize, Flip, ToFloat, ToCHW, Normalize]
    assert plan.ops[0].in_bounds and plan.n_params == 14 and plan.state.fixed_size == (224, 224)
    monkeypatch.setitem(planning.SETTINGS, "resize", "dali")  # DALI's resize, no torch stage
    plan = build_plan(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                 T.Normalize([0.5] * 3, [0.25] * 3)]))
    assert [type(op) for op in plan.ops] == [Crop, Resize, Flip, ToFloat, ToCHW, Normalize]
    assert plan.ops[0].in_bounds and plan.n_params == 5 and plan.state.fixed_size == (224, 224)


def test_box_and_random_filters_take_the_exact_resize_whatever_the_option():
    plan = build_plan(T.Compose([T.Resize(64, interpolation=T.InterpolationMode.BOX), T.CenterCrop(64), T.ToTensor()]))
    assert [type(op) for op in plan.ops][:2] == [PillowResize, Crop]


def test_a_dali_only_step_after_the_resize_keeps_dalis_resize_instead_of_the_worker(monkeypatch):
    """fidelity="fast": ColorJitter is DALI's own operator, which cannot follow the torch stage's
    exact resize: DALI's resize instead, the chain still whole on DALI's side."""
    from dali_autoproxy.plan.ir import FastColorJitter
    monkeypatch.setitem(planning.SETTINGS, "resize", "pillow")
    monkeypatch.setitem(planning.SETTINGS, "fidelity", "fast")
    plan = build_plan(v2.Compose([v2.RandomResizedCrop(64), v2.ColorJitter(0.4, 0.4), v2.PILToTensor()]))
    kinds = [type(op) for op in plan.ops]
    assert plan.worker_prefix == 0 and Resize in kinds and FastColorJitter in kinds and PillowResize not in kinds


def test_a_tensor_resize_after_the_exact_resize_is_torchvisions_in_the_same_stage(monkeypatch):
    monkeypatch.setitem(planning.SETTINGS, "resize", "pillow")
    plan = build_plan(v2.Compose([v2.RandomResizedCrop(64), v2.PILToTensor(), v2.Resize(32, antialias=True)]))
    assert plan.worker_prefix == 0 and [type(op).__name__ for op in plan.ops] == [
        "Crop", "PillowResize", "ToCHW", "TensorResize"]


@pytest.mark.parametrize("tf,reason", [
    (T.Compose([T.Lambda(lambda x: x), T.ToTensor()]), "Lambda runs user code"),
    (T.Compose([T.Resize(10)]), "ends in a PIL image"),
    (T.Compose([T.Normalize([0.5], [0.5])]), "needs a float tensor"),
    (T.Compose([T.ToTensor(), T.ToTensor()]), "expects a PIL image"),
    (T.Compose([T.ToTensor(), T.Resize(10, interpolation=T.InterpolationMode.LANCZOS)]), "lanczos"),  # a tensor
    (v2.Compose([v2.ToImage(), v2.ToDtype({torch.Tensor: torch.float32})]), "dict"),
])
def test_unsupported_chains_say_why(tf, reason):
    assert reason in why_not(tf)


def test_torch_stage_takes_over_at_colour_jitter_only_when_it_can_finish(monkeypatch):
    monkeypatch.setitem(planning.SETTINGS, "resize", "pillow")
    from dali_autoproxy.plan.ir import ColorJitter
    from dali_autoproxy.plan.ir import split_at_takeover as split
    late = build_plan(T.Compose([T.RandomResizedCrop(64), T.ColorJitter(0.4), T.RandomGrayscale(),
                                 T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3), T.RandomErasing()]))
    dali_ops, torch_ops = split(late.ops)
    assert [type(op) for op in dali_ops] == [Crop] and isinstance(torch_ops[0], PillowResize)
    assert isinstance(torch_ops[1], ColorJitter)
    early = build_plan(T.Compose([T.ColorJitter(0.4), T.RandomResizedCrop(64), T.ToTensor()]))
    assert early.worker_names == ["ColorJitter"]  # a crop after it and DALI has not cropped: the worker runs it
    assert [type(op) for op in split(early.ops)[1]][:1] == [PillowResize]  # then the exact resize


def test_a_subclass_that_only_sets_arguments_is_its_parent(photo_root):
    """DINOv2's blur is ``class GaussianBlur(RandomApply)`` filling its arguments in ``__init__``:
    such a subclass is translated as its parent (same draws, same pixels); one that overrides a
    method of the call path stays in the worker."""
    import torch
    import torchvision.transforms as T
    from helpers import image_folder, last_report, load_all, recording_off

    class GaussianBlur(T.RandomApply):  # the shape of dinov2/data/transforms.py's
        def __init__(self, *, p: float = 0.5, radius_min: float = 0.1, radius_max: float = 2.0):
            super().__init__(transforms=[T.GaussianBlur(kernel_size=9, sigma=(radius_min, radius_max))], p=1 - p)

    class Overrides(T.RandomHorizontalFlip):
        def forward(self, img):
            return img

    chain = T.Compose([T.RandomResizedCrop(64), GaussianBlur(p=0.5), T.RandomHorizontalFlip(), T.PILToTensor()])
    assert planning.build_plan(chain).names == ["RandomResizedCrop", "GaussianBlur", "RandomHorizontalFlip",
                                                "PILToTensor"]
    with pytest.raises(Unsupported, match="has no DALI translation"), recording_off():
        planning.build_plan(T.Compose([Overrides(), T.PILToTensor()]))  # (with recording: called as written)
    ds = image_folder(photo_root, T.Compose([T.RandomCrop(96), GaussianBlur(p=0.5), T.PILToTensor()]))
    ref = load_all(ds, autoproxy=False)
    out = load_all(ds, autoproxy=True)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep
    for a, b in zip(ref, out):
        assert (a[0].int() - b[0].int()).abs().max() <= 1  # GaussianBlur's stated bound (docs/transforms.md)
        assert torch.equal(a[1], b[1])
