"""The fused kernels (torch_stage/fused_color.py) give torchvision's values: ColorJitter on PIL
images (Pillow's maths) and on uint8 tensors (v2's adjust_*_image), per sample in its drawn
order of brightness, contrast, saturation and hue, and every policy operation of
TrivialAugmentWide / RandAugment / AutoAugment on PIL images, on photographs and on noise, at sizes that
end mid-block, from strided batches. On the CPU the kernel runs in Triton's
interpreter (a subprocess, so no other test sees an interpreted kernel); on a GPU, compiled."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as F
from PIL import Image

triton = pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))


def _samples(rng: np.random.Generator, size):
    """Uint8 [B, H, W, 3]: crops of scikit-image's photographs, then noise."""
    sys.path.insert(0, HERE)
    from photos import photographs
    h, w = size
    out = []
    for photo in photographs():
        y, x = rng.integers(0, photo.shape[0] - h), rng.integers(0, photo.shape[1] - w)
        out.append(photo[y:y + h, x:x + w, :3])
    out += [rng.integers(0, 256, (h, w, 3)) for _ in range(4)]
    out.append(np.full((h, w, 3), 128))  # grey: no hue, every luma the same
    return np.stack(out).astype(np.uint8)


def _draws(rng: np.random.Generator, n: int):
    """params rows as the translation writes them: order, 3 factors, 8-bit hue shift; plus the
    hue factors torchvision takes. One sample skips the whole jitter (RandomApply's 4s)."""
    host = np.zeros((n, 8))
    hue = rng.uniform(-0.5, 0.5, n)
    for i in range(n):
        host[i, :4] = rng.permutation(4)
    host[0, :4] = 4
    host[:, 4:7] = rng.uniform(0.0, 2.0, (n, 3))
    host[:, 7] = [int(h * 255) % 256 for h in hue]
    return host, hue


def _pillow(img: np.ndarray, row: np.ndarray, hue: float, enabled) -> np.ndarray:
    out = Image.fromarray(img)
    steps = [lambda im: F.adjust_brightness(im, row[4]), lambda im: F.adjust_contrast(im, row[5]),
             lambda im: F.adjust_saturation(im, row[6]), lambda im: F.adjust_hue(im, hue)]
    for k in row[:4].astype(int):
        if k < 4 and enabled[k]:
            out = steps[k](out)
    return np.asarray(out)


def check(device: str) -> dict:
    """Fused kernel against torchvision on PIL images and against the torch-op path."""
    from dali_autoproxy.backends.torch_stage import color, fused_color
    from dali_autoproxy.plan.ir import ColorJitter, jitter_order
    dev = torch.device(device)
    tables = color.hue_tables(dev)
    rng = np.random.default_rng(7)
    report = {"fused": fused_color.load() is not None, "cases": []}
    for size, enabled in [((29, 37), (True, True, True, True)), ((40, 45), (True, True, True, True)),
                          ((33, 64), (False, True, True, False)), ((17, 19), (True, False, False, True))]:
        imgs = _samples(rng, size)
        host, hue = _draws(rng, len(imgs))
        op = ColorJitter(slot=0, enabled=enabled)
        params = torch.from_numpy(host).to(dev)
        x = torch.from_numpy(imgs).to(dev).permute(0, 3, 1, 2).to(torch.float32)  # channels-last strides
        fused = fused_color.color_jitter(x, jitter_order(host, op), *color.jitter_factors(params, op), tables)
        ops = color.color_jitter(x.clone(), op, params, host)
        want = np.stack([_pillow(im, row, h, enabled) for im, row, h in zip(imgs, host, hue)])
        got = fused.permute(0, 2, 3, 1).cpu().numpy()
        report["cases"].append({"size": size, "contiguous": fused.is_contiguous(),
                                "equal_to_torchvision": bool((got == want).all()),
                                "equal_to_torch_ops": bool((fused == ops).all()),
                                "differing": int((got != want).any(-1).sum())})
    return report


def _v2_tensor(img: np.ndarray, row: np.ndarray, device: str) -> torch.Tensor:
    import torchvision.transforms.v2.functional as F2
    steps = [F2.adjust_brightness, F2.adjust_contrast, F2.adjust_saturation, F2.adjust_hue]
    out = torch.from_numpy(img).to(device).permute(2, 0, 1).contiguous()
    for k in row[:4].astype(int):
        if 0 <= k < 4:
            out = steps[k](out, float(row[4 + k]))
    return out


