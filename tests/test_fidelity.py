"""Autoproxy's batches against plain torchvision's, through real DataLoader workers and
real DALI pipelines (CPU backend here; tests/test_gpu.py repeats them on the GPU).

With the default resize (Pillow's arithmetic, torchvision's own kernel for tensors) every value
equals plain's in the uint8 domain (Normalize and ToTensor undone), the border included: DALI's
CPU decoder and Pillow both use libjpeg-turbo. GaussianBlur is within a level (``LEVELS``). The
opt-in resize="dali" is held to its bound: mean absolute error <= 0.5 levels and PSNR >= 40 dB
per batch. Crops, flips and labels never differ: the same seed gives the same crop boxes and flips
as torchvision, and a crop off by a single pixel already costs several levels.
"""
import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, last_report, load_all
from photos import CLASS_TINTS, MEAN, STD, make_odd_jpeg_folder, psnr, to_uint8_domain
from scipy import stats
from torch.utils.data import Subset

MAE_MAX, PSNR_MIN = 0.5, 40.0
LEVELS = {"heavy_v1": 1, "heavy_v2": 1}  # GaussianBlur's bound (docs/transforms.md); every other chain 0

EVAL = {
    "v1_pil": lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "v2_pil": lambda: v2.Compose([v2.Resize(256), v2.CenterCrop(224), v2.ToImage(),
                                  v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]),
    "v1_tensor": lambda: T.Compose([T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Resize(256, antialias=True),
                                    T.CenterCrop(224), T.Normalize(MEAN, STD)]),
    "v2_tensor": lambda: v2.Compose([v2.ToImage(), v2.Resize(256), v2.CenterCrop(224),
                                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
                                     v2.ToPureTensor()]),
}
I = T.InterpolationMode
VARIANTS = {  # interpolations, upscaling, max_size, tensors without antialias
    "rrc_bicubic_pil": lambda: T.Compose([T.RandomResizedCrop(224, interpolation=I.BICUBIC), T.ToTensor()]),
    "rrc_nearest_pil": lambda: T.Compose([T.RandomResizedCrop(224, interpolation=I.NEAREST), T.ToTensor()]),
    "nearest_exact_tensor": lambda: T.Compose([T.PILToTensor(), T.Resize(200, interpolation=I.NEAREST_EXACT),
                                               T.CenterCrop(180)]),
    "no_antialias_tensor": lambda: v2.Compose([v2.PILToTensor(), v2.Resize(200, antialias=False), v2.CenterCrop(180)]),
    "upscale": lambda: T.Compose([T.Resize(600), T.CenterCrop(500), T.ToTensor()]),
    "max_size": lambda: v2.Compose([v2.Resize(200, max_size=260), v2.CenterCrop(180), v2.ToImage(),
                                    v2.ToDtype(torch.float32, scale=True)]),
}
TRAIN = {
    "v1": lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "v2": lambda: v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.ToImage(),
                              v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]),
    # the classification references' tensor backend (presets.py, backend="tensor"): the resize of a uint8 tensor
    "v1_tensor": lambda: T.Compose([T.PILToTensor(), T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(),
                                    T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]),
    "v2_tensor": lambda: v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224, antialias=True),
                                     v2.RandomHorizontalFlip(), v2.ToDtype(torch.float, scale=True),
                                     v2.Normalize(MEAN, STD)]),
    # the recommended v2 style: tensors first, colour on tensors (torchvision's tensor kernels)
    "v2_tensor_jitter": lambda: v2.Compose([v2.ToImage(), v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(),
                                            v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.ToDtype(torch.float32, scale=True),
                                            v2.Normalize(MEAN, STD)]),
    # the representative heavy chain
    "heavy_v1": lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                   T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.2),
                                   T.GaussianBlur(9, (0.1, 2.0)), T.ToTensor(), T.Normalize(MEAN, STD),
                                   T.RandomErasing()]),
    "heavy_v2": lambda: v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(),
                                    v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                                    v2.RandomGrayscale(0.2), v2.GaussianBlur(9, (0.1, 2.0)), v2.ToImage(),
                                    v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
                                    v2.RandomErasing()]),
}


