"""Loaders made by libraries built on the DataLoader: PyTorch Lightning's Trainer and Hugging
Face accelerate's prepared DataLoader (CPU, DALI's CPU backend)."""
import pytest
import torch
import torchvision.transforms as T
from helpers import image_folder
from photos import MEAN, STD

import dali_autoproxy

TRAIN = lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),  # noqa: E731
                           T.Normalize(MEAN, STD)])
EVAL = lambda: T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])  # noqa: E731


def test_lightning_trainer(photo_root):
    L = pytest.importorskip("lightning.pytorch")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 5, stride=4), torch.nn.AdaptiveAvgPool2d(1),
                                           torch.nn.Flatten(), torch.nn.Linear(4, 3))
            self.seen = {"train": 0, "val": 0}

        def training_step(self, batch, i):
            x, y = batch
            assert x.shape[1:] == (3, 64, 64) and x.dtype == torch.float32
            self.seen["train"] += len(y)
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, i):
            x, y = batch
            self.seen["val"] += len(y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(image_folder(photo_root, TRAIN()), batch_size=4, shuffle=True,
                                               num_workers=2)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(image_folder(photo_root, EVAL()), batch_size=4, num_workers=2)

    dali_autoproxy.enable(device="cpu", log_level="ERROR")
    earlier = {r["loader"] for r in dali_autoproxy.report()}  # rows of loaders other tests iterated
    model = Module()
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, num_sanity_val_steps=0)
    trainer.fit(model)
    assert model.seen == {"train": 24, "val": 24}
    used = [r for r in dali_autoproxy.report() if r["batches"] and r["loader"] not in earlier]
    assert len(used) >= 2 and all(r["proxied"] for r in used)


def test_accelerate_prepared_dataloader(photo_root):
    accelerate = pytest.importorskip("accelerate")
    ds = image_folder(photo_root, EVAL())
    plain = torch.cat([x for x, _ in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)])
    dali_autoproxy.enable(device="cpu", log_level="ERROR")
    before = len(dali_autoproxy.report())
    acc = accelerate.Accelerator(cpu=True)
    loader = acc.prepare(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2))
    out = torch.cat([x for x, _ in loader])
    rows = dali_autoproxy.report()[before:]
    assert len(rows) == 1 and rows[0]["proxied"] and rows[0]["samples"] == len(ds), rows  # not the one it replaced
    assert out.shape == plain.shape
    assert float((out - plain).abs().mean()) * 0.226 * 255 < 0.5
