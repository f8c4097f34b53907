"""Every IR op has, in every back end, a kernel or a stated absence, and the tables agree with
the op's placement (what planning reads). Adding an op is a checklist this test enforces."""
import pytest

import dali_autoproxy.plan.ir as ir
import dali_autoproxy.plan.translate  # noqa: F401  (defines every op a converter makes)
from dali_autoproxy.backends.cpu_replay import CPU_KERNELS
from dali_autoproxy.backends.dali.lowering import DALI_KERNELS
from dali_autoproxy.backends.torch_stage import TORCH_KERNELS
from dali_autoproxy.plan.ir import ALL_OPS, Crop, PillowResize, Placement, Resize, ToCHW, all_ops, split_at_takeover
from dali_autoproxy.plan.kernel_table import KernelTable, MissingKernel


def test_all_ops_lists_every_op_dataclass_of_the_ir():
    declared = {obj for obj in vars(ir).values()
                if isinstance(obj, type) and isinstance(getattr(obj, "placement", None), Placement)}
    assert declared == set(ALL_OPS)


@pytest.mark.parametrize("op_type", all_ops(), ids=lambda t: t.__name__)
def test_each_op_is_a_kernel_or_a_stated_absence_in_each_back_end(op_type):
    for table in (DALI_KERNELS, TORCH_KERNELS, CPU_KERNELS):
        assert table.has(op_type) != (table.absence(op_type) is not None), (table.backend, op_type)
    assert CPU_KERNELS.has(op_type), "the CPU replay must run every op (it recomputes a failed batch)"
    where = op_type.placement
    assert DALI_KERNELS.has(op_type) == (where is not Placement.TORCH)
    assert TORCH_KERNELS.has(op_type) == (where is not Placement.DALI)


def test_registering_twice_is_an_error_and_a_missing_kernel_names_op_and_back_end():
    table = KernelTable("test back end")
    table.register(Crop)(lambda *a: None)
    with pytest.raises(ValueError, match="Crop is registered twice in the test back end"):
        table.register(Crop)(lambda *a: None)
    with pytest.raises(ValueError):
        table.not_here("no", Crop)
    with pytest.raises(MissingKernel, match="ToCHW has no kernel in the test back end"):
        table[ToCHW()]
    table.not_here("because", ToCHW)
    with pytest.raises(MissingKernel, match="because"):
        table[ToCHW]
    with pytest.raises(MissingKernel, match="Resize has no kernel in the torch stage: DALI runs tensor resizes"):
        TORCH_KERNELS[Resize("linear", True, 0)]


def test_converters_cannot_be_registered_twice():
    import torchvision.transforms as T

    from dali_autoproxy.plan.translate import lookup, register
    lookup(T.ToTensor())  # converters loaded
    with pytest.raises(ValueError, match="already has a converter"):
        register(T.ToTensor)(lambda t, state, alloc: None)


def test_the_torch_stage_takes_over_where_placement_says():
    from dali_autoproxy.plan.ir import ColorJitter, Flip, Normalize, Resize, ToFloat
    jitter = ColorJitter(0, (True, True, True, True))
    ops = [Crop(0), Resize("linear", True, 4), Flip(6), jitter, ToFloat(1 / 255), Normalize((0.5,), (0.5,))]
    dali, torch_ops = split_at_takeover(ops)
    assert dali == ops[:2] and torch_ops == ops[2:]  # the flip before it joins the stage
    assert split_at_takeover([jitter, Resize("linear", True, 0)]) == ([jitter, Resize("linear", True, 0)], [])
    assert split_at_takeover(ops[:3]) == (ops[:3], [])


def test_the_exact_resize_takes_over_at_the_resize_and_leaves_the_crop_and_flip_before_it_to_dali():
    from dali_autoproxy.plan.ir import Flip, Normalize, ToFloat
    ops = [Flip(0), Crop(1, in_bounds=True), PillowResize(5), Crop(10), ToFloat(1 / 255), Normalize((0.5,), (0.5,))]
    dali, torch_ops = split_at_takeover(ops)
    assert dali == ops[:2] and torch_ops == ops[2:]  # DALI pads its crops; the stage crops after resizing
    assert split_at_takeover([PillowResize(0), Resize("linear", True, size=(4, 4))])[1] == []  # DALI-only after


def test_an_op_of_ones_own_in_one_place(photo_root):
    """register_op: the op, its converter and its kernels in one call; checked like the built-in
    ones; a loader using it runs on DALI's CPU backend (the torch stage) equal to plain."""
    from dataclasses import dataclass
    from typing import ClassVar, Tuple

    import numpy as np
    import torch
    import torchvision.transforms as T
    from helpers import image_folder, load_all
    from PIL import Image

    import dali_autoproxy
    from dali_autoproxy.plan.ir import Op
    from dali_autoproxy.plan.steps import Step

    class RandomThreshold:  # the user's own transform: black and white at a random level
        def __call__(self, img):
            level = int(torch.randint(64, 192, (1,)))
            return img.point(lambda v: 255 if v >= level else 0)

    @dataclass(frozen=True)
    class Threshold(Op):
        placement: ClassVar[Placement] = Placement.TORCH
        params: ClassVar[Tuple[str, ...]] = ("level",)
        slot: int

    def convert(t, state, alloc):
        op = Threshold(alloc(Threshold))
        return Step("RandomThreshold", [op], lambda g: g.put(op, level=int(torch.randint(64, 192, (1,)))))

    def on_torch(x, op, batch):
        level = batch.params[:, op.col("level")].view(-1, 1, 1, 1)
        return torch.where(x >= level, 255.0, 0.0)

    def on_cpu(img, op, row, v2_step):
        level = int(op.value(row, "level"))
        return img.point(lambda v: 255 if v >= level else 0)

    with pytest.raises(TypeError, match="needs a cpu kernel"):
        dali_autoproxy.register_op(Threshold, transforms=[RandomThreshold], converter=convert, torch=on_torch)
    with pytest.raises(TypeError, match="never runs in dali"):
        dali_autoproxy.register_op(Threshold, torch=on_torch, cpu=on_cpu, dali=on_cpu)
    dali_autoproxy.register_op(Threshold, transforms=[RandomThreshold], converter=convert, torch=on_torch, cpu=on_cpu)
    assert Threshold in all_ops()
    test_each_op_is_a_kernel_or_a_stated_absence_in_each_back_end(Threshold)
    ds = image_folder(photo_root, T.Compose([T.RandomCrop(48), RandomThreshold(), T.PILToTensor()]))
    ref = load_all(ds, autoproxy=False)
    out = load_all(ds, autoproxy=True)
    rep = dali_autoproxy.report()[-1]
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["dali_transforms"][-2] == "RandomThreshold", rep
    for a, b in zip(ref, out):
        assert torch.equal(a[0], b[0])
    assert np.unique(np.asarray(out[0][0])).tolist() == [0, 255] and Image is not None