def compare(ref, out, normalized=True, mae_max=MAE_MAX, psnr_min=PSNR_MIN, levels=None):
    """Labels equal, images within the bound; ``levels``: no value further than that from plain's."""
    assert len(ref) == len(out)
    worst_mae, worst_psnr, worst = 0.0, float("inf"), 0.0
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb), "labels differ"
        assert a.shape == b.shape and a.dtype == b.dtype
        a8 = to_uint8_domain(a, normalized).numpy()
        b8 = to_uint8_domain(b.cpu(), normalized).numpy()
        worst_mae = max(worst_mae, float(np.abs(a8 - b8).mean()))
        worst_psnr = min(worst_psnr, psnr(a8, b8))
        worst = max(worst, float(np.abs(a8 - b8).max()))
    assert worst_mae <= mae_max and worst_psnr >= psnr_min, (worst_mae, worst_psnr)
    assert levels is None or worst <= levels + 1e-3, worst
    return worst_mae, worst_psnr


@pytest.mark.parametrize("name", sorted(EVAL))
def test_eval_pipeline_matches_torchvision(photo_root, name):
    ds = image_folder(photo_root, EVAL[name]())
    ref = load_all(ds, autoproxy=False)
    out = load_all(ds, autoproxy=True, strict=True)
    rep = last_report()
    assert rep["proxied"] and rep["decode_on_dali"], rep
    compare(ref, out, levels=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_interpolations_and_sizes_match_torchvision(photo_root, name):
    ds = image_folder(photo_root, VARIANTS[name]())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=4)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=4, strict=True)
    assert last_report()["proxied"]
    compare(ref, out, normalized=False, levels=0)


@pytest.mark.parametrize("name", sorted(TRAIN))
def test_train_pipeline_same_seed_same_crops(photo_root, name):
    ds = image_folder(photo_root, TRAIN[name]())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=3)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=3, strict=True)
    assert last_report()["proxied"]
    compare(ref, out, levels=LEVELS.get(name, 0))


@pytest.mark.parametrize("name", ["v1", "v2_tensor", "heavy_v2"])
def test_the_dali_resize_within_its_bound(photo_root, name):
    """The opt-in resize="dali" (DALI's resize): the same crops and flips, within the bound."""
    ds = image_folder(photo_root, TRAIN[name]())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=3)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=3, strict=True, resize="dali")
    assert last_report()["proxied"]
    compare(ref, out)


def test_every_image_keeps_its_label_under_shuffle(photo_root):
    """The class is written in the pixels (a tint per class): read it back after DALI."""
    ds = image_folder(photo_root, TRAIN["v1"]())
    batches = load_all(ds, autoproxy=True, shuffle=True, num_workers=3, batch_size=5, seed=11, strict=True)
    n = 0
    for x, y in batches:
        x8 = to_uint8_domain(x, True)
        tint = torch.tensor(CLASS_TINTS)
        channel_means = x8.mean(dim=(2, 3))
        predicted = (channel_means / channel_means.sum(1, keepdim=True)) @ tint.T
        assert torch.equal(predicted.argmax(1), y), (predicted, y)
        n += len(y)
    assert n == len(ds)


def _boxes(batches, sizes):
    """Recover (area fraction, log aspect, flipped) of each crop from gradient pixels."""
    rows = []
    i = 0
    for x, _ in batches:
        x8 = to_uint8_domain(x, False)
        for img in x8:
            h, w = sizes[i % len(sizes)]
            i += 1
            left, right = img[0, :, 0].mean().item(), img[0, :, -1].mean().item()
            top, bottom = img[1, 0, :].mean().item(), img[1, -1, :].mean().item()
            cw = abs(right - left) / 255 * (w - 1) + 1
            ch = abs(bottom - top) / 255 * (h - 1) + 1
            rows.append((cw * ch / (w * h), np.log(cw / ch), right < left))
    return np.array(rows)


