"""Every IR op has, in every back end, a kernel or a stated absence, and the tables agree with
the op's placement (what planning reads). Adding an op is a checklist this test enforces."""
import pytest

import dali_autoproxy.plan.ir as ir
from dali_autoproxy.backends.cpu_replay import CPU_KERNELS
from dali_autoproxy.backends.dali.lowering import DALI_KERNELS
from dali_autoproxy.backends.torch_stage import TORCH_KERNELS
from dali_autoproxy.plan.ir import ALL_OPS, Crop, PillowResize, Placement, Resize, ToCHW, split_at_takeover
from dali_autoproxy.plan.kernel_table import KernelTable, MissingKernel


def test_all_ops_lists_every_op_dataclass_of_the_ir():
    declared = {obj for obj in vars(ir).values()
                if isinstance(obj, type) and isinstance(getattr(obj, "placement", None), Placement)}
    assert declared == set(ALL_OPS)


@pytest.mark.parametrize("op_type", ALL_OPS, ids=lambda t: t.__name__)
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