def check_tensor_v2(device: str) -> dict:
    """The v2 tensor kernel against torchvision v2 on uint8 tensors, on the same device."""
    from dali_autoproxy.backends.torch_stage import fused_color
    rng = np.random.default_rng(11)
    report = {"fused": fused_color.load() is not None, "cases": []}
    for size in [(29, 37), (40, 45), (33, 64)]:
        imgs = _samples(rng, size)
        n = len(imgs)
        host = np.zeros((n, 8))
        host[:, :4] = [rng.permutation(4) for _ in range(n)]
        host[0, :4] = -1
        host[1, 2:4] = -1  # two adjustments only
        host[:, 4:8] = np.stack([rng.uniform(0.6, 1.4, n), rng.uniform(0, 2, n), rng.uniform(0, 2, n),
                                 rng.uniform(-0.5, 0.5, n)], 1)
        x = torch.from_numpy(imgs).to(device).permute(0, 3, 1, 2).to(torch.float32)
        fused = fused_color.tensor_color_jitter_v2(x, host[:, :4].astype(int), host[:, 4:8])
        want = torch.stack([_v2_tensor(im, row, device) for im, row in zip(imgs, host)])
        report["cases"].append({"size": size, "contiguous": fused.is_contiguous(),
                                "equal_to_torchvision": bool((fused.to(torch.uint8) == want).all()),
                                "differing": int((fused.to(torch.uint8) != want).any(1).sum())})
    return report


POLICY_CASES = {"ShearX": [-0.3, 0.2], "ShearY": [0.25], "TranslateX": [-9.0, 5.0], "TranslateY": [7.0],
                "Rotate": [-30.0, 12.5, 90.0], "Brightness": [-0.5, 0.7], "Color": [0.9, -0.9],
                "Contrast": [0.5, -0.3], "Sharpness": [0.9, -0.8], "Posterize": [2, 5, 8],
                "Solarize": [128.0, 77.5, 0.0, 255.0], "AutoContrast": [0.0], "Equalize": [0.0], "Invert": [0.0],
                "Identity": [0.0]}


