"""timm's transform classes (timm installed by the test extras): recognised by name, offloaded,
with torchvision's results; and never imported by dali_autoproxy itself."""
import json
import subprocess
import sys

import pytest
import torch
from helpers import image_folder, last_report, load_all, why_not
from test_fidelity import compare

timm_data = pytest.importorskip("timm.data")
import torchvision.transforms as T  # noqa: E402
from timm.data.transforms import MaybePILToTensor, RandomResizedCropAndInterpolation, ToNumpy  # noqa: E402


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_timm_create_transform_is_offloaded(photo_root, training):
    tf = timm_data.create_transform(160, is_training=training, color_jitter=0.4)
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=5)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=5)
    rep = last_report()
    assert rep["proxied"] and rep["decode_on_dali"] and not rep["partial"], rep
    compare(ref, out)  # same crops (timm's own draws), jitter exact, resize within the bound


def test_to_numpy_and_maybe_pil_to_tensor(photo_root):
    for last in (ToNumpy(), MaybePILToTensor()):
        ds = image_folder(photo_root, T.Compose([RandomResizedCropAndInterpolation(96, interpolation="bicubic"), last]))
        ref = load_all(ds, autoproxy=False, seed=2)
        out = load_all(ds, autoproxy=True, seed=2)
        assert last_report()["proxied"], last_report()
        assert out[0][0].dtype == torch.uint8
        compare(ref, out, normalized=False)


def test_random_interpolation_is_drawn_per_image_as_timm_draws_it(photo_root):
    """timm's train.py default, interpolation='random': bilinear or bicubic per image by
    ``random.choice`` after the box; the batch is resized with each image's own filter, exact."""
    tf = T.Compose([RandomResizedCropAndInterpolation(64, interpolation="random"), T.PILToTensor()])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=6, worker_init_fn=_seed_python_random)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=6, worker_init_fn=_seed_python_random)
    rep = last_report()
    assert rep["proxied"] and rep["decode_on_dali"] and not rep["partial"], rep
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb) and torch.equal(a, b)  # every pixel, the border included
    kinds = {row[-5] for row in _drawn_rows(tf, 40)}  # the filter, before the box
    assert kinds == {2, 3}  # both of Pillow's filters were drawn


def _seed_python_random(worker_id):
    import random
    random.seed(1000 + worker_id)


def _drawn_rows(tf, n):
    import random

    from dali_autoproxy.plan.planning import build_plan
    plan = build_plan(tf)
    random.seed(0)
    return [plan.draw(300, 400) for _ in range(n)]


ERASING_DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _erasing_runs(photo_root, device, mode, count, probability, resize="pillow"):
    """Plain and autoproxied batches of timm's train transform with RandomErasing (its
    non-prefetcher place: after Normalize, device='cpu')."""
    tf = timm_data.create_transform(96, is_training=True, re_prob=probability, re_mode=mode, re_count=count)
    assert type(tf.transforms[-1]).__name__ == "RandomErasing"
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=3)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=3, device=device, resize=resize, strict=True)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["dali_transforms"][-1] == "RandomErasing", rep
    return ref, [(x.cpu(), y) for x, y in out]


@pytest.mark.parametrize("device", ERASING_DEVICES)
@pytest.mark.parametrize("mode,count,probability", [("const", 1, 0.25), ("const", 3, 0.9), ("rand", 1, 0.25),
                                                    ("rand", 3, 0.9)])
def test_timm_random_erasing_runs_on_dali_with_timms_boxes_and_values(photo_root, device, mode, count, probability):
    """Boxes drawn as timm draws them (Python's random, up to ``count`` per image, each its own
    area share); ``const`` zeros, ``rand`` each box's own values from timm's ``normal_()``."""
    ref, out = _erasing_runs(photo_root, device, mode, count, probability)
    if device == "cpu":
        for (a, la), (b, lb) in zip(ref, out):
            assert torch.equal(la, lb) and torch.allclose(a, b, rtol=0, atol=1e-5)  # every value
    else:
        compare(ref, out, mae_max=1.5, psnr_min=36.0)
        erased = [float((a == b).float().mean()) for (a, _), (b, _) in zip(ref, out)]
        assert min(erased) > 0  # the fills where plain's are (the decode differs elsewhere)