def test_crop_and_flip_distributions_match_torchvision(gradient_root):
    """Two independent runs (different seeds): torchvision and autoproxy. Two-sample
    Kolmogorov-Smirnov tests on crop area and log aspect ratio (p > 0.001), and the flip
    rates within 4 standard errors of each other and of p=0.5."""
    from PIL import Image
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    base = image_folder(gradient_root, tf)
    sizes = [Image.open(p).size[::-1] for p, _ in base.samples]
    n_rep = 60
    ds = Subset(base, list(range(len(base))) * n_rep)
    ref = _boxes(load_all(ds, autoproxy=False, batch_size=40, seed=1), sizes)
    out = _boxes(load_all(ds, autoproxy=True, batch_size=40, seed=2), sizes)
    assert last_report()["proxied"]
    assert stats.ks_2samp(ref[:, 0], out[:, 0]).pvalue > 1e-3
    assert stats.ks_2samp(ref[:, 1], out[:, 1]).pvalue > 1e-3
    n = len(out)
    se = np.sqrt(0.25 / n)
    assert abs(out[:, 2].mean() - 0.5) < 4 * se
    assert abs(out[:, 2].mean() - ref[:, 2].mean()) < 4 * np.sqrt(2) * se


def test_uint8_output_is_exact_type_and_layout(photo_root):
    tf = T.Compose([T.Resize((200, 300)), T.PILToTensor()])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False)
    out = load_all(ds, autoproxy=True)
    assert out[0][0].dtype == torch.uint8 and out[0][0].shape[1:] == (3, 200, 300)
    compare(ref, out, normalized=False)


def test_center_crop_larger_than_image_pads_with_zeros(photo_root):
    tf = T.Compose([T.Resize(200), T.CenterCrop(300), T.ToTensor()])
    ds = image_folder(photo_root, tf)
    ref = load_all(ds, autoproxy=False, batch_size=1)
    out = load_all(ds, autoproxy=True, batch_size=1)
    for (a, _), (b, _) in zip(ref, out):
        assert torch.equal(a == 0, b == 0) or (((a == 0) != (b == 0)).float().mean() < 0.01)
    compare(ref, out, normalized=False)


def test_grayscale_rgba_palette_cmyk_match_pil(mixed_root):
    root, special = mixed_root
    ds = image_folder(root, EVAL["v1_pil"]())
    ref = load_all(ds, autoproxy=False, batch_size=4)
    out = load_all(ds, autoproxy=True, batch_size=4)
    compare(ref, out)
    rep = last_report()
    # the two PNGs and the CMYK JPEG are decoded by PIL in the worker (their pixels go to DALI);
    # the grayscale JPEG decodes in DALI
    assert rep["cpu_path_samples"] == 0, rep
    assert rep["decoded_in_worker"] == {"not an ordinary complete JPEG (DALI decodes those as Pillow does)": 3}, rep
    assert rep["decoded_on_dali"] == len(ds) - 3


class OwnPILDataset(torch.utils.data.Dataset):
    """Not an ImageFolder: opens images itself, then calls self.transform."""

    def __init__(self, root, transform):
        import torchvision
        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image
        path, label = self.samples[i]
        with Image.open(path) as img:
            return {"image": self.transform(img.convert("RGB")), "label": label, "path": path}


def test_dataset_that_opens_images_itself_decodes_on_dali(photo_root):
    ds = OwnPILDataset(photo_root, TRAIN["v2"]())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=9)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=9)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == len(ds) and not rep["decoded_in_worker"], rep
    assert [b["path"] for b in ref] == [b["path"] for b in out]  # dict nesting kept
    compare([(b["image"], b["label"]) for b in ref], [(b["image"], b["label"]) for b in out])