def check_augment(device: str) -> dict:
    """The policy kernel (TrivialAugmentWide / RandAugment / AutoAugment on PIL images, nearest
    and bilinear, with a fill) against torchvision's own _apply_op on PIL images and the torch-op
    path, every operation."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.autoaugment import _apply_op

    from dali_autoproxy.backends.torch_stage import fused_color, policies
    from dali_autoproxy.plan.policy_ops import AUGMENT_OPS, Augment
    rng = np.random.default_rng(5)
    report = {"fused": fused_color.load() is not None, "cases": []}
    for size, bilinear, fill in [((37, 41), False, None), ((24, 70), False, [255, 0, 128]), ((37, 41), True, None),
                                 ((31, 29), True, [10, 200, 64])]:
        op = Augment(slot=0, fill=tuple(float(v) for v in (fill or (0, 0, 0))), bilinear=bilinear)
        mode = InterpolationMode.BILINEAR if bilinear else InterpolationMode.NEAREST
        base = _samples(rng, size)
        rows = [(name, m, k) for name, ms in POLICY_CASES.items() for m in ms for k in range(len(base))]
        imgs = np.stack([base[k] for _, _, k in rows])
        host = np.array([[AUGMENT_OPS.index(name), m] for name, m, _ in rows], dtype=np.float64)
        x = torch.from_numpy(imgs).to(device).permute(0, 3, 1, 2).to(torch.float32)
        fused = policies.augment_fused(x, op, host)
        ops = policies.augment(x.clone(), op, host)
        want = np.stack([np.asarray(_apply_op(Image.fromarray(im), name, m, mode, fill))
                         for im, (name, m, _) in zip(imgs, rows)])
        got = fused.permute(0, 2, 3, 1).cpu().numpy()
        wrong = sorted({rows[i][0] for i in np.flatnonzero((got != want).any((1, 2, 3)))})
        report["cases"].append({"size": size, "bilinear": bilinear, "contiguous": fused.is_contiguous(),
                                "equal_to_torchvision": not wrong, "operations_differing": wrong,
                                "equal_to_torch_ops": bool((fused == ops).all())})
    return report


def _assert_exact(report: dict) -> None:
    assert report["fused"], "the Triton kernel did not load"
    for case in report["cases"]:
        assert case["contiguous"] and case["equal_to_torchvision"] and case.get("equal_to_torch_ops", True), case


def _version(text: str):
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


@pytest.mark.slow
@pytest.mark.skipif(_version(triton.__version__) < (3, 8),
                    reason="Triton's interpreter before 3.8 cannot take a runtime loop bound under NumPy 2")
def test_fused_color_jitter_in_tritons_interpreter_equals_torchvision():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.dirname(HERE))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "cpu"], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    for report in json.loads(out.stdout.strip().splitlines()[-1]):  # PIL jitter, v2 tensor jitter, policies
        _assert_exact(report)


@pytest.mark.gpu
def test_fused_color_jitter_on_the_gpu_equals_torchvision():
    from dali_autoproxy.backends.torch_stage import fused_color
    assert fused_color.usable(torch.zeros(1, device="cuda"))
    _assert_exact(check("cuda"))
    _assert_exact(check_tensor_v2("cuda"))
    _assert_exact(check_augment("cuda"))


def test_without_cuda_the_stage_keeps_the_torch_ops():
    from dali_autoproxy.backends.torch_stage import fused_color
    assert not fused_color.usable(torch.zeros(1))


if __name__ == "__main__":
    print(json.dumps([check(sys.argv[1]), check_tensor_v2(sys.argv[1]), check_augment(sys.argv[1])]))


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_the_cpu_division_mode_changes_no_value_of_torchvisions_kernels(api):
    """What cpu_division does on CUDA tensors (a division by a number becomes one by a 0-d
    tensor; mean a sum divided by the count), applied here to CPU tensors, where both are the
    CPU's own arithmetic: torchvision's tensor ColorJitter kernels give the same bits (the GPU
    twin, test_gpu.py, compares CUDA with the mode against the CPU)."""
    from skimage import data

    from dali_autoproxy.backends.torch_stage.host_division import CpuDivision
    from dali_autoproxy.backends.torch_stage.tensor_jitter import tensor_jitter_kernels
    kernels = tensor_jitter_kernels(api)
    x = torch.from_numpy(np.stack([data.astronaut()[:120, :120], data.coffee()[:120, :120]])).permute(0, 3, 1, 2)
    rng = np.random.default_rng(1)
    for which in range(4):
        f = torch.tensor(rng.uniform(-0.1, 0.1, 2) if which == 3 else rng.uniform(0.6, 1.4, 2)).view(-1, 1, 1, 1)
        seen = []
        mode = CpuDivision(applies=lambda t: seen.append(t.shape) or True)
        with mode:
            got = kernels[which](x.contiguous(), f)
        assert torch.equal(got, kernels[which](x.contiguous(), f))
        if which == 1 or (which == 3 and api == "v1"):  # contrast's mean, v1 hue's divisions (v2 multiplies)
            assert seen, which


def test_tritons_once_per_process_set_up_finds_what_it_warms(monkeypatch):
    """The set-up a GPU pipeline starts in the background (``set_up_in_background``) reaches the
    installed Triton's source hash (``triton_key``, where this Triton keeps it) and starts once
    per process; without a GPU its driver part fails quietly, as the first kernel would."""
    pytest.importorskip("triton")
    import importlib

    from dali_autoproxy.backends.torch_stage import fused_color
    homes = [h for h in fused_color._TRITON_KEY_HOMES if hasattr(importlib.import_module(h), "triton_key")]
    assert homes, f"Triton {__import__('triton').__version__} keeps triton_key elsewhere"
    key = importlib.import_module(homes[0]).triton_key
    key.cache_clear()
    fused_color._set_up(0)  # in this thread: what the background thread runs
    assert key.cache_info().currsize == 1
    started = []
    monkeypatch.setattr(fused_color, "_SET_UP", {"started": False})
    monkeypatch.setattr(fused_color.threading, "Thread", lambda **kw: started.append(kw) or type(
        "T", (), {"start": lambda self: None})())
    fused_color.set_up_in_background(0)
    fused_color.set_up_in_background(0)
    assert len(started) == 1 and started[0]["daemon"]