@pytest.mark.parametrize("device", ERASING_DEVICES)
def test_timm_random_erasing_pixel_noise_fills_timms_boxes_with_standard_normal_noise(photo_root, device):
    """``pixel`` mode: the box is plain's, its noise is drawn where the op runs (not timm's
    values, its distribution), and a seeded run repeats itself."""
    ref, out = _erasing_runs(photo_root, device, "pixel", 1, 1.0)
    _, again = _erasing_runs(photo_root, device, "pixel", 1, 1.0)
    noise, boxes = [], 0
    for (a, _), (b, _), (c, _) in zip(ref, out, again):
        assert torch.equal(b, c)
        for plain, ours in zip(a, b):
            differs = (plain - ours).abs() > (1e-5 if device == "cpu" else 0.5)
            if not differs.any():
                continue
            rows, cols = differs.any(0).any(1).nonzero(), differs.any(0).any(0).nonzero()
            top, left, bottom, right = int(rows.min()), int(cols.min()), int(rows.max()) + 1, int(cols.max()) + 1
            box = ours[:, top:bottom, left:right]
            if device == "cpu":  # one box, its values new (two noises may meet within 1e-5), nothing outside
                assert int(differs.sum()) >= box.numel() - 2
            noise.append(box.reshape(-1))
            boxes += 1
    assert boxes >= len(out) * len(out[0][0]) // 2
    values = torch.cat(noise).double()
    assert values.numel() > 20_000
    assert abs(float(values.mean())) < 0.03 and abs(float(values.std()) - 1) < 0.03
    within = float((values.abs() < 1).double().mean())
    assert abs(within - 0.6827) < 0.01  # the share of a standard normal within one sigma


@pytest.mark.parametrize("device", ERASING_DEVICES)
def test_timm_rand_augment_runs_on_dali_solarize_add_included(photo_root, device):
    """timm's RandAugment (its PIL ops recorded), and its solarize_add look-up table alone:
    every pixel plain's on the CPU backend, the report's chain listed once."""
    from timm.data.auto_augment import AugmentOp
    solarize_add = T.Compose([T.RandomResizedCrop(64), AugmentOp("SolarizeAdd", prob=1.0, magnitude=9),
                              T.PILToTensor()])
    rand_augment = timm_data.create_transform(96, is_training=True, auto_augment="rand-m9-n3-inc1",
                                              color_jitter=None)
    for tf in (solarize_add, rand_augment):
        ds = image_folder(photo_root, tf)
        ref = load_all(ds, autoproxy=False, shuffle=True, seed=8)
        out = load_all(ds, autoproxy=True, shuffle=True, seed=8, device=device, resize="pillow", strict=True)
        rep = last_report()
        assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
        assert rep["dali_transforms"].count("RandomHorizontalFlip") <= 1, rep  # one chain, however many shapes
        if device == "cpu":
            for (a, la), (b, lb) in zip(ref, out):
                assert torch.equal(la, lb) and torch.allclose(a.float(), b.float(), rtol=0, atol=1e-5)
        else:
            compare(ref, [(x.cpu(), y) for x, y in out], normalized=tf is rand_augment, mae_max=1.5, psnr_min=36.0)


