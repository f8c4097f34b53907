"""The same paths with decoding and transforms on the GPU (nvJPEG / hardware decoder).
Skipped without a CUDA GPU; their CPU-backend twins are in test_fidelity.py and
test_behaviour.py. Run on the GPU machine with ``pytest -m gpu``.

Tolerance on the GPU, stated: MAE <= 1.5 uint8 levels and PSNR >= 36 dB per batch. nvJPEG's
IDCT and chroma upsampling differ from libjpeg-turbo's by a level or two near edges, on
top of the resampler differences measured on the CPU backend.
"""
import sys

import pytest
import torch
import torchvision
from helpers import image_folder, last_report, load_all
from test_fidelity import EVAL, TRAIN, compare

pytestmark = pytest.mark.gpu
GPU_MAE, GPU_PSNR = 1.5, 36.0


def _gpu_vs_torchvision(ds, strict=True, **kw):
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, device="gpu", strict=strict, **kw)
    rep = last_report()
    assert rep["proxied"] and rep["device"] == "gpu" and rep["decode_on_dali"], rep
    for x, y in out:
        assert x.is_cuda and x.device.index == torch.cuda.current_device()
        assert not y.is_cuda  # labels are untouched
    return compare(ref, [(x.cpu(), y) for x, y in out], mae_max=GPU_MAE, psnr_min=GPU_PSNR)


@pytest.mark.parametrize("name", sorted(EVAL))
def test_gpu_eval_matches_torchvision(photo_root, name):
    _gpu_vs_torchvision(image_folder(photo_root, EVAL[name]()))


@pytest.mark.parametrize("name", sorted(TRAIN))
def test_gpu_train_same_seed_same_crops(photo_root, name):
    _gpu_vs_torchvision(image_folder(photo_root, TRAIN[name]()), shuffle=True, seed=3)


def _cuda_flag(label):
    return label * 10 + int(torch.cuda.is_initialized())


def test_no_worker_touches_cuda(photo_root):
    ds = torchvision.datasets.ImageFolder(photo_root, transform=EVAL["v1_pil"](), target_transform=_cuda_flag)
    out = load_all(ds, autoproxy=True, device="gpu", num_workers=3)
    assert last_report()["proxied"]
    assert all(int(v) % 10 == 0 for _, y in out for v in y)  # no worker initialised CUDA
    assert out[0][0].is_cuda


def test_gpu_output_cpu_option_and_pin_memory(photo_root):
    import dali_autoproxy
    ds = image_folder(photo_root, EVAL["v2_pil"]())
    dali_autoproxy.enable(device="gpu", output="cpu")
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, pin_memory=True)
    for x, _ in loader:
        assert not x.is_cuda and x.is_pinned()
    assert last_report()["output"] == "cpu"


def test_gpu_mixed_formats(mixed_root):
    root, _ = mixed_root
    _gpu_vs_torchvision(image_folder(root, EVAL["v1_pil"]()), strict=False, batch_size=4)  # PNGs decode in the worker
    assert sum(last_report()["decoded_in_worker"].values()) == 3  # two PNGs and the CMYK JPEG


@pytest.mark.parametrize("pipeline", ["eval", "train"])
def test_gpu_odd_jpegs_decode_like_pillow(tmp_path, pipeline):
    from test_fidelity import check_odd_jpegs
    check_odd_jpegs(tmp_path, pipeline, "gpu")


# ---------------------------------------------------------------- reliability on the GPU
BAD_ON_GPU = ["random_bytes_over_compressed_data",
              "truncated_jpeg", "truncated_with_thumbnail", "zero_bytes", "png", "progressive_jpeg", "one_by_one_jpeg",
              "smaller_than_crop_jpeg", "corrupt_entropy_data", "header_claims_fewer_lines",
              "header_claims_more_lines", "header_claims_zero_lines"]


