"""Datasets that are not ImageFolder: chains taken over where they are called, and JPEGs that
users open with PIL decoded by DALI. Real DataLoader workers, real DALI pipelines (CPU
backend); each case against plain torchvision with the same seed."""
import io
import pickle
import random

import pytest
import torch
import torchvision
import torchvision.transforms as T
from helpers import last_report, load_all
from photos import MEAN, STD
from PIL import Image, ImageFilter
from test_fidelity import compare
from test_reliability import BAD_FILES, outcomes, same_outcomes
from torch.utils.data import ConcatDataset, Dataset, Subset

import dali_autoproxy

TRAIN = lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),  # noqa: E731
                           T.Normalize(MEAN, STD)])
EVAL = lambda: T.Compose([T.Resize(112), T.CenterCrop(96), T.ToTensor(), T.Normalize(MEAN, STD)])  # noqa: E731
GLOBAL_CHAIN = T.Compose([T.RandomResizedCrop(80), T.ToTensor()])


def samples_of(root):
    return torchvision.datasets.ImageFolder(root).samples


class PathDataset(Dataset):
    """The common shape: a list of files, Image.open(path).convert("RGB"), the chain under a
    name of the user's choosing."""

    def __init__(self, root, tf, as_dict=False):
        self.items = samples_of(root)
        self.tf = tf
        self.as_dict = as_dict

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        img = self.tf(Image.open(path).convert("RGB"))
        return {"image": img, "label": label} if self.as_dict else (img, label)


class BytesDataset(Dataset):
    """Images held in memory as encoded bytes (a webdataset- or parquet-like source)."""

    def __init__(self, root, tf):
        self.items = [(open(p, "rb").read(), y) for p, y in samples_of(root)]
        self.transform = tf

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        data, label = self.items[i]
        return self.transform(Image.open(io.BytesIO(data)).convert("RGB")), label


class ClosedFileDataset(Dataset):
    """The file is closed before the chain runs; ``convert`` inside the with-block or not."""

    def __init__(self, root, tf, convert=True):
        self.items = samples_of(root)
        self.transform = tf
        self.convert = convert

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with open(path, "rb") as f:
            img = Image.open(f)
            if self.convert:
                img = img.convert("RGB")
        return self.transform(img), label


class TouchingDataset(Dataset):
    """Uses the pixels before the chain: they must be decoded in the worker, as Pillow does."""

    def __init__(self, root, tf):
        self.items = samples_of(root)
        self.transform = tf

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        img = Image.open(path).convert("RGB")
        img = img.filter(ImageFilter.SMOOTH)  # the user's own step, on pixels (a crop or resize would stay encoded)
        return self.transform(img), label


class GlobalChainDataset(Dataset):
    """Calls a chain held in a module global, not in an attribute."""

    def __init__(self, root):
        self.items = samples_of(root)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        return GLOBAL_CHAIN(Image.open(path).convert("RGB")), label


def make_closure_dataset(root, tf):
    class ClosureDataset(Dataset):
        def __init__(self):
            self.items = samples_of(root)
            self.apply = lambda img: tf(img)  # the chain lives in a closure

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            path, label = self.items[i]
            return self.apply(Image.open(path).convert("RGB")), label
    return ClosureDataset()


class TwoViews:
    """The MoCo / SimCLR / BYOL shape: two independent draws of one chain."""

    def __init__(self, base):
        self.base = base

    def __call__(self, x):
        return [self.base(x), self.base(x)]


class MultiCrop:
    """DINO's shape: two global crops with different chains, several local crops."""

    def __init__(self):
        flip = T.RandomHorizontalFlip()
        norm = [T.ToTensor(), T.Normalize(MEAN, STD)]
        self.global1 = T.Compose([T.RandomResizedCrop(96, scale=(0.4, 1.0)), flip, *norm])
        self.global2 = T.Compose([T.RandomResizedCrop(96, scale=(0.4, 1.0)), flip,
                                  T.RandomGrayscale(0.2), *norm])
        self.local = T.Compose([T.RandomResizedCrop(48, scale=(0.05, 0.4)), flip, *norm])

    def __call__(self, img):
        return [self.global1(img), self.global2(img)] + [self.local(img) for _ in range(3)]


def report_row():
    rep = last_report()
    assert rep["proxied"], rep
    return rep


def assert_decoded_on_dali(rep, n):
    assert rep["decoded_on_dali"] == n and not rep["decoded_in_worker"], rep


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_own_dataset_with_chain_under_another_name(photo_root, as_dict):
    ds = PathDataset(photo_root, TRAIN(), as_dict=as_dict)
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=1)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=1)
    assert_decoded_on_dali(report_row(), len(ds))
    if as_dict:
        ref = [(b["image"], b["label"]) for b in ref]
        out = [(b["image"], b["label"]) for b in out]
    compare(ref, out)  # same crops and flips (a crop one pixel off fails this), labels aligned


def test_in_memory_bytes(photo_root):
    ds = BytesDataset(photo_root, EVAL())
    ref, out = load_all(ds, autoproxy=False), load_all(ds, autoproxy=True)
    assert_decoded_on_dali(report_row(), len(ds))
    compare(ref, out)