ODD_PSNR_MIN = 55.0  # every single image of the odd set, eval chain: decoding as Pillow does
ODD_CHAINS = {"eval": lambda: EVAL["v1_pil"](),
              "train": lambda: T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip(), T.ToTensor(),
                                          T.Normalize(MEAN, STD)])}


def check_odd_jpegs(tmp_path, pipeline: str, device: str) -> dict:
    """Per image of the odd JPEG set (progressive, 4:2:2, ICC, restart markers, trailing bytes,
    17x9, ...): decoded by DALI, and within the bound against plain torchvision."""
    names = make_odd_jpeg_folder(str(tmp_path))
    ds = image_folder(str(tmp_path), ODD_CHAINS[pipeline]())
    ref = load_all(ds, autoproxy=False, batch_size=1, seed=6)
    out = load_all(ds, autoproxy=True, batch_size=1, device=device, seed=6)
    rep = last_report()
    assert rep["decoded_on_dali"] == len(names), rep
    scores = {}
    for name, (a, _), (b, _) in zip(names, ref, out):
        a8, b8 = to_uint8_domain(a, True).numpy(), to_uint8_domain(b.cpu(), True).numpy()
        scores[name] = (psnr(a8, b8), float(np.abs(a8 - b8).max()))
    low = {k: v for k, v in scores.items() if v[0] < (ODD_PSNR_MIN if pipeline == "eval" else PSNR_MIN)}
    assert not low, low
    return scores


@pytest.mark.parametrize("pipeline", ["eval", "train"])
def test_odd_jpegs_decode_like_pillow(tmp_path, pipeline):
    check_odd_jpegs(tmp_path, pipeline, "cpu")


def test_the_classification_references_presets_equal_plain(photo_root):
    """torchvision's own ``references/classification/presets.py`` (set TORCHVISION_REFERENCES to
    a checkout's ``references`` folder) as ``train.py`` builds them: the train preset with no
    policy, RandAugment, TrivialAugmentWide and AutoAugment, random erasing, and the eval preset;
    v1 and v2, the PIL and the tensor backend. With the default resize every value equals plain's
    (the border included), every image decoded on DALI; AugMix stays in the worker by default
    and is left out here (tests/test_coverage.py)."""
    import os
    import sys
    where = os.environ.get("TORCHVISION_REFERENCES")
    if not where:
        pytest.skip("set TORCHVISION_REFERENCES to the references folder of a pytorch/vision checkout")
    sys.path.insert(0, os.path.join(where, "classification"))
    try:
        import presets
        for use_v2 in (False, True):
            for backend in ("pil", "tensor"):
                made = [presets.ClassificationPresetEval(crop_size=96, resize_size=112, backend=backend, use_v2=use_v2)]
                made += [presets.ClassificationPresetTrain(crop_size=96, auto_augment_policy=policy, backend=backend,
                                                           random_erase_prob=0.25 if policy == "ra" else 0.0,
                                                           use_v2=use_v2)
                         for policy in (None, "ra", "ta_wide", "imagenet")]
                for preset in made:
                    ds = image_folder(photo_root, preset)
                    ref = load_all(ds, autoproxy=False, shuffle=True, seed=5)
                    out = load_all(ds, autoproxy=True, shuffle=True, seed=5, strict=True)
                    rep = last_report()
                    assert rep["proxied"] and rep["decode"] == "DALI 100%", (use_v2, backend, rep)
                    for (a, la), (b, lb) in zip(ref, out):
                        assert torch.equal(la, lb)
                        worst = float((to_uint8_domain(a, True) - to_uint8_domain(b.cpu(), True)).abs().max())
                        assert worst < 1e-3, (use_v2, backend, preset.transforms, worst)
    finally:
        sys.path.remove(os.path.join(where, "classification"))
        sys.modules.pop("presets", None)
