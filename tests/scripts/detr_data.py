"""DETR's own training data path, unchanged: ``datasets/coco.py`` (its CocoDetection, with masks)
and ``datasets/transforms.py`` (``make_coco_transforms("train")``) from the checkout in DETR_DIR,
with ``util.misc.collate_fn``. One epoch, seeded; the batches saved with torch.save.

    python detr_data.py IMAGES ANNOTATIONS OUT.pt
"""
import os
import sys

import torch

sys.path.insert(0, os.environ["DETR_DIR"])
import util.misc as utils  # noqa: E402
from datasets.coco import CocoDetection, make_coco_transforms  # noqa: E402

images, annotations, out = sys.argv[1:4]
dataset = CocoDetection(images, annotations, transforms=make_coco_transforms("train"), return_masks=True)
torch.manual_seed(0)
loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True, num_workers=2, collate_fn=utils.collate_fn)
batches = []
for samples, targets in loader:
    batches.append({"tensors": samples.tensors.cpu(), "mask": samples.mask.cpu(),
                    "targets": [{k: v.cpu() for k, v in t.items()} for t in targets]})
report = None
if os.environ.get("DALI_AUTOPROXY"):
    import dali_autoproxy
    report = dali_autoproxy.report()[-1]
torch.save({"batches": batches, "report": report}, out)