def test_file_closed_before_the_chain_runs(photo_root):
    ds = ClosedFileDataset(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=2)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=2)
    assert_decoded_on_dali(report_row(), len(ds))  # the bytes were taken while the file was open
    compare(ref, out)


def test_unconverted_image_of_a_closed_file_fails_as_plain(photo_root):
    """Image.open(f) without convert, f closed: Pillow cannot load it; neither do we."""
    ds = ClosedFileDataset(photo_root, EVAL(), convert=False)
    ref = outcomes(ds, autoproxy=False)
    out = outcomes(ds, autoproxy=True)
    assert {r[0] for r in ref} == {"err"}
    same_outcomes(ref, out, proxied=False)  # every sample fails before anything could reach DALI


def test_unconverted_open_image_decodes_on_dali(photo_root):
    class Unconverted(PathDataset):
        def __getitem__(self, i):
            path, label = self.items[i]
            return self.tf(Image.open(path)), label
    ds = Unconverted(photo_root, EVAL())
    ref, out = load_all(ds, autoproxy=False), load_all(ds, autoproxy=True)
    assert_decoded_on_dali(report_row(), len(ds))
    compare(ref, out)


def test_pixels_touched_before_the_chain_are_decoded_in_the_worker(photo_root):
    ds = TouchingDataset(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=3)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=3)
    rep = report_row()
    why = "the image reached the transform decoded (the dataset used or made its pixels first)"
    assert rep["decoded_on_dali"] == 0 and rep["decoded_in_worker"] == {why: len(ds)}, rep
    assert f"worker 100% ({why})" in rep["decode"]
    compare(ref, out)


@pytest.mark.parametrize("make", ["global", "closure"])
def test_chain_in_a_module_global_or_a_closure(photo_root, make):
    ds = GlobalChainDataset(photo_root) if make == "global" else make_closure_dataset(photo_root, TRAIN())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=4)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=4)
    assert_decoded_on_dali(report_row(), len(ds))
    compare(ref, out, normalized=make == "closure")


def test_two_view_wrapper_each_view_drawn_as_torchvision(photo_root):
    ds = torchvision.datasets.ImageFolder(photo_root, transform=TwoViews(TRAIN()))
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=5)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=5)
    assert_decoded_on_dali(report_row(), 2 * len(ds))
    for view in range(2):
        compare([(a[0][view], a[1]) for a in ref], [(b[0][view], b[1]) for b in out])
    assert not torch.equal(out[0][0][0], out[0][0][1])  # two draws, not one copied


def test_several_distinct_chains_in_one_dataset(photo_root):
    ds = PathDataset(photo_root, MultiCrop())
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=6)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=6)
    rep = report_row()
    assert_decoded_on_dali(rep, 5 * len(ds))
    assert rep["dali_transforms"].count("RandomResizedCrop") == 3  # three pipelines
    for view in range(5):
        compare([(a[0][view], a[1]) for a in ref], [(b[0][view], b[1]) for b in out])


def test_subset_and_concat_of_own_datasets(photo_root):
    ds = ConcatDataset([Subset(PathDataset(photo_root, TRAIN()), range(0, 20, 2)),
                        BytesDataset(photo_root, EVAL())])
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=7)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=7)
    assert_decoded_on_dali(report_row(), len(ds))
    compare(ref, out)


class MoCoGaussianBlur:
    """The self-supervised recipes' own blur: Pillow's GaussianBlur, a random radius drawn
    with Python's random (as MoCo v2 writes it)."""

    def __init__(self, sigma=(0.1, 2.0)):
        self.sigma = sigma

    def __call__(self, x):
        return x.filter(ImageFilter.GaussianBlur(radius=random.uniform(self.sigma[0], self.sigma[1])))


def test_extension_point_moves_a_users_transform_with_the_chain(photo_root):
    chain = T.Compose([T.RandomResizedCrop(96), MoCoGaussianBlur(), T.ToTensor()])
    ds = PathDataset(photo_root, chain)
    load_all(ds, autoproxy=True)
    rep = report_row()  # unknown: recorded (its Pillow blur, on DALI's side)
    assert "MoCoGaussianBlur" in rep["dali_transforms"] and rep["worker_transforms"] == [], rep
    dali_autoproxy.register_equivalent(MoCoGaussianBlur, lambda t: T.GaussianBlur(23, sigma=tuple(t.sigma)))
    declared = T.Compose([T.RandomResizedCrop(96), T.GaussianBlur(23, sigma=(0.1, 2.0)), T.ToTensor()])
    ref = load_all(PathDataset(photo_root, declared), autoproxy=False, shuffle=True, seed=8)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=8)
    rep = report_row()
    assert rep["dali_transforms"] == ["decode", "RandomResizedCrop", "MoCoGaussianBlur", "ToTensor"], rep
    assert_decoded_on_dali(rep, len(ds))
    compare(ref, out, normalized=False)  # what the declared torchvision chain computes, draws included


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_files_in_an_own_dataset_have_torchvisions_outcome(photo_root, tmp_path, kind):
    bad = tmp_path / f"zz_{kind}.jpg"
    bad.write_bytes(BAD_FILES[kind]())
    ds = PathDataset(photo_root, TRAIN())
    ds.items = ds.items[:7] + [(str(bad), 1)] + ds.items[7:12]
    same_outcomes(outcomes(ds, autoproxy=False, seed=9), outcomes(ds, autoproxy=True, seed=9))


