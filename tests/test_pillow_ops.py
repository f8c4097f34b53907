"""Pillow's own filters as the self-supervised recipes' classes call them: the PillowBlur op
(``ImageFilter.GaussianBlur`` / ``BoxBlur``) against Pillow on photographs, every pixel; the
classes of lightly, MoCo and DINO recognised by their code; lightly's recipes, unchanged, through
real DataLoader workers on DALI's CPU backend, equal to plain for the same seeds."""
import json
import os
import random
import sys
import textwrap

import numpy as np
import pytest
import torch
from helpers import compile_for_a_gpu, image_folder, in_tritons_interpreter, last_report, load_all, recording_off
from photos import photographs
from PIL import Image, ImageFilter

import dali_autoproxy
from dali_autoproxy.backends.torch_stage.pillow_filters import pillow_blur
from dali_autoproxy.plan.ir import Unsupported
from dali_autoproxy.plan.planning import build_plan

RADII = [0.0, 0.1, 0.5, 0.99, 1.0, 1.7, 2.0, 3.25, 7.9, 40.0, 150.0]


@pytest.mark.parametrize("gaussian", [True, False], ids=["GaussianBlur", "BoxBlur"])
@pytest.mark.parametrize("size", [(64, 96), (17, 5), (1, 9)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_pillow_blur_equals_pillow_every_pixel(gaussian, size, mode):
    """A batch where each sample has its own radius (0, fractional, larger than the image)."""
    h, w = size
    photo = Image.fromarray(photographs()[1]).convert(mode)
    crops = [photo.crop((13 * k, 7 * k, 13 * k + w, 7 * k + h)) for k in range(len(RADII))]
    x_radii = np.array(RADII)
    y_radii = np.array(RADII[::-1])
    batch = torch.stack([torch.from_numpy(np.asarray(c).reshape(h, w, -1)).permute(2, 0, 1) for c in crops])
    out = pillow_blur(batch.float(), x_radii, y_radii, 3 if gaussian else 1, gaussian)
    for k, crop in enumerate(crops):
        radius = (float(x_radii[k]), float(y_radii[k]))
        pil = ImageFilter.GaussianBlur(radius) if gaussian else ImageFilter.BoxBlur(radius)
        want = np.asarray(crop.filter(pil)).reshape(h, w, -1)
        got = out[k].permute(1, 2, 0).to(torch.uint8).numpy()
        assert np.array_equal(got, want), (radius, int(np.abs(got.astype(int) - want).max()))


def blur_differences(device: str, sizes=((37, 70), (5, 3))) -> dict:
    """The Triton box-pass kernel (through ``triton_blur``, as ``pillow_blur`` calls it where Triton runs)
    against Pillow: a batch of photograph crops of each size in ``sizes``, each crop with its own
    radius, both blurs, RGB."""
    from dali_autoproxy.backends.torch_stage import _triton_blur
    from dali_autoproxy.backends.torch_stage.pillow_filters import gaussian_box_radius, triton_blur
    photo = Image.fromarray(photographs()[2])
    different, n = 0, 0
    for gaussian in (True, False):
        for h, w in sizes:
            crops = [photo.crop((9 * k, 5 * k, 9 * k + w, 5 * k + h)) for k in range(len(RADII))]
            x = torch.stack([torch.from_numpy(np.array(c)).permute(2, 0, 1) for c in crops]).float().to(device)
            rx, ry = np.array(RADII, dtype=np.float32), np.array(RADII[::-1], dtype=np.float32)
            passes = 3 if gaussian else 1
            if gaussian:
                rx, ry = gaussian_box_radius(rx, passes), gaussian_box_radius(ry, passes)
            x = triton_blur(_triton_blur.box_pass_axis, x, rx, ry, passes)
            for k, crop in enumerate(crops):
                radius = (float(RADII[k]), float(RADII[::-1][k]))
                pil = ImageFilter.GaussianBlur(radius) if gaussian else ImageFilter.BoxBlur(radius)
                want = np.asarray(crop.filter(pil))
                got = x[k].permute(1, 2, 0).to(torch.uint8).cpu().numpy()
                different += int(not np.array_equal(got, want))
                n += 1
    return {"samples": n, "different_from_pillow": different}


def test_triton_blur_kernel_compiles_for_a_gpu():
    """The blur kernel as the stage launches it (its weights int64 rows of one device copy)
    type-checks in Triton's compiler; the interpreter checks no types."""
    pytest.importorskip("triton")
    from dali_autoproxy.backends.torch_stage import _triton_blur
    compile_for_a_gpu(_triton_blur.box_pass_axis,
                      {"src": "*fp32", "dst": "*fp32", "whole": "*i64", "ww": "*i64", "fw": "*i64",
                       **{name: "i32" for name in ("n", "n_across", "C", "s_b", "s_c", "s_along", "s_across",
                                                   "d_b", "d_c", "d_along", "d_across")}},
                      {"BLOCK_O": 32, "BLOCK_A": 32})


@pytest.mark.slow
def test_triton_blur_kernel_in_tritons_interpreter_equals_pillow():
    assert in_tritons_interpreter(__file__) == {"samples": 44, "different_from_pillow": 0}


@pytest.mark.gpu
def test_triton_blur_kernel_on_the_gpu_equals_pillow():
    assert blur_differences("cuda") == {"samples": 44, "different_from_pillow": 0}


def _lightly():
    return pytest.importorskip("lightly.transforms")


def _seeded_runs(ds, **kw):
    """Plain and autoproxied epochs with Python's and NumPy's generators seeded alike (the
    workers inherit them: lightly draws with NumPy, MoCo and DINO with Python's random)."""
    runs = []
    for proxied in (False, True):
        random.seed(7)
        np.random.seed(7)
        runs.append(load_all(ds, autoproxy=proxied, resize="pillow", **kw))
    return runs


def _assert_same(ref, out):
    assert len(ref) == len(out)
    for a, b in zip(ref, out):
        views_a, views_b = a[0], b[0]
        assert len(views_a) == len(views_b)
        for u, v in zip(views_a, views_b):
            assert u.shape == v.shape and torch.equal(u, v), float((u - v).abs().max())
        assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("recipe", ["SimCLR", "BYOL", "DINO", "SwaV", "MoCoV2"])
def test_lightly_recipes_unchanged_run_on_dali_equal_to_plain(photo_root, recipe):
    lt = _lightly()
    make = {
        "SimCLR": lambda: lt.SimCLRTransform(input_size=64),
        "MoCoV2": lambda: lt.MoCoV2Transform(input_size=64),
        "BYOL": lambda: lt.BYOLTransform(lt.BYOLView1Transform(input_size=64),
                                         lt.BYOLView2Transform(input_size=64)),
        "DINO": lambda: lt.DINOTransform(global_crop_size=64, local_crop_size=32, n_local_views=2),
        "SwaV": lambda: lt.SwaVTransform(crop_sizes=(64, 32), crop_counts=(2, 2)),
    }[recipe]
    ds = image_folder(photo_root, make())
    ref, out = _seeded_runs(ds)
    _assert_same(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    assert rep["worker_transforms"] == [] and rep["partial"] is None, rep


@pytest.fixture
def fresh_moco():
    """``moco`` imported afresh in the test, none of it left behind for the next."""
    def forget():
        for name in [m for m in sys.modules if m == "moco" or m.startswith("moco.")]:
            del sys.modules[name]
    forget()
    yield
    forget()


def test_a_known_name_with_other_code_stays_in_the_worker(tmp_path, monkeypatch, fresh_moco):
    """``moco.loader.GaussianBlur`` is translated only when its code is MoCo's."""
    pkg = tmp_path / "moco"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "loader.py").write_text(textwrap.dedent("""
        import random
        from PIL import ImageFilter

        class GaussianBlur(object):
            def __init__(self, sigma=[.1, 2.]):
                self.sigma = sigma

            def __call__(self, x):
                return x.filter(ImageFilter.GaussianBlur(radius=self.sigma[1]))  # not MoCo's draw
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import moco.loader
    import torchvision.transforms as T
    chain = T.Compose([T.RandomResizedCrop(64), moco.loader.GaussianBlur(), T.ToTensor()])
    plan = build_plan(chain)  # called as written, on a recording image: its own draw, recorded
    assert "PillowBlur" not in [type(op).__name__ for op in plan.ops] and plan.records
    with recording_off():
        plan = build_plan(chain)
        assert plan.worker_names == ["RandomResizedCrop", "GaussianBlur"]  # the class runs as written
        assert "is not the code translated here" in plan.split_reason
        with pytest.raises(Unsupported, match="is not the code translated here"):
            build_plan(T.Compose([moco.loader.GaussianBlur(), T.PILToTensor()]))


def test_moco_v3_augmentations_unchanged(photo_root, fresh_moco):
    """MoCo v3's own ``moco/loader.py`` (set MOCO_V3_DIR to a checkout of facebookresearch/moco-v3),
    with main_moco.py's two augmentations: proxied, decode on DALI, equal to plain."""
    root = os.environ.get("MOCO_V3_DIR")
    if not root:
        pytest.skip("set MOCO_V3_DIR to a checkout of facebookresearch/moco-v3")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from dataset_shapes_benchmark import ssl_recipe  # main_moco.py's two augmentations, built once
    ds = image_folder(photo_root, ssl_recipe("moco_v3", size=64))  # imports moco.loader from MOCO_V3_DIR
    ref, out = _seeded_runs(ds)
    _assert_same(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


def test_the_cpu_replay_blurs_as_pillow():
    """A failed batch is recomputed by Pillow itself with the drawn radii."""
    from dali_autoproxy.backends.cpu_replay import CPU_KERNELS
    from dali_autoproxy.plan.pillow_ops import PillowBlur
    img = Image.fromarray(photographs()[0][:80, :120])
    op = PillowBlur(0)
    got = CPU_KERNELS[op](img, op, [1.3, 2.6], False)
    assert np.array_equal(np.asarray(got), np.asarray(img.filter(ImageFilter.GaussianBlur((1.3, 2.6)))))
    assert CPU_KERNELS[op](img, op, [0.0, 0.0], False) is img
    dali_autoproxy.disable()


def test_a_fingerprint_reads_the_code_not_its_formatting(tmp_path, monkeypatch):
    """Comments, docstrings, blank lines and line breaks do not change a fingerprint; a changed
    statement does; and it is the same on every Python version (a fixed snapshot, also found on
    the GPU machine's Python 3.12: the tree is written without the fields a version adds empty)."""
    from dali_autoproxy.plan.translate.registry import call_fingerprint
    variants = {
        "as_moco": """
            def __call__(self, x):
                sigma = random.uniform(self.sigma[0], self.sigma[1])
                x = x.filter(ImageFilter.GaussianBlur(radius=sigma))
                return x
        """,
        "reformatted": """
            def __call__(self, x):
                \"\"\"Blur at a random radius.\"\"\"
                sigma = random.uniform(self.sigma[0],  # the draw
                                       self.sigma[1])

                x = x.filter(ImageFilter.GaussianBlur(radius=sigma))
                return x
        """,
        "changed": """
            def __call__(self, x):
                sigma = random.uniform(self.sigma[0], self.sigma[1])
                return x.filter(ImageFilter.GaussianBlur(radius=sigma * 2))
        """,
    }
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {}
    for name, body in variants.items():
        source = "import random\nfrom PIL import ImageFilter\n\n\nclass GaussianBlur:\n" + textwrap.indent(
            textwrap.dedent(body).strip("\n"), "    ") + "\n"
        (tmp_path / f"fp_{name}.py").write_text(source)
        found[name] = call_fingerprint(__import__(f"fp_{name}").GaussianBlur)
    assert found["as_moco"] == found["reformatted"] != found["changed"]
    assert found["as_moco"] == "c01026973d6d61b0"  # the fingerprint registered for moco.loader.GaussianBlur


def _equal_nested(a, b):
    """Every tensor of two nested batches equal, the structure the same."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), float((a - b).abs().max())
        return
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _equal_nested(a[k], b[k])
        return
    assert isinstance(a, (list, tuple)) and len(a) == len(b), (type(a), type(b))
    for u, v in zip(a, b):
        _equal_nested(u, v)


class GeometricThenColour:
    """DINOv2's shape: a geometric chain hands its PIL image to colour chains (each view its own)."""

    def __init__(self, T):
        self.geometric = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip()])
        self.colour = T.Compose([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                                 T.RandomGrayscale(0.2), T.ToTensor()])
        self.solarized = T.Compose([T.RandomSolarize(128, p=0.5), T.PILToTensor()])

    def __call__(self, img):
        base = self.geometric(img)
        return [self.colour(base), self.solarized(base), self.colour(self.geometric(img))]


def test_a_chain_handing_its_image_to_chains_is_one_plan_on_dali(photo_root):
    import torchvision.transforms as T
    ds = image_folder(photo_root, GeometricThenColour(T))
    ref, out = _seeded_runs(ds)
    _equal_nested(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


class HandedAndRead:
    """A handed image whose pixels the dataset's code reads: plain's pixels, plain's draws after."""

    def __init__(self, T):
        self.geometric = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip()])
        self.to_tensor = T.Compose([T.RandomVerticalFlip(), T.PILToTensor()])

    def __call__(self, img):
        base = self.geometric(img)
        mean = torch.from_numpy(np.asarray(base).astype(np.float32)).mean()
        return [self.to_tensor(base), mean, self.to_tensor(self.geometric(img))]


def test_a_handed_image_read_as_pixels_is_plains(photo_root):
    import torchvision.transforms as T
    ds = image_folder(photo_root, HandedAndRead(T))
    ref, out = _seeded_runs(ds)
    _equal_nested(ref, out)


def _import_from(env: str, module: str, what: str):
    root = os.environ.get(env)
    if not root:
        pytest.skip(f"set {env} to a checkout of the repository")
    sys.path.insert(0, root)
    try:
        return getattr(__import__(module, fromlist=[what]), what)
    finally:
        sys.path.remove(root)


def test_dinov2_augmentation_unchanged(photo_root):
    """DINOv2's ``dinov2/data/augmentations.py`` and ``transforms.py`` (DINOV2_DIR: a directory
    holding them as ``dinov2/data/``): global and local crops proxied, decode on DALI, equal to plain."""
    augmentation = _import_from("DINOV2_DIR", "dinov2.data.augmentations", "DataAugmentationDINO")
    ds = image_folder(photo_root, augmentation((0.32, 1.0), (0.05, 0.32), 2, global_crops_size=64,
                                               local_crops_size=32))
    ref, out = _seeded_runs(ds)
    _equal_nested(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


def test_dino_augmentation_unchanged(photo_root):
    """DINO's ``DataAugmentationDINO`` from its ``main_dino.py`` (DINO_DIR: a checkout of
    facebookresearch/dino), its ``utils.py`` blur and solarization, main_dino.py's defaults
    (2 x 224 + 8 x 96): every view proxied, decode on DALI, equal to plain, each image decoded once."""
    augmentation = _import_from("DINO_DIR", "main_dino", "DataAugmentationDINO")
    ds = image_folder(photo_root, augmentation((0.4, 1.0), (0.05, 0.4), 8))
    ref, out = _seeded_runs(ds)
    _equal_nested(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep
    assert rep["dali_decodes"] * 10 == rep["decoded_on_dali"], rep


def test_swav_multicrop_dataset_unchanged(photo_root):
    """SwAV's ``src/multicropdataset.py`` (SWAV_DIR: a checkout of facebookresearch/swav), its own
    dataset and PIL blur: every crop proxied, decode on DALI, equal to plain."""
    dataset = _import_from("SWAV_DIR", "src.multicropdataset", "MultiCropDataset")
    ds = dataset(photo_root, size_crops=[64, 32], nmb_crops=[2, 2], min_scale_crops=[0.14, 0.05],
                 max_scale_crops=[1.0, 0.14])
    ref, out = _seeded_runs(ds)
    _equal_nested(ref, out)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep


if __name__ == "__main__":  # the interpreter test's subprocess
    # the interpreter runs every program in Python: a smaller long crop, still narrower than the radii
    print(json.dumps(blur_differences(sys.argv[1], sizes=((17, 31), (5, 3)))))
