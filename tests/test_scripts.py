"""Scripts and dataset patterns written for plain PyTorch, run unchanged with autoproxy."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import image_folder, last_report, load_all
from test_fidelity import compare

import dali_autoproxy

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def train_val_root(tmp_path_factory, photo_root):
    root = tmp_path_factory.mktemp("imagenet")
    shutil.copytree(photo_root, root / "train")
    shutil.copytree(photo_root, root / "val")
    return str(root)


def _run(cmd, **env):
    e = dict(os.environ)
    e.pop("DALI_AUTOPROXY", None)
    e.update(env)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=e)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])


def test_imagenet_like_script_unchanged(train_val_root):
    """Same seed, same training: plain and autoproxied losses agree within 5% (the pixels
    differ only by resampling rounding; misaligned labels would put the loss near ln 3 = 1.1
    against about 0.2 here), and both loaders were proxied."""
    cmd = [sys.executable, os.path.join(HERE, "scripts", "imagenet_like.py"), train_val_root, "--epochs", "2"]
    plain = _run(cmd)
    auto = _run(cmd, DALI_AUTOPROXY="1", DALI_AUTOPROXY_DEVICE="cpu")
    assert auto["report"] == [[True, None], [True, None]]
    assert abs(plain["train_loss"] - auto["train_loss"]) < 0.05 * plain["train_loss"]
    assert abs(plain["val_loss"] - auto["val_loss"]) < 0.05 * plain["val_loss"]
    assert abs(plain["val_acc"] - auto["val_acc"]) <= 1 / 24 + 1e-9  # at most one of 24 flips


@pytest.mark.skipif(not os.environ.get("PYTORCH_EXAMPLES_IMAGENET_MAIN"),
                    reason="set PYTORCH_EXAMPLES_IMAGENET_MAIN to the path of pytorch/examples imagenet/main.py")
def test_pytorch_imagenet_example_unchanged(train_val_root):
    main_py = os.environ["PYTORCH_EXAMPLES_IMAGENET_MAIN"]
    cmd = [sys.executable, main_py, train_val_root, "-a", "resnet18", "--epochs", "1", "-b", "8", "-j", "2",
           "--print-freq", "1"]
    e = dict(os.environ, DALI_AUTOPROXY="1", DALI_AUTOPROXY_DEVICE=os.environ.get("DALI_AUTOPROXY_DEVICE", "cpu"),
             DALI_AUTOPROXY_LOG="INFO")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=e)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("proxied to DALI") == 2 and "running plain torchvision" not in res.stderr


class TwoViews(torch.utils.data.Dataset):
    """The two-view recipe of self-supervised learning: one transform object, called twice."""

    def __init__(self, root, transform):
        self.inner = torchvision.datasets.ImageFolder(root)
        self.transform = transform

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        img, label = self.inner[i]
        return self.transform(img), self.transform(img), label


def test_transform_called_twice_per_sample(photo_root):
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    ref = load_all(TwoViews(photo_root, tf), autoproxy=False, seed=1, shuffle=True)
    out = load_all(TwoViews(photo_root, tf), autoproxy=True, seed=1, shuffle=True)
    assert last_report()["proxied"]
    compare([(r[0], r[2]) for r in ref], [(o[0], o[2]) for o in out], normalized=False)
    compare([(r[1], r[2]) for r in ref], [(o[1], o[2]) for o in out], normalized=False)


def test_concat_of_differently_transformed_datasets(photo_root):
    def make():
        return torch.utils.data.ConcatDataset([
            image_folder(photo_root, T.Compose([T.Resize((64, 64)), T.ToTensor()])),
            image_folder(photo_root, T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()]))])
    ref = load_all(make(), autoproxy=False, seed=1, shuffle=True)
    out = load_all(make(), autoproxy=True, seed=1, shuffle=True)
    rep = last_report()
    assert rep["proxied"] and rep["dali_transforms"].count("ToTensor") == 2  # two plans, two pipelines
    compare(ref, out, normalized=False)


def test_transform_set_after_the_loader_was_created(photo_root):
    ds = torchvision.datasets.ImageFolder(photo_root)
    dali_autoproxy.enable(device="cpu", log_level="ERROR")
    rows = len(dali_autoproxy.report())
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    assert len(dali_autoproxy.report()) == rows  # no row before a loop iterates it
    ds.transform = T.Compose([T.Resize((64, 64)), T.ToTensor()])
    x, _ = next(iter(loader))
    assert x.shape == (4, 3, 64, 64) and last_report()["proxied"]


def test_wrap_dataset_for_transforms_v2(photo_root):
    from torchvision.datasets import wrap_dataset_for_transforms_v2

    def make():
        return wrap_dataset_for_transforms_v2(torchvision.datasets.ImageFolder(photo_root, transform=v2.Compose(
            [v2.ToImage(), v2.RandomResizedCrop((64, 64)), v2.ToDtype(torch.float32, scale=True)])))
    ref = load_all(make(), autoproxy=False, seed=3, shuffle=True)
    out = load_all(make(), autoproxy=True, seed=3, shuffle=True)
    assert last_report()["proxied"]
    compare(ref, out, normalized=False)


class ClassificationPresetTrain:
    """The shape of torchvision's classification reference presets: the chain in an
    attribute, a __call__ that only applies it."""

    def __init__(self, crop_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.transforms = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(crop_size, antialias=True),
                                      v2.RandomHorizontalFlip(0.5), v2.ToDtype(torch.float, scale=True),
                                      v2.Normalize(mean=mean, std=std), v2.ToPureTensor()])

    def __call__(self, img):
        return self.transforms(img)


class StackedViews:
    """Uses its chain's results inside __getitem__ (stacks them): that chain runs plain."""

    def __init__(self, base):
        self.base = base

    def __call__(self, img):
        return torch.stack([self.base(img), self.base(img)])