@pytest.mark.parametrize("kind", BAD_ON_GPU)
def test_gpu_bad_file_has_torchvisions_outcome(photo_root, tmp_path, kind):
    import shutil

    from test_reliability import BAD_FILES, outcomes, same_outcomes
    root = tmp_path / "data"
    shutil.copytree(photo_root, root)
    (root / "class1" / f"zz_{kind}.jpg").write_bytes(BAD_FILES[kind]())
    ds = image_folder(str(root), EVAL["v1_pil"]())
    ref = outcomes(ds, autoproxy=False, seed=2)
    out = outcomes(ds, autoproxy=True, device="gpu", seed=2)
    if kind in ("corrupt_entropy_data", "header_claims_more_lines"):
        # Complete but corrupt, or short of the lines its header claims: PIL (libjpeg-turbo) and
        # nvJPEG both decode it without an error, each filling in its own way (seen on the H200).
        # Guaranteed: same outcomes, labels in place, every other image of the batch faithful.
        bad = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith(f"zz_{kind}.jpg"))
        flat_ref = [(x[i:i + 1], y[i:i + 1]) for o in ref if o[0] == "ok" for x, y in [o[1:]] for i in range(len(y))]
        flat_out = [(x[i:i + 1], y[i:i + 1]) for o in out if o[0] == "ok" for x, y in [o[1:]] for i in range(len(y))]
        assert [o[0] for o in ref] == [o[0] for o in out] and len(flat_ref) == len(flat_out) == len(ds)
        keep = [k for k in range(len(ds)) if k != bad]
        compare([flat_ref[k] for k in keep], [flat_out[k] for k in keep], mae_max=GPU_MAE, psnr_min=GPU_PSNR)
        return
    same_outcomes(ref, out, mae_max=GPU_MAE, psnr_min=GPU_PSNR)


def test_gpu_memory_is_returned_when_the_loader_is_gone(photo_root):
    import gc

    import dali_autoproxy

    def used_mb():
        """This process's device memory (NVML, via torch), else the whole GPU's: parallel test
        processes sharing the GPU make the latter noisy."""
        import os
        import re
        torch.cuda.synchronize()
        try:
            listing = torch.cuda.list_gpu_processes()
            m = re.search(rf"process\s+{os.getpid()}\s+uses\s+([0-9.]+)\s*MB", listing)
            if m:
                return float(m.group(1))
        except Exception:
            pass
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**20

    ds = image_folder(photo_root, TRAIN["v1"]())

    def cycle():
        dali_autoproxy.enable(device="gpu")
        loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)
        peak = 0.0
        for x, _ in loader:
            peak = max(peak, used_mb())
            del x
        del loader
        gc.collect()
        dali_autoproxy.disable()
        return peak
    cycle()  # CUDA context and DALI's libraries: loaded once per process
    base = used_mb()
    peak = cycle()
    after = used_mb()
    assert peak > base  # the pipeline did hold device memory while it ran...
    assert after - base < 64, (base, peak, after)  # ...and gave it back


def _startup_hook_installed() -> bool:
    """Whether ``dali_autoproxy.pth`` (the DALI_AUTOPROXY=1 hook) is in a site-packages directory:
    ``pip install`` puts it there; a source tree on PYTHONPATH alone has no hook."""
    import os
    import site
    dirs = site.getsitepackages() + [site.getusersitepackages()]
    return any(os.path.exists(os.path.join(d, "dali_autoproxy.pth")) for d in dirs)


@pytest.mark.skipif(not _startup_hook_installed(), reason="DALI_AUTOPROXY=1 needs the start-up hook that "
                    "`pip install -e .` installs; this package runs from a source tree")
def test_gpu_imagenet_like_script_unchanged(tmp_path, photo_root):
    """GPU twin of test_scripts.py::test_imagenet_like_script_unchanged (device=auto)."""
    import os
    import shutil

    from test_scripts import HERE, _run
    shutil.copytree(photo_root, tmp_path / "train")
    shutil.copytree(photo_root, tmp_path / "val")
    cmd = [sys.executable, os.path.join(HERE, "scripts", "imagenet_like.py"), str(tmp_path), "--epochs", "2"]
    plain = _run(cmd)
    auto = _run(cmd, DALI_AUTOPROXY="1")
    assert auto["report"] == [[True, None], [True, None]] and auto["device"] == "cuda"
    assert abs(plain["train_loss"] - auto["train_loss"]) < 0.05 * plain["train_loss"]


from test_catalogue import PARAMS, check, measure  # noqa: E402


@pytest.mark.parametrize("case,api", PARAMS)
def test_gpu_catalogue_against_torchvision(photo_root, case, api):
    """The catalogue on the GPU, PIL decoding in the worker so that the transforms alone are
    measured. Exact cases may differ by float contraction (FMA) in the GPU's arithmetic: at
    most 1 level, on at most 0.1% of the values."""
    m = measure(case, api, photo_root, device="gpu", raw=True)
    if case.expect == "exact" and m["status"] == "DALI" and m["uint8"]:
        assert m["max"] <= 1 and m["mean"] <= 1e-3, m
    else:
        check(case, m)