def test_exif_orientation_is_not_applied_in_an_own_dataset(photo_root, tmp_path):
    from photos import photographs
    img = Image.fromarray(photographs()[0][:200, :300])
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90
    path = tmp_path / "rotated.jpg"
    img.save(path, exif=exif, quality=92)
    ds = PathDataset(photo_root, EVAL())
    ds.items = [(str(path), 0)] * 4
    ref, out = load_all(ds, autoproxy=False, batch_size=4), load_all(ds, autoproxy=True, batch_size=4)
    assert_decoded_on_dali(report_row(), 4)
    compare(ref, out)


def test_a_deferred_jpeg_decodes_exactly_as_pillow_when_touched(photo_root):
    """Unit test of the stand-in: every way of reaching the pixels gives Pillow's."""
    import numpy as np

    from dali_autoproxy.worker.deferred import DeferredFileLoader, DeferredJpeg
    path = samples_of(photo_root)[0][0]
    plain = Image.open(path).convert("RGB")
    kept = (lambda im: im.crop((3, 5, 40, 60)).tobytes(), lambda im: im.resize((17, 9)).tobytes(),
            lambda im: im.crop((1.5, 2, 90, 80)).resize((33, 21), Image.BILINEAR).tobytes(),
            lambda im: im.resize((17, 9), box=(0, 0, 50, 40)).tobytes(),
            lambda im: im.resize((17, 9), reducing_gap=1.0).tobytes())
    for touch in (np.asarray, lambda im: im.filter(ImageFilter.SMOOTH).tobytes(), lambda im: im.getpixel((7, 7)),
                  lambda im: im.convert("L").tobytes(), lambda im: im.split()[1].tobytes(),
                  lambda im: im.rotate(30).tobytes(), lambda im: pickle.loads(pickle.dumps(im)).tobytes(),
                  lambda im: im.transpose(Image.Transpose.ROTATE_90).tobytes()) + kept:
        img = DeferredFileLoader()(path)
        assert type(img) is DeferredJpeg and img.deferred and img.size == plain.size and img.mode == "RGB"
        a, b = touch(img), touch(plain)
        assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b)
        assert img.deferred == (touch in kept)  # a crop or resize is kept: its result decodes, not the source
    img = DeferredFileLoader()(path)
    copied = img.copy()  # a copy is a stand-in of its own; decoding it leaves the original encoded
    assert copied.tobytes() == plain.tobytes() and img.deferred and not copied.deferred
    assert img.convert("RGB").deferred


def test_mixed_formats_in_an_own_dataset(mixed_root):
    """Grayscale JPEG decoded by DALI; RGBA and palette PNGs and a CMYK JPEG by Pillow in the
    worker (their RGB pixels then go through DALI), all as Pillow's convert("RGB") makes them."""
    root, _ = mixed_root
    ds = PathDataset(root, EVAL())
    ref, out = load_all(ds, autoproxy=False, batch_size=4), load_all(ds, autoproxy=True, batch_size=4)
    rep = report_row()
    assert rep["decoded_on_dali"] == len(ds) - 3, rep  # the grayscale JPEG among them
    assert rep["decoded_in_worker"] == {  # a PNG's convert("RGB") decodes it; the CMYK JPEG is not deferred
        "the image reached the transform decoded (the dataset used or made its pixels first)": 2,
        "not an ordinary complete JPEG (DALI decodes those as Pillow does)": 1}, rep
    compare(ref, out)


class ChecksTheChainsOutput(PathDataset):
    """Draws with Python's ``random`` itself and reads the chain's result (a check any dataset
    may make): a proxied result cannot be read, so the worker runs the fetch again, plain."""

    def __getitem__(self, i):
        path, label = self.items[i]
        keep = random.random() < 0.9  # the dataset's own draw, before the chain's
        img = self.tf(Image.open(path).convert("RGB"))
        if not torch.isfinite(img.float()).all():
            raise ValueError("not finite")
        return img, label * int(keep)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fetch_run_again_plain_draws_what_plain_draws(photo_root, workers):
    """The retry starts from the random states the failed attempt started from, Python's
    included (timm's crop draws with it): every batch is plain's, and no error of the attempt
    is chained to anything."""
    from timm.data.transforms import RandomResizedCropAndInterpolation
    tf = T.Compose([RandomResizedCropAndInterpolation(64), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = ChecksTheChainsOutput(photo_root, tf)
    runs = []
    for proxied in (False, True):
        random.seed(4)  # the main process's draws at num_workers=0
        runs.append(load_all(ds, autoproxy=proxied, shuffle=True, seed=4, num_workers=workers))
    for (a, la), (b, lb) in zip(*runs):
        assert torch.equal(la, lb) and torch.equal(a, b)
