"""An ordinary DDP training script (nothing of dali_autoproxy in it), for torchrun:

    torchrun --nproc_per_node=2 ddp_train.py IMAGE_ROOT OUT_DIR

Each rank saves what its loop saw (batches, the device they arrived on) and which GPUs hold a
CUDA context of its process (nvidia-smi), for tests/test_distributed.py. Without a GPU it uses
gloo and the model stays on the CPU."""
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel


def contexts_of(pid: int):
    """GPU indices on which process ``pid`` holds a CUDA context."""
    uuids = dict(line.split(", ") for line in subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines())
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return sorted(int(uuids[u]) for p, u in (a.split(", ") for a in apps if a) if int(p) == pid)


def main():
    root, out = sys.argv[1], sys.argv[2]
    local_rank = int(os.environ["LOCAL_RANK"])
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, pin_memory=True)
    model = DistributedDataParallel(torch.nn.Conv2d(3, 4, 3).cuda(), device_ids=[local_rank]) if gpu else \
        DistributedDataParallel(torch.nn.Conv2d(3, 4, 3))
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            arrived_on = str(x.device)
            if gpu:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            model(x).mean().backward()
            seen.append((x.cpu(), y.cpu(), arrived_on))
    if gpu:
        torch.cuda.synchronize()
    torch.save({"batches": seen, "contexts": contexts_of(os.getpid()) if gpu else None, "local_rank": local_rank},
               os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