@pytest.mark.parametrize("case,api", [p for p in PARAMS if p.values[0].dali_resize])
def test_gpu_dali_resize_within_its_bound(photo_root, case, api):
    """The opt-in resize="dali" on the GPU: DALI's resize within the catalogue's bound."""
    check(case, measure(case, api, photo_root, device="gpu", raw=True, resize="dali"), resize="dali")


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_torchvisions_tensor_jitter_on_cuda_divides_as_on_the_cpu(api):
    """torchvision's tensor ColorJitter kernels, called on CUDA tensors inside ``cpu_division``,
    equal the same calls on the CPU bit for bit (without it, CUDA's ``x / number`` and ``mean``
    move a truncation by a level, and hue turns it into several)."""
    import numpy as np
    from skimage import data

    from dali_autoproxy.backends.torch_stage.host_division import cpu_division
    from dali_autoproxy.backends.torch_stage.tensor_jitter import tensor_jitter_kernels
    kernels = tensor_jitter_kernels(api)
    photos = [getattr(data, n)()[:200, :200] for n in ("astronaut", "chelsea", "coffee", "rocket")]
    x = torch.from_numpy(np.stack(photos)).permute(0, 3, 1, 2).contiguous()
    rng = np.random.default_rng(0)
    for _ in range(8):  # each a random order of the four kernels
        host, dev = x, x.cuda()
        for which in rng.permutation(4):
            f = (rng.uniform(-0.1, 0.1, 4) if which == 3 else rng.uniform(0.6, 1.4, 4)).astype(np.float64)
            run = kernels[which]
            host = torch.cat([run(host[i:i + 1], torch.tensor(f[i]).view(1, 1, 1, 1)) for i in range(4)])
            with cpu_division(dev):
                dev = run(dev, torch.tensor(f).cuda().view(-1, 1, 1, 1))
        assert torch.equal(dev.cpu(), host)


@pytest.mark.parametrize("chain", ["heavy", "trivialaugment"])
def test_torch_stage_queues_its_work_without_waiting_for_the_gpu(chain, monkeypatch):
    """The torch stage runs on the main thread between DALI batches: a synchronising copy in it
    would stall the loop until the GPU drains (measured: half the heavy and trivialaugment
    throughput). Under torch's sync debug mode any such call raises. The results equal the
    stage on the CPU (whose exactness against torchvision test_policies.py and the catalogue
    check): the GPU may differ by float contraction in the blur, at most 1 level."""
    import numpy as np
    import torchvision.transforms as T

    from dali_autoproxy.backends.torch_stage import TorchStage
    from dali_autoproxy.plan.ir import split_at_takeover as split
    from dali_autoproxy.plan.planning import SETTINGS, build_plan
    # the stage after DALI's resize: its input is the 64 x 64 crop, not the resize's source
    monkeypatch.setitem(SETTINGS, "resize", "dali")
    tail = ([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.2), T.GaussianBlur(9, (0.1, 2.0)),
             T.RandomRotation(15)] if chain == "heavy" else [T.TrivialAugmentWide()])
    plan = build_plan(T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), *tail, T.ToTensor(),
                                 T.Normalize([0.5] * 3, [0.25] * 3), T.RandomErasing()]))
    _, ops = split(plan.ops)
    stage = TorchStage(ops)
    torch.manual_seed(0)
    params = np.array([plan.draw(300, 400) for _ in range(64)])
    x = torch.randint(0, 256, (64, 64, 64, 3), dtype=torch.uint8)
    on_gpu = x.cuda()
    stage(on_gpu, params)  # builds the one-off tables (hue) outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = stage(on_gpu, params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = stage(x, params)
    assert (out.cpu() - ref).abs().max() <= (1 / 0.25 / 255 + 1e-5)


# ---------------------------------------------------------------- any dataset on the GPU
@pytest.mark.parametrize("shape", ["path", "bytes", "two_view", "multi_crop"])
def test_gpu_own_datasets_decode_on_the_gpu(photo_root, shape):
    """GPU twin of test_any_dataset.py: chains taken where they are called, JPEGs opened with
    PIL decoded by nvJPEG; every view within the GPU bounds of plain torchvision."""
    import test_any_dataset as A
    ds = {"path": lambda: A.PathDataset(photo_root, A.TRAIN()),
          "bytes": lambda: A.BytesDataset(photo_root, A.EVAL()),
          "two_view": lambda: torchvision.datasets.ImageFolder(photo_root, transform=A.TwoViews(A.TRAIN())),
          "multi_crop": lambda: A.PathDataset(photo_root, A.MultiCrop())}[shape]()
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=4)
    out = load_all(ds, autoproxy=True, device="gpu", shuffle=True, seed=4)
    rep = last_report()
    views = {"two_view": 2, "multi_crop": 5}.get(shape, 1)
    assert rep["device"] == "gpu" and rep["decoded_on_dali"] == views * len(ds), rep
    for v in range(views):
        pick = (lambda b: (b[0][v], b[1])) if views > 1 else (lambda b: (b[0], b[1]))
        assert all(pick(b)[0].is_cuda for b in out)
        compare([pick(b) for b in ref], [(pick(b)[0].cpu(), pick(b)[1]) for b in out], mae_max=GPU_MAE,
                psnr_min=GPU_PSNR)


