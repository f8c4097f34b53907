"""Data at scale: webdataset tar shards (an IterableDataset) and Hugging Face ``datasets``, with
the real libraries, through real DataLoader workers and real DALI pipelines (CPU backend).
Sharding stays the library's; nothing lost, duplicated or reordered against plain."""
import os

import pytest
import torch
import torchvision
import torchvision.transforms as T
from helpers import last_report, load_all
from photos import MEAN, STD
from test_fidelity import compare

wds = pytest.importorskip("webdataset")
hf = pytest.importorskip("datasets")

TRAIN = lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),  # noqa: E731
                           T.Normalize(MEAN, STD)])


def identity(x):
    return x


@pytest.fixture(scope="module")
def shards(photo_root, tmp_path_factory):
    """The photo folder as 4 webdataset tar shards, one sample per image (jpg bytes + class)."""
    out = tmp_path_factory.mktemp("shards")
    samples = torchvision.datasets.ImageFolder(photo_root).samples
    per = (len(samples) + 3) // 4
    urls = []
    for s in range(4):
        url = str(out / f"shard-{s:02d}.tar")
        with wds.TarWriter(url) as sink:
            for k, (path, label) in enumerate(samples[s * per:(s + 1) * per]):
                sink.write({"__key__": f"{s:02d}{k:04d}", "jpg": open(path, "rb").read(), "cls": str(label).encode()})
        urls.append(url)
    return urls


def webdataset(urls, tf):
    return wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg", "cls").map_tuple(tf, identity)


def test_webdataset_shards_are_proxied_and_decoded_on_dali(shards):
    ref = load_all(webdataset(shards, TRAIN()), autoproxy=False, seed=3)
    out = load_all(webdataset(shards, TRAIN()), autoproxy=True, seed=3)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == sum(len(b[1]) for b in out), rep
    assert [b[1].tolist() for b in ref] == [b[1].tolist() for b in out]  # same samples, same order
    compare(ref, out)  # same crops and flips


def test_webdataset_with_an_untranslatable_chain_is_identical(shards):
    tf = T.Compose([T.CenterCrop(64), T.ToTensor(), T.Lambda(lambda x: x.flip(-1))])
    ref = load_all(webdataset(shards, tf), autoproxy=False)
    out = load_all(webdataset(shards, tf), autoproxy=True)
    assert not last_report()["proxied"]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, out))


def _hf_dataset(photo_root, as_bytes):
    samples = torchvision.datasets.ImageFolder(photo_root).samples
    images = ([{"bytes": open(p, "rb").read(), "path": None} for p, _ in samples] if as_bytes
              else [p for p, _ in samples])
    ds = hf.Dataset.from_dict({"image": images, "label": [y for _, y in samples]})
    return ds.cast_column("image", hf.Image())


HF_CHAIN = TRAIN()


def hf_transform(batch):
    """The usual with_transform: each image converted to RGB and through the chain."""
    return {"pixel_values": [HF_CHAIN(img.convert("RGB")) for img in batch["image"]], "label": batch["label"]}


@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes", "paths"])
def test_hugging_face_dataset_with_transform(photo_root, as_bytes):
    ds = _hf_dataset(photo_root, as_bytes).with_transform(hf_transform)
    ref = load_all(ds, autoproxy=False, seed=4, shuffle=True)
    out = load_all(ds, autoproxy=True, seed=4, shuffle=True)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == len(ds), rep
    compare([(b["pixel_values"], b["label"]) for b in ref], [(b["pixel_values"], b["label"]) for b in out])


def test_hugging_face_streaming_dataset(photo_root):
    """An iterable (streaming-style) Hugging Face dataset, sharded over the workers by the library."""
    def make():
        return _hf_dataset(photo_root, True).to_iterable_dataset(num_shards=4).map(
            hf_transform, batched=True, batch_size=4, remove_columns=["image"])
    ref = load_all(make(), autoproxy=False, seed=5)
    out = load_all(make(), autoproxy=True, seed=5)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == sum(len(b["label"]) for b in out), rep
    assert [b["label"].tolist() for b in ref] == [b["label"].tolist() for b in out]
    compare([(b["pixel_values"], b["label"]) for b in ref], [(b["pixel_values"], b["label"]) for b in out])


def test_two_nodes_over_webdataset_shards(shards, tmp_path):
    """Multi-node as users run it: two torchrun "nodes" on this host (c10d rendezvous on
    localhost, gloo), shards split by node and by worker by webdataset, DALI_AUTOPROXY=1 through
    the start-up hook: every rank proxied, and each rank gets plain torchvision's samples."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "wds_nodes.py")
    runs = {}
    for arm, port in (("plain", 29541), ("autoproxy", 29542)):
        out = tmp_path / arm
        out.mkdir()
        env = dict(os.environ, DALI_AUTOPROXY="1" if arm == "autoproxy" else "0", DALI_AUTOPROXY_DEVICE="cpu",
                   DALI_AUTOPROXY_LOG="WARNING", CUDA_VISIBLE_DEVICES="")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}", f"--rdzv_id=wds{port}", script,
               str(out), *shards]
        nodes = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        for node in nodes:
            _, err = node.communicate(timeout=300)
            assert node.returncode == 0, err[-4000:]
        runs[arm] = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    keys = {arm: [k for r in runs[arm] for b in r["batches"] for k in b[2]] for arm in runs}
    assert sorted(keys["plain"]) == sorted(keys["autoproxy"]) and len(set(keys["plain"])) == len(keys["plain"])
    for rank in range(2):
        plain, auto = runs["plain"][rank], runs["autoproxy"][rank]
        assert auto["report"] and all(p for p, _ in auto["report"]) and sum(n for _, n in auto["report"]) > 0
        assert [b[2] for b in plain["batches"]] == [b[2] for b in auto["batches"]]  # same keys, same order
        compare([(x, y) for x, y, _ in plain["batches"]], [(x, y) for x, y, _ in auto["batches"]])


def test_hugging_face_grayscale_jpegs_decode_on_dali(mixed_root):
    """A grayscale JPEG through the Image feature (mode L, as the library returns it) and the
    usual ``convert("RGB")``: decoded on DALI as ImageFolder's are, equal to plain."""
    root, special = mixed_root
    ds = hf.Dataset.from_dict({"image": [special["gray"]] * 6, "label": list(range(6))})
    ds = ds.cast_column("image", hf.Image()).with_transform(hf_transform)
    ref = load_all(ds, autoproxy=False, seed=4, batch_size=3)
    out = load_all(ds, autoproxy=True, seed=4, batch_size=3)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == 6 and rep["decoded_in_worker"] == {}, rep
    compare([(b["pixel_values"], b["label"]) for b in ref], [(b["pixel_values"], b["label"]) for b in out])
