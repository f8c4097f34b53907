"""A multi-node webdataset training input, unchanged: each rank reads its shards
(split_by_node, then split by worker) through a DataLoader; saves what it got per rank.

    torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d ... wds_nodes.py OUT SHARD...
"""
import os
import sys

import torch
import torch.distributed as dist
import torchvision.transforms as T
import webdataset as wds

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def identity(x):
    return x


def main():
    out, urls = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = (wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
          .decode("pil").to_tuple("jpg", "cls", "__key__").map_tuple(tf, identity, identity))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    batches = [(x.cpu(), y, list(k)) for x, y, k in loader]
    report = None
    if "dali_autoproxy" in sys.modules:
        report = [(r["proxied"], r["decoded_on_dali"]) for r in sys.modules["dali_autoproxy"].report()]
    torch.save({"batches": batches, "report": report}, os.path.join(out, f"rank{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