# ---------------------------------------------------------------- fidelity="fast" on the GPU
@pytest.mark.parametrize("name", ["brightness", "contrast", "saturation", "hue"])
def test_gpu_fast_color_jitter_within_its_published_bound(photo_root, name):
    """GPU twin of test_fast_fidelity.py: DALI's colour operator with torchvision's draws; the
    GPU decode's own difference is allowed on top (3 dB)."""
    import torchvision.transforms as T
    from photos import psnr
    from test_fast_fidelity import BOUNDS, fast_against_torchvision
    factor, floor = BOUNDS[name]
    a, b = fast_against_torchvision(photo_root, T.Compose([T.CenterCrop(200), T.ColorJitter(**factor),
                                                           T.PILToTensor()]), device="gpu")
    assert psnr(a, b) >= floor - 3.0, (name, psnr(a, b))


def test_gpu_recorded_pillow_class_and_handed_images(photo_root):
    """Twins of test_recorded.py's and test_pillow_ops.py's users' classes: a recorded Pillow class
    and a geometric chain handing its image to colour chains, decoded and computed on the GPU,
    within the GPU tolerance of plain (nvJPEG's decode; the recorded calls' kernels are exact)."""
    import random

    import torchvision.transforms as T
    from photos import MEAN, STD
    from test_pillow_ops import GeometricThenColour
    from test_recorded import SelfSupervisedBlur
    random.seed(5)
    chain = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), SelfSupervisedBlur(), T.ToTensor(),
                       T.Normalize(MEAN, STD)])
    _gpu_vs_torchvision(image_folder(photo_root, chain), shuffle=True, seed=3)
    ds = image_folder(photo_root, GeometricThenColour(T))
    ref = load_all(ds, autoproxy=False, shuffle=True, seed=3)
    out = load_all(ds, autoproxy=True, device="gpu", shuffle=True, seed=3)
    rep = last_report()
    assert rep["proxied"] and rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], rep
    for (views_a, la), (views_b, lb) in zip(ref, out):
        assert len(views_a) == len(views_b) == 3
        for a, b in zip(views_a, views_b):
            assert b.is_cuda
            compare([(a, la)], [(b.cpu(), lb)], normalized=False, mae_max=GPU_MAE,
                    psnr_min=GPU_PSNR)


def test_gpu_views_of_one_image_decode_it_once(photo_root):
    """The CPU twin is test_shared_decode.py: each image decoded once on the GPU for its five
    views, every view within the GPU bound of plain torchvision's."""
    from test_shared_decode import MultiView, _views
    ds = image_folder(photo_root, MultiView(_views()))
    ref = load_all(ds, autoproxy=False, seed=3, shuffle=True)
    out = load_all(ds, autoproxy=True, device="gpu", seed=3, shuffle=True)
    rep = last_report()
    assert rep["proxied"] and rep["device"] == "gpu" and rep["decode"] == "DALI 100%", rep
    assert rep["dali_decodes"] == len(ds) and rep["decoded_on_dali"] == 5 * len(ds), rep
    for k in range(5):
        assert all(x[k].is_cuda for x, _ in out)
        compare([(x[k], y) for x, y in ref], [(x[k].cpu(), y) for x, y in out], normalized=False,
                mae_max=GPU_MAE, psnr_min=GPU_PSNR)