def test_preset_wrapper_of_the_classification_references_is_seen_through(photo_root):
    ds = image_folder(photo_root, ClassificationPresetTrain(96))
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=8)
    out = load_all(ds, autoproxy=True, shuffle=True, seed=8)
    rep = last_report()
    assert rep["proxied"] and rep["dali_transforms"][0] == "decode", rep
    compare(ref, out)


def test_a_wrapper_that_uses_the_results_gets_plain_torchvisions_samples(photo_root):
    """torch.stack on two proxied views fails in the worker: the sample is fetched again with
    the chain running plain, from the same torch RNG state, so the batches are identical."""
    ds = image_folder(photo_root, StackedViews(T.Compose([T.RandomResizedCrop(64), T.ToTensor()])))
    ref = load_all(ds, autoproxy=False, seed=8, shuffle=True)
    out = load_all(ds, autoproxy=True, seed=8, shuffle=True)
    assert len(ref) == len(out) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                        for a, b in zip(ref, out))
    assert ref[0][0].shape[1] == 2


class JointPairs(torchvision.datasets.VisionDataset):
    """Segmentation-style: image and mask through one joint ``transforms`` callable."""

    def __init__(self, root, transforms):
        super().__init__(root, transforms=transforms)
        self.samples = torchvision.datasets.ImageFolder(root).samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image
        img = Image.open(self.samples[i][0]).convert("RGB")
        mask = img.convert("L")
        return self.transforms(img, mask)


def test_segmentation_pairs_with_a_joint_transform_are_taken_over_identically(photo_root):
    """A chain called with (image, mask): the image goes to DALI with the calls torchvision made on
    it, the mask is transformed in the worker by torchvision with the same draws; both equal plain's."""
    joint = v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    ref = load_all(JointPairs(photo_root, joint), autoproxy=False, seed=3, shuffle=True)
    out = load_all(JointPairs(photo_root, joint), autoproxy=True, seed=3, shuffle=True)
    assert len(ref) == len(out) and all(torch.equal(u, v) for a, b in zip(ref, out) for u, v in zip(a, b))
    rep = last_report()
    assert rep["proxied"] and rep["samples"] == 24 and (
        "v2.Compose with its targets (v2.RandomResizedCrop -> v2.RandomHorizontalFlip -> v2.PILToTensor)"
        in rep["dali_transforms"]), rep


class Detection(torch.utils.data.Dataset):
    """Detection-style samples: the image and its boxes and labels through one v2 chain."""

    def __init__(self, root, transforms):
        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transforms = transforms

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image
        from torchvision import tv_tensors
        img = Image.open(self.samples[i][0]).convert("RGB")
        w, h = img.size
        boxes = tv_tensors.BoundingBoxes([[1, 2, w // 2, h // 2], [w // 4, h // 4, w - 1, h - 1]], format="XYXY",
                                         canvas_size=(h, w))
        return self.transforms(img, {"boxes": boxes, "labels": torch.tensor([1, 2]), "image_id": i})


def _detection_collate(batch):
    return tuple(zip(*batch))


@pytest.mark.parametrize("sanitize", [False, True])
def test_detection_targets_through_a_joint_chain_are_plains_and_the_image_goes_to_dali(photo_root, sanitize):
    """A v2 chain called with the image and its targets (a target-only step in it or not): the
    targets are torchvision's in the worker, the image is decoded and transformed on DALI, both
    equal to plain's."""
    chain = v2.Compose([v2.RandomHorizontalFlip(), v2.RandomZoomOut(p=0.5), v2.PILToTensor()]
                       + [v2.SanitizeBoundingBoxes()] * sanitize)
    runs = [load_all(Detection(photo_root, chain), autoproxy=p, seed=4, collate_fn=_detection_collate)
            for p in (False, True)]
    for (xa, ta), (xb, tb) in zip(*runs):
        assert all(torch.equal(u, v) for u, v in zip(xa, xb))
        assert all(torch.equal(u["boxes"], v["boxes"]) and torch.equal(u["labels"], v["labels"])
                   and u["image_id"] == v["image_id"] for u, v in zip(ta, tb))
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%", rep
    steps = ["v2.RandomHorizontalFlip", "v2.RandomZoomOut", "v2.PILToTensor"] + ["v2.SanitizeBoundingBoxes"] * sanitize
    assert rep["dali_transforms"][1:] == [f"v2.Compose with its targets ({' -> '.join(steps)})"], rep
