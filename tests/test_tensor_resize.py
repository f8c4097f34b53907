"""Resizes of tensor images by torchvision's own kernel (ir.TensorResize): with resize="pillow"
(torchvision's results asked for), and for the filters DALI lacks on tensors (torch's bicubic,
its legacy nearest) whatever the setting. Through real workers and real DALI pipelines: on DALI's
CPU backend every value equal to plain torchvision's (uint8 every level, floats within float32
rounding); on the GPU v2's uint8 bilinear and bicubic resizes in the CPU kernel's integer
arithmetic (every level), the others torch's CUDA kernels, within a level."""
import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, in_tritons_interpreter, last_report, load_all
from test_catalogue import pil_rgb

I = T.InterpolationMode
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _chain(api, geometry, interpolation, antialias, dtype):
    m = T if api == "v1" else v2
    head = [m.PILToTensor()]
    if dtype == "float":
        head.append(T.ConvertImageDtype(torch.float) if api == "v1" else v2.ToDtype(torch.float32, scale=True))
    if geometry == "rrc":
        tail = [m.RandomResizedCrop(96, interpolation=interpolation, antialias=antialias)]
    else:
        tail = [m.Resize(100, interpolation=interpolation, antialias=antialias), m.CenterCrop(96)]
    return m.Compose(head + tail)


CASES = [  # (api, geometry, interpolation, antialias, dtype, resize)
    *[(api, "rrc", I.BILINEAR, aa, "uint8", "pillow") for api in ("v1", "v2") for aa in (True, False)],
    *[(api, "resize", I.BICUBIC, aa, "uint8", "dali") for api in ("v1", "v2") for aa in (True, False)],
    ("v1", "resize", I.NEAREST, True, "uint8", "dali"), ("v2", "rrc", I.NEAREST, True, "uint8", "dali"),
    ("v1", "rrc", I.NEAREST_EXACT, False, "uint8", "pillow"),
    ("v2", "resize", I.NEAREST_EXACT, True, "uint8", "pillow"),
    *[(api, "resize", I.BILINEAR, True, "float", "pillow") for api in ("v1", "v2")],
    ("v1", "rrc", I.BILINEAR, False, "float", "pillow"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("api,geometry,interpolation,antialias,dtype,resize", CASES,
                         ids=["-".join(str(getattr(v, "value", v)) for v in c) for c in CASES])
def test_a_tensor_resize_is_torchvisions(photo_root, device, api, geometry, interpolation, antialias, dtype, resize):
    chain = _chain(api, geometry, interpolation, antialias, dtype)
    # on the GPU, Pillow decodes in the worker: the resize's difference alone (nvJPEG's is its own)
    ds = image_folder(photo_root, chain) if device == "cpu" else torchvision.datasets.ImageFolder(
        photo_root, chain, loader=pil_rgb)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=7)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=7, device=device, resize=resize, strict=device == "cpu")
    rep = last_report()
    assert rep["proxied"] and not rep["partial"] and (device == "gpu" or rep["decode"] == "DALI 100%"), rep
    worst, mean = 0.0, 0.0
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb) and a.shape == b.shape and a.dtype == b.dtype
        d = (a.double() - b.cpu().double()).abs()
        worst, mean = max(worst, float(d.max())), max(mean, float(d.mean()))
    level = 1 if dtype == "uint8" else 1 / 255
    integers = api == "v2" and dtype == "uint8" and interpolation in (I.BILINEAR, I.BICUBIC)
    if device == "cpu" or integers:
        assert worst <= (0 if dtype == "uint8" else 1e-5), worst
    else:  # torch's CUDA kernels (float32) against the CPU's (uint8 fixed point, or float32 in another order)
        assert worst <= 2 * level and mean <= 0.2 * level, (worst / level, mean / level)


def test_a_bilinear_tensor_resize_is_torchvisions_by_default_and_dalis_on_request():
    """resize="pillow" (the default): torchvision's kernel; resize="dali": DALI's resize for bilinear,
    within its bound (docs/transforms.md)."""
    from dali_autoproxy.plan.ir import Resize, TensorResize
    from dali_autoproxy.plan.planning import build_plan
    from dali_autoproxy.plan.settings import SETTINGS
    chain = _chain("v2", "rrc", I.BILINEAR, True, "uint8")
    assert SETTINGS["resize"] == "pillow"
    assert any(type(op) is TensorResize for op in build_plan(chain).ops)
    before = SETTINGS["resize"]
    try:
        SETTINGS["resize"] = "dali"
        assert any(type(op) is Resize for op in build_plan(chain).ops)
        SETTINGS["resize"] = "pillow"
        assert any(type(op) is TensorResize for op in build_plan(chain).ops)
    finally:
        SETTINGS["resize"] = before