@pytest.mark.parametrize("device", ERASING_DEVICES)
@pytest.mark.parametrize("config", ["augmix-m5-w4-d2", "augmix-m3-w3", "augmix-m9-w2-d1-a0.5"])
def test_timm_augmix_runs_on_dali_equal_to_plain(photo_root, device, config):
    """timm's AugMixAugment as create_transform makes it, with augmix="stage" (its ops recorded,
    mixed in float32, blended as Pillow blends), the depth drawn per copy or fixed: decoded on
    DALI, every pixel plain's on the CPU backend. Where the installed timm's AugMix is not the
    code the translation copies, its fallback is checked instead (timm's AugMix runs as written,
    the reason reported) and the DALI claim is skipped."""
    from dali_autoproxy.plan.translate.timm_augmix import _code_known
    tf = timm_data.create_transform(96, is_training=True, auto_augment=config, color_jitter=None)
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=4)
    if not _code_known("timm.data.auto_augment"):
        out = load_all(ds, autoproxy=True, shuffle=True, seed=4, device=device, resize="pillow", augmix="stage")
        rep = last_report()
        assert "AugMixAugment" in str(rep["worker_transforms"]) and "not the one translated" in str(rep), rep
        for (a, la), (b, lb) in zip(ref, out):  # Normalize on DALI: float32 rounding
            assert torch.equal(la, lb) and torch.allclose(a, b.cpu(), rtol=0, atol=1e-5)
        pytest.skip(f"timm {__import__('timm').__version__}'s AugMix is not the code translated here: it ran as "
                    "written, plain's values within 1e-5 (checked)")
    out = load_all(ds, autoproxy=True, shuffle=True, seed=4, device=device, resize="pillow", strict=True,
                   augmix="stage")
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and "AugMixAugment" in rep["dali_transforms"], rep
    if device == "cpu":
        for (a, la), (b, lb) in zip(ref, out):
            assert torch.equal(la, lb) and torch.allclose(a, b, rtol=0, atol=1e-5)  # every value
    else:
        compare(ref, [(x.cpu(), y) for x, y in out], mae_max=1.5, psnr_min=36.0)


def test_timm_augmix_that_cannot_be_translated_says_why(monkeypatch):
    from timm.data.auto_augment import augment_and_mix_transform

    from dali_autoproxy.plan.settings import SETTINGS
    plain = augment_and_mix_transform("augmix-m3-w3", {"interpolation": 2})
    assert 'augmix="worker", the default' in why_not(T.Compose([plain, T.ToTensor()]))
    monkeypatch.setitem(SETTINGS, "augmix", "stage")
    blended = augment_and_mix_transform("augmix-m3-w3-b1", {"interpolation": 2})
    assert "blended mode" in why_not(T.Compose([blended, T.ToTensor()]))
    random_filter = augment_and_mix_transform("augmix-m3-w3", {})  # no interpolation hparam: drawn per op
    assert "random interpolation" in why_not(T.Compose([random_filter, T.ToTensor()]))


def test_a_solarize_add_table_is_recorded_as_one_call():
    from timm.data.auto_augment import solarize_add

    from dali_autoproxy.plan.record.image import RecordingImage, recording
    recording.active += 1
    try:
        for add, threshold in ((1, 128), (44, 128), (110, 100), (300, 7)):
            img = solarize_add(RecordingImage((8, 6), "RGB"), add, thresh=threshold)
            assert img.calls == (("solarize_add", float(min(add, 255)), float(threshold), 0.0),)
        assert solarize_add(RecordingImage((8, 6), "RGB"), 0).calls == ()  # the identity table
    finally:
        recording.active -= 1


def test_resize_keep_ratio_says_why():
    from timm.data.transforms import ResizeKeepRatio
    assert "ResizeKeepRatio is not translated" in why_not(T.Compose([ResizeKeepRatio(64), T.ToTensor()]))