def test_gpu_recorded_size_changes(photo_root):
    """The CPU twin is test_recorded_geometry.py: a user's crop, blur and resize (Pillow's
    methods and torchvision's functional API) on the GPU, within the GPU bound of plain's."""
    import random

    from test_recorded_geometry import GEOMETRY, UserClass
    for name in ("tf_resize_center_crop", "crop_blur_resize", "crop_past_the_edges"):
        ds = image_folder(photo_root, torchvision.transforms.Compose([UserClass(GEOMETRY[name]),
                                                                      torchvision.transforms.PILToTensor()]))
        random.seed(5)
        ref = load_all(ds, autoproxy=False, seed=5)
        random.seed(5)
        out = load_all(ds, autoproxy=True, device="gpu", seed=5)
        rep = last_report()
        assert rep["decode"] == "DALI 100%" and rep["worker_transforms"] == [], (name, rep)
        compare(ref, [(x.cpu(), y) for x, y in out], normalized=False, mae_max=GPU_MAE, psnr_min=GPU_PSNR)


@pytest.mark.parametrize("recipe", ["SimCLR", "DINO"])
def test_gpu_lightly_recipes(photo_root, recipe):
    """The CPU twin is test_pillow_ops.py::test_lightly_recipes_unchanged_run_on_dali_equal_to_plain:
    lightly's transforms on the GPU, every view within the GPU bound of plain's, decoded once."""
    import random

    import numpy as np
    lt = pytest.importorskip("lightly.transforms")
    make = {"SimCLR": lambda: lt.SimCLRTransform(input_size=64),
            "DINO": lambda: lt.DINOTransform(global_crop_size=64, local_crop_size=32, n_local_views=2)}[recipe]
    ds = image_folder(photo_root, make())
    runs = []
    for proxied in (False, True):
        random.seed(7)
        np.random.seed(7)
        runs.append(load_all(ds, autoproxy=proxied, device="gpu", resize="pillow"))
    rep = last_report()
    assert rep["decode"] == "DALI 100%" and rep["dali_decodes"] == len(ds), rep
    views = len(runs[0][0][0])
    for k in range(views):
        compare([(x[k], y) for x, y in runs[0]], [(x[k].cpu(), y) for x, y in runs[1]], mae_max=GPU_MAE,
                psnr_min=GPU_PSNR)


def test_staged_uploads_arrive_intact_while_the_gpu_is_busy():
    """The torch stage's small uploads share a pinned ring: thousands of them, of sizes that
    wrap the ring many times, queued behind long GPU work, each arrives as it was sent (a region
    is reused only after the copy that read it has run)."""
    import numpy as np

    from dali_autoproxy.backends.torch_stage.registry import _THREAD, upload
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    busy = torch.randn(4096, 4096, device=dev)
    sent, arrived = [], []
    for i in range(3000):
        if i % 200 == 0:
            busy = busy @ busy / 64  # keeps the stream busy so that copies queue up
        values = rng.integers(0, 1 << 30, int(rng.integers(1, 60_000)), dtype=np.int64)
        sent.append(values)
        arrived.append(upload(values, dev))
    assert all(np.array_equal(a.cpu().numpy(), s) for a, s in zip(arrived, sent))
    assert _THREAD.staging.at > 0


def test_gpu_stage_on_its_own_stream_hands_over_whole_batches(photo_root):
    """The torch stage runs on its pipeline's own stream, and the loop's stream waits for it
    when the loop takes a batch. With the loop on a stream of its own that reads some batches
    at once and others only after long queued work (freeing each batch on the host while that
    read is still queued, so its memory could go to a later batch's stage), every batch equals
    the same epoch read plainly: the wait and the memory's hand-over both hold."""
    import torchvision.transforms as T
    from torch.utils.data import DataLoader

    import dali_autoproxy
    from dali_autoproxy.backends.dali import runner
    assert runner.STAGE_ON_OWN_STREAM
    ds = image_folder(photo_root, T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                                             T.Normalize([0.5] * 3, [0.25] * 3)]))
    quiet = load_all(ds, autoproxy=True, device="gpu", resize="pillow", seed=3, shuffle=True, batch_size=4,
                     epochs=2)
    assert last_report()["proxied"]
    dali_autoproxy.enable(device="gpu", resize="pillow", log_level="WARNING")
    try:
        torch.manual_seed(3)
        loop = torch.cuda.Stream()
        loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=True)
        with torch.cuda.stream(loop):
            for epoch in range(2):  # the second epoch's batches against load_all's
                out = []
                for k, (x, y) in enumerate(loader):
                    if k % 2:
                        torch.cuda._sleep(50_000_000)  # tens of ms of queued work before the read
                    out.append((x * 1, y))
                    del x
            loop.synchronize()
    finally:
        dali_autoproxy.disable()
    assert len(out) == len(quiet)
    for (a, ya), (b, yb) in zip(quiet, out):
        assert torch.equal(ya, yb) and torch.equal(a.cpu(), b.cpu())