SIZE_PAIRS = [(97, 131, 64, 80), (64, 80, 97, 131), (300, 200, 37, 251), (5, 7, 5, 3), (40, 33, 17, 33),
              (1, 9, 4, 2), (481, 640, 224, 224), (12, 500, 12, 11)]


def uint8_resize_differences(on: str, pairs=SIZE_PAIRS, batch_side: int = 200) -> dict:
    """uint8_resize against torchvision v2 on the CPU (where it resizes uint8 in integers): the
    values that differ, per case, over both filters, antialiased or not, down, up, one axis
    alone, an edge of one pixel; and a batch of many input sizes to one output size, each in the
    top-left corner of the padded batch."""
    from dali_autoproxy.backends.torch_stage import uint8_resize
    rng = np.random.default_rng(5)
    differ = {}
    for ih, iw, oh, ow in pairs:
        images = torch.from_numpy(rng.integers(0, 256, (2, 3, ih, iw), dtype=np.uint8))
        images = images.contiguous(memory_format=torch.channels_last)
        for mode in ("bilinear", "bicubic"):
            for antialias in (True, False):
                want = v2.functional.resize_image(images, [oh, ow], interpolation=I(mode), antialias=antialias)
                got = uint8_resize.resize(images.to(on), [(ih, iw)] * 2, [oh, ow], mode, antialias).cpu()
                differ[f"{ih}x{iw}->{oh}x{ow} {mode} {antialias}"] = int((want.int() != got.int()).sum())
    ins = [(int(h), int(w)) for h, w in rng.integers(1, batch_side, (12, 2))] + [(batch_side // 3, batch_side // 2)]
    padded = torch.zeros((len(ins), 3, batch_side, batch_side), dtype=torch.float32)
    want = []
    for b, (h, w) in enumerate(ins):
        image = torch.from_numpy(rng.integers(0, 256, (1, 3, h, w), dtype=np.uint8))
        padded[b, :, :h, :w] = image[0].float()
        want.append(v2.functional.resize_image(image.contiguous(memory_format=torch.channels_last), [31, 40],
                                               interpolation=I.BILINEAR, antialias=True)[0])
    got = uint8_resize.resize(padded.to(on), np.array(ins), [31, 40], "bilinear", True).cpu()
    differ["many sizes"] = int((torch.stack(want).int() != got.int()).sum())
    return differ


def _native_uint8_resize_or_skip() -> None:
    from dali_autoproxy.backends.torch_stage import uint8_resize
    if not uint8_resize.cpu_resizes_natively("bilinear"):
        pytest.skip("this CPU resizes bilinear uint8 through float32 (no AVX2): nothing integer to match")


@pytest.mark.parametrize("device", DEVICES)
def test_torchs_uint8_resize_arithmetic_equals_its_cpu_kernel(device):
    """uint8_resize (what the stage runs on a GPU for v2's uint8 bilinear and bicubic resizes):
    as int32 torch ops on the CPU, through the exact resize's Triton kernel on a GPU, every value
    torchvision's CPU kernel's."""
    _native_uint8_resize_or_skip()
    differ = uint8_resize_differences("cuda" if device == "gpu" else "cpu")
    assert not any(differ.values()), {k: v for k, v in differ.items() if v}


def test_torchs_uint8_resize_in_the_triton_kernel_in_tritons_interpreter():
    """The Triton path of uint8_resize (torch's tables in the kernel's 22-bit form), in Triton's
    interpreter on the CPU, on small images: every value torchvision's CPU kernel's."""
    _native_uint8_resize_or_skip()
    differ = in_tritons_interpreter(__file__)
    assert differ and not any(differ.values()), {k: v for k, v in differ.items() if v}


if __name__ == "__main__":  # the interpreter test's subprocess
    import json

    from dali_autoproxy.backends.torch_stage import fused_color
    fused_color.usable = lambda x: True  # the interpreted kernel on the CPU
    print(json.dumps(uint8_resize_differences("cpu", pairs=[(9, 13, 6, 8), (6, 8, 9, 13), (5, 7, 5, 3), (1, 9, 4, 2),
                                                            (12, 30, 12, 11)], batch_side=24)))