def test_timm_is_not_imported_by_us():
    code = ("import sys, torchvision.transforms as T\n"
            "from dali_autoproxy.plan.planning import build_plan\n"
            "build_plan(T.Compose([T.RandomResizedCrop(8), T.ToTensor()]))\n"
            "print('timm' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def _timm_batches(root, autoproxy, seed, prefetcher=False, log_level="WARNING"):
    """timm's own dataset and loader as its training script builds them; ``prefetcher``: the
    script's default, fast_collate (uint8) and PrefetchLoader (normalising on the device)."""
    import dali_autoproxy
    if autoproxy:
        dali_autoproxy.enable(device="cpu", log_level=log_level)
    try:
        torch.manual_seed(seed)
        ds = timm_data.create_dataset("", root=root, split="")
        extra = dict(device=torch.device("cpu")) if prefetcher else dict(color_jitter=0.4)
        loader = timm_data.create_loader(ds, input_size=(3, 96, 96), batch_size=8, is_training=True,
                                         use_prefetcher=prefetcher, num_workers=2, interpolation="bilinear",
                                         worker_seeding="all", **extra)
        return [(x.clone(), y.clone()) for x, y in loader]
    finally:
        dali_autoproxy.disable()


def test_timm_create_dataset_and_loader_decode_on_dali(photo_root):
    """timm's ImageDataset opens each file with Image.open(f).convert("RGB") and calls its
    transform: decoding moves to DALI, and timm's Python-random draws are kept per worker."""
    ref = _timm_batches(photo_root, False, 3)
    out = _timm_batches(photo_root, True, 3)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == sum(len(b[1]) for b in out), rep
    assert sorted(torch.cat([b[1] for b in ref]).tolist()) == sorted(torch.cat([b[1] for b in out]).tolist())
    compare(ref, out)


def test_timm_fast_collate_and_prefetch_loader(photo_root, tmp_path):
    """Proxied, fast_collate replaced by its equivalent on DALI's tensors, and the log says so
    (not that the collate fell back for needing the images' values)."""
    import logging
    ref = _timm_batches(photo_root, False, 4, prefetcher=True)
    log = logging.getLogger("dali_autoproxy")
    to_file = logging.FileHandler(tmp_path / "log.txt")  # the forked workers inherit it
    log.addHandler(to_file)
    try:
        out = _timm_batches(photo_root, True, 4, prefetcher=True, log_level="INFO")
    finally:
        log.removeHandler(to_file)
        to_file.close()
    said = (tmp_path / "log.txt").read_text()
    assert "fast_collate copies the images into a batch" in said and "needs the images' values" not in said, said
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == sum(len(b[1]) for b in out), rep
    assert ref[0][0].dtype == torch.float32  # normalised by the prefetcher
    compare(ref, out)


_RUNNER = """
import atexit, json, runpy, sys
import dali_autoproxy
atexit.register(lambda: print("REPORT " + json.dumps(dali_autoproxy.report(), default=str)))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.skipif(not __import__("os").environ.get("TIMM_TRAIN_PY"),
                    reason="set TIMM_TRAIN_PY to the path of timm's train.py (pytorch-image-models)")
@pytest.mark.parametrize("extra", [[], ["--no-prefetcher"], ["--mixup", "0.2"]], ids=["defaults", "no-prefetcher",
                                                                                      "mixup"])
def test_timm_train_script_unchanged_decodes_on_dali(tmp_path, extra):
    """timm's own train.py, unchanged, with its defaults (interpolation='random', the prefetcher,
    ColorJitter 0.4): DALI_AUTOPROXY=1, and every image of the train loader decoded by DALI."""
    import os
    import shutil

    from photos import make_photo_folder
    for split in ("train", "validation"):
        make_photo_folder(str(tmp_path / split))
    train_py = os.environ["TIMM_TRAIN_PY"]
    cmd = [sys.executable, "-c", _RUNNER, train_py, "--data-dir", str(tmp_path), "--model", "resnet18",
           "--epochs", "1", "-b", "8", "-j", "2", "--device", "cpu", "--input-size", "3", "64", "64",
           "--output", str(tmp_path / "out"), *extra]
    env = dict(os.environ, DALI_AUTOPROXY="1", DALI_AUTOPROXY_DEVICE="cpu")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=os.path.dirname(train_py))
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("REPORT ")][-1][7:])
    train = rows[0]
    assert train["proxied"] and not train["partial"] and train["decoded_in_worker"] == {}, train
    assert train["decoded_on_dali"] == train["samples"] > 0, train
    assert "RandomResizedCropAndInterpolation" in train["dali_transforms"], train
