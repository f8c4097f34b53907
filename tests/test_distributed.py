"""torch.distributed (gloo, 2 processes, DALI's CPU backend): every rank gets exactly the
samples plain torchvision gives it, with DistributedSampler, set_epoch and uneven shards;
enable() may come after init_process_group. The two-GPU twin is for the GPU machine."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision.transforms as T


def _rank_main(rank, world, init_file, root, out_dir):
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from helpers import image_folder
    from photos import MEAN, STD

    import dali_autoproxy
    enable_after_init = rank == 1  # rank 0 enables before init_process_group, rank 1 after it
    if not enable_after_init:
        dali_autoproxy.enable(device="cpu", log_level="ERROR")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if enable_after_init:
        dali_autoproxy.enable(device="cpu", log_level="ERROR")
    results = {}
    for arm in ("plain", "autoproxy"):
        if arm == "plain":
            dali_autoproxy.disable()
        else:
            dali_autoproxy.enable(device="cpu", log_level="ERROR")
        torch.manual_seed(100 + rank)
        full = image_folder(root, T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                                             T.Normalize(MEAN, STD)]))
        ds = torch.utils.data.Subset(full, list(range(23)))  # uneven: 23 samples over 2 ranks
        sampler = torch.utils.data.distributed.DistributedSampler(ds, shuffle=True, seed=0, drop_last=False)
        loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=sampler, num_workers=1)
        epochs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append([(x.clone(), y.clone()) for x, y in loader])
        proxied = dali_autoproxy.report()[-1]["proxied"] if arm == "autoproxy" else None
        results[arm] = {"epochs": epochs, "proxied": proxied}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_get_torchvisions_samples(photo_root, tmp_path):
    """Rank 0 calls enable() before init_process_group, rank 1 after it: both orders in one run."""
    from test_fidelity import compare
    world = 2
    mp.spawn(_rank_main, args=(world, str(tmp_path / "rdzv"), photo_root, str(tmp_path)), nprocs=world, join=True)
    per_rank_labels = []
    for rank in range(world):
        res = torch.load(tmp_path / f"rank{rank}.pt")
        assert res["autoproxy"]["proxied"] is True
        for ep_plain, ep_auto in zip(res["plain"]["epochs"], res["autoproxy"]["epochs"]):
            compare(ep_plain, ep_auto)  # same samples, same labels, same crops
        per_rank_labels.append([torch.cat([y for _, y in ep]) for ep in res["autoproxy"]["epochs"]])
    assert [len(per_rank_labels[r][0]) for r in range(world)] == [12, 12]  # padded to equal shards
    assert not torch.equal(per_rank_labels[0][0], per_rank_labels[0][1])  # set_epoch reshuffles


def _two_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _torchrun_both_arms(photo_root, tmp_path, extra_env, ports):
    """The unchanged DDP script under torchrun --nproc_per_node=2, plain and with DALI_AUTOPROXY=1."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ddp_train.py")
    runs = {}
    for arm, port in zip(("plain", "autoproxy"), ports):
        out = tmp_path / arm
        out.mkdir()
        env = dict(os.environ, DALI_AUTOPROXY="1" if arm == "autoproxy" else "0", DALI_AUTOPROXY_LOG="INFO",
                   **extra_env)
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              f"--master_port={port}", script, photo_root, str(out)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-4000:]
        runs[arm] = [torch.load(out / f"rank{r}.pt") for r in range(2)]
        if arm == "autoproxy":
            assert "proxied to DALI" in res.stderr, res.stderr[-3000:]
    return runs


def test_torchrun_with_the_environment_switch(photo_root, tmp_path):
    """CPU twin of the two-GPU test: torchrun, gloo, DALI_AUTOPROXY=1 through the start-up hook
    in every rank, DALI's CPU backend; each rank gets plain torchvision's samples."""
    from test_fidelity import compare
    runs = _torchrun_both_arms(photo_root, tmp_path, {"DALI_AUTOPROXY_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""},
                               (29527, 29528))
    for rank in range(2):
        plain, auto = runs["plain"][rank], runs["autoproxy"][rank]
        assert {b[2] for b in auto["batches"]} == {"cpu"}
        compare([(x, y) for x, y, _ in plain["batches"]], [(x, y) for x, y, _ in auto["batches"]])


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA GPUs (CPU twin: test_torchrun_with_the_environment_switch)")
def test_torchrun_two_gpus_each_rank_on_its_own_device(photo_root, tmp_path):
    """torchrun --nproc_per_node=2 on an unchanged DDP script, plain and with DALI_AUTOPROXY=1:
    each rank's batches arrive on its own GPU, no rank holds a context on the other GPU, and the
    samples (labels, crops) are plain torchvision's."""
    from test_fidelity import compare
    runs = _torchrun_both_arms(photo_root, tmp_path, {}, (29517, 29518))
    for rank in range(2):
        plain, auto = runs["plain"][rank], runs["autoproxy"][rank]
        assert {b[2] for b in plain["batches"]} == {"cpu"}
        assert {b[2] for b in auto["batches"]} == {f"cuda:{rank}"}
        assert auto["contexts"] == [rank], auto["contexts"]
        compare([(x, y) for x, y, _ in plain["batches"]], [(x, y) for x, y, _ in auto["batches"]],
                mae_max=1.5, psnr_min=36.0)
