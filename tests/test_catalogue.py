"""Every catalogued transform (tests/catalogue.py), v1 and v2, through real DataLoader workers
and real DALI pipelines, against plain torchvision with the same seed. Here on DALI's CPU
backend; test_gpu.py runs the same cases on the GPU."""
import math
import random

import pytest
import torch
from catalogue import CASES, where_it_runs
from helpers import image_folder, last_report, load_all

PARAMS = [pytest.param(c, api, id=f"{c.name}-{api}") for c in CASES for api in c.apis]


def pil_rgb(path):
    """Not torchvision's loader: the worker decodes with PIL and pixels travel (raw input)."""
    from PIL import Image
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
        img.load()  # pixels used here: decoded by Pillow, never deferred to DALI's decoder
        return img


def measure(case, api, root, device="cpu", raw=False, resize=None):
    """(status, reason, max abs error, mean abs error, PSNR) of autoproxy against torchvision;
    errors in uint8 levels, or in float units for float output. ``raw``: PIL decodes in the
    worker, so the figure is the transforms' alone (nvJPEG decodes a little differently);
    ``resize``: the option of that name (None: the default)."""
    import torchvision
    ds = torchvision.datasets.ImageFolder(root, case.chain(api), loader=pil_rgb) if raw else \
        image_folder(root, case.chain(api))
    kw = dict(seed=17, shuffle=True, batch_size=case.batch)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device=device, resize=resize, **kw)
    rep = last_report()
    status = "DALI" if rep["proxied"] and not rep["partial"] else "partial" if rep["proxied"] else "fallback"
    worst, total, squares, count = 0.0, 0.0, 0.0, 0
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb.cpu()), "labels differ"
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        b = b.cpu()
        count += a.numel()
        if torch.equal(a, b):
            continue
        # uint8 levels differ exactly in int32; float outputs in float64
        d = (a.int() - b.int()) if a.dtype == torch.uint8 else (a.double() - b.double())
        worst = max(worst, float(d.abs().max()))
        total += float(d.abs().sum(dtype=torch.float64))
        squares += float(d.double().square().sum())
    uint8 = ref[0][0].dtype == torch.uint8
    mse = squares / count
    return dict(status=status, reason=rep["partial"] or rep["reason"], max=worst, mean=total / count,
                psnr=(float("inf") if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)) if uint8 else None,
                uint8=uint8)


def check(case, m: dict, exact_float=1e-5, mae=0.5, psnr_min=40.0, resize=None):
    expect = case.expected(resize)
    if expect == "exact":
        assert m["status"] == "DALI", m
        assert m["max"] <= (0 if m["uint8"] else exact_float), m
    elif expect == "bound":
        assert m["status"] == "DALI", m
        if m["uint8"]:
            assert m["mean"] <= mae and m["psnr"] >= psnr_min, m
        else:
            assert m["mean"] * 255 <= mae, m
    else:  # the worker runs it: torchvision's own code, DALI at most converts afterwards
        assert m["status"] in ("partial", "fallback") and m["reason"], m
        assert m["max"] <= (0 if m["uint8"] else exact_float), m


@pytest.mark.parametrize("case,api", PARAMS)
def test_transform_against_torchvision(photo_root, case, api):
    check(case, measure(case, api, photo_root))


@pytest.mark.parametrize("case,api", [pytest.param(c, api, id=f"{c.name}-{api}")
                                      for c in CASES if c.dali_resize for api in c.apis])
def test_the_dali_resize_within_its_bound(photo_root, case, api):
    """The opt-in resize="dali": DALI's resize where the default runs Pillow's arithmetic."""
    check(case, measure(case, api, photo_root, resize="dali"), resize="dali")


@pytest.mark.parametrize("case,api", PARAMS)
def test_planner_agrees_with_expectation(case, api):
    status, reason = where_it_runs(case, api)
    if case.expect == "worker":
        assert status != "DALI" and reason
    else:
        assert status in ("DALI", "recorded"), reason


def test_catalogue_covers_every_module_level_image_transform():
    """A transform added to torchvision (or forgotten here) shows up as a failure."""
    import torchvision.transforms as T
    names = {c.name.split(" ")[0].split("(")[0] for c in CASES}
    skip = {"Compose", "ToTensor", "PILToTensor", "ToPILImage", "ConvertImageDtype", "Normalize", "Resize",
            "LinearTransformation", "RandomApply", "RandomTransforms", "InterpolationMode", "AutoAugmentPolicy",
            "RandomErasing", "ElasticTransform"}
    classes = [n for n in dir(T) if n[0].isupper() and isinstance(getattr(T, n), type)]
    missing = [n for n in classes if n not in names and n not in skip]
    assert not missing, missing
    assert all(c.expect in ("exact", "bound", "worker") for c in CASES), "unknown expectation"


@pytest.mark.parametrize("case,api", [p for p in PARAMS if p.values[0].expect != "worker"])
def test_cpu_replay_of_the_plan_equals_torchvision(photo_root, case, api, pillow_hooks):
    """When DALI fails on a batch, its samples are recomputed by cpu_replay.run_plan from the
    params the worker drew. That replay must be torchvision's own result (for every offloaded
    case, exact, also where DALI's resampling is only bounded), else a DALI hiccup would
    silently change the augmentation."""
    import pathlib

    from PIL import Image

    from dali_autoproxy.backends.cpu_replay import run_plan
    from dali_autoproxy.plan.planning import build_plan
    from dali_autoproxy.plan.record.image import NeedsPixels
    from dali_autoproxy.plan.record.learnt import LEARNT
    chain = case.chain(api)
    plan = build_plan(chain)
    for k, path in enumerate(sorted(pathlib.Path(photo_root).rglob("*.jpg"))[:3]):
        with Image.open(path) as f:
            img = f.convert("RGB")
        torch.manual_seed(100 + k)
        random.seed(100 + k)  # v1's RandomOrder shuffles with Python's generator
        ref = chain(img)
        for _ in range(4):  # as a worker does: a recorded step that changes sizes gets a plan of its shape
            torch.manual_seed(100 + k)
            random.seed(100 + k)
            try:
                row = plan.draw(img.size[1], img.size[0])
                break
            except NeedsPixels as exc:
                LEARNT.learn(exc)
                plan = build_plan(chain)
        out = run_plan(plan, img, row)
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert (out.double() - ref.double()).abs().max() <= (0 if ref.dtype == torch.uint8 else 1e-6), path
