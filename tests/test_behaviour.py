"""Loader behaviour with autoproxy: patching, DataLoader options, fallbacks, report."""
import contextlib
import logging
import multiprocessing
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision.transforms as T
import wrapt
from helpers import falls_back_identically, image_folder, last_report, load_all
from photos import MEAN, STD
from test_fidelity import compare
from torch.utils.data import DataLoader as DataLoaderImportedEarly  # before any enable()
from torch.utils.data.distributed import DistributedSampler

import dali_autoproxy
from dali_autoproxy.main.hooks import instrumentor  # noqa: F401
from dali_autoproxy.patches import ledger

EVAL = lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])  # noqa: E731
TRAIN = lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),  # noqa: E731
                           T.Normalize(MEAN, STD)])


def test_enable_twice_and_disable_restore_the_class():
    dl = torch.utils.data.dataloader.DataLoader
    originals = {k: dl.__dict__[k] for k in ("__init__", "_get_iterator")}
    dali_autoproxy.enable(device="cpu")
    dali_autoproxy.enable(device="cpu")
    assert dali_autoproxy.is_enabled()
    for k in originals:
        assert isinstance(dl.__dict__[k], wrapt.FunctionWrapper)
        assert dl.__dict__[k].__wrapped__ is originals[k]
    assert ledger.patched() == ["torch.utils.data.dataloader.DataLoader.__init__",
                                "torch.utils.data.dataloader.DataLoader._get_iterator"]
    dali_autoproxy.disable()
    assert not dali_autoproxy.is_enabled() and ledger.patched() == []
    for k, v in originals.items():
        assert dl.__dict__[k] is v


def test_an_unsupported_torch_is_not_patched(monkeypatch):
    """The versions the patches are written against are checked before anything is patched."""
    from dali_autoproxy.patches import SUPPORTED, unsupported
    assert unsupported("torch", "1.13.1") and unsupported("torchvision", "0.14.0")
    assert unsupported("torch", "2.11.0+cu130") is None and unsupported("nvidia.dali", "2.4.0") is None
    monkeypatch.setattr(torch, "__version__", "1.13.1")
    dl = torch.utils.data.dataloader.DataLoader
    original = dl.__dict__["_get_iterator"]
    try:
        with _warnings() as said:
            dali_autoproxy.enable(device="cpu")
        assert dl.__dict__["_get_iterator"] is original and ledger.patched() == []
        assert f"torch 1.13.1 is older than the oldest supported, {SUPPORTED['torch'][0]}.0" in " ".join(said)
    finally:
        dali_autoproxy.disable()


@contextlib.contextmanager
def _warnings():
    """The package logger's WARNING messages while the block runs (whatever its propagation)."""
    said: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())
    handler = Keep(logging.WARNING)
    log = logging.getLogger("dali_autoproxy")
    log.addHandler(handler)
    try:
        yield said
    finally:
        log.removeHandler(handler)


def test_a_newer_torch_than_tested_is_patched_with_one_warning(monkeypatch):
    from dali_autoproxy import patches
    monkeypatch.setattr(torch, "__version__", "9.1.0")
    monkeypatch.setattr(patches, "_warned_untested", set())
    try:
        with _warnings() as said:
            dali_autoproxy.enable(device="cpu")
            dali_autoproxy.disable()
            dali_autoproxy.enable(device="cpu")
            assert "torch.utils.data.dataloader.DataLoader._get_iterator" in " ".join(ledger.patched())
        newest = "%d.%d" % patches.TESTED["torch"]
        assert " ".join(said).count(f"torch 9.1.0 is newer than the newest tested, {newest}") == 1
    finally:
        dali_autoproxy.disable()


def test_a_torch_whose_internals_moved_is_not_patched(monkeypatch):
    """Whatever its version says: a private function the package relies on is gone, so nothing is
    patched and the loader is plain torchvision's, the reason logged."""
    from dali_autoproxy import patches
    monkeypatch.setitem(patches.PRIVATE_INTERNALS, "torch",
                        patches.PRIVATE_INTERNALS["torch"] + ["torch.utils.data.dataloader.DataLoader._moved_away"])
    try:
        with _warnings() as said:
            dali_autoproxy.enable(device="cpu")
        assert ledger.patched() == []
        moved = "has no torch.utils.data.dataloader.DataLoader._moved_away, which the package relies on"
        assert moved in " ".join(said)
    finally:
        dali_autoproxy.disable()


def test_loader_imported_before_enable_is_proxied_and_keeps_its_api(photo_root):
    ds = image_folder(photo_root, EVAL())
    tf = ds.transform
    dali_autoproxy.enable(device="cpu")
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)
    loader = DataLoaderImportedEarly(ds, batch_size=5, num_workers=2, sampler=sampler)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert len(loader) == (len(ds) + 4) // 5 and loader.dataset is ds and loader.sampler is sampler
    sampler.set_epoch(1)
    n = sum(len(y) for _, y in loader)
    assert n == len(ds) and last_report()["proxied"]
    assert ds.transform is tf  # the user's dataset is untouched in the main process
    pickle.loads(pickle.dumps((ds, sampler)))  # the loader's arguments still pickle


@pytest.mark.parametrize("kw", [
    dict(num_workers=0),
    dict(num_workers=2, pin_memory=True),
    dict(num_workers=2, persistent_workers=True),
    dict(num_workers=2, drop_last=False, batch_size=7),
    dict(num_workers=1, batch_size=1),
    dict(num_workers=2, prefetch_factor=4, multiprocessing_context="spawn"),
], ids=["workers0", "pin_memory", "persistent", "last_small_batch", "batch1", "spawn"])
def test_loader_options_give_torchvision_batches(photo_root, kw):
    ds = image_folder(photo_root, TRAIN())
    kw = dict(kw, shuffle=True, seed=5)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, **kw)
    assert last_report()["proxied"], last_report()
    assert [len(b[1]) for b in ref] == [len(b[1]) for b in out]
    compare(ref, out)


def test_persistent_workers_across_epochs_and_break(photo_root):
    ds = image_folder(photo_root, TRAIN())
    dali_autoproxy.enable(device="cpu")
    torch.manual_seed(0)
    loader = DataLoaderImportedEarly(ds, batch_size=4, num_workers=2, shuffle=True, persistent_workers=True)
    for x, y in loader:
        break  # leaves batches in flight
    seen = []
    for epoch in range(2):
        labels = torch.cat([y for _, y in loader])
        assert len(labels) == len(ds)
        assert sorted(labels.tolist()) == sorted(t for _, t in ds.samples)
        seen.append(labels)
    assert not torch.equal(seen[0], seen[1])  # reshuffled


def test_two_loaders_interleaved(photo_root):
    train, val = image_folder(photo_root, TRAIN()), image_folder(photo_root, EVAL())
    ref_val = load_all(val, autoproxy=False)
    dali_autoproxy.enable(device="cpu")
    tl = DataLoaderImportedEarly(train, batch_size=4, num_workers=2, shuffle=True)
    vl = DataLoaderImportedEarly(val, batch_size=8, num_workers=2)
    vi = iter(vl)
    out_val = []
    for i, (x, y) in enumerate(tl):
        assert x.shape[1:] == (3, 96, 96)
        if i % 2 == 0:
            b = next(vi, None)
            if b is not None:
                out_val.append(b)
    out_val += list(vi)
    assert all(r["proxied"] for r in dali_autoproxy.report()[-2:])
    compare(ref_val, out_val)


# ---------------------------------------------------------------- fallbacks: reason + identical batches
def _fallback_case(ds, reason_part, **kw):
    rep = falls_back_identically(ds, reason_part, **kw)
    assert rep["worker_transforms"] and not rep["dali_transforms"]


def test_fallback_untranslated_transform(photo_root):
    """Untranslatable last step: nothing is left for DALI after it."""
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.RandomRotation(10)])
    _fallback_case(image_folder(photo_root, tf), "RandomRotation on tensors", shuffle=True)


def test_fallback_unsupported_argument(photo_root):
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.RandomErasing(p=1.0, value="random")])
    _fallback_case(image_folder(photo_root, tf), "fills with torch's normal noise")


def test_fallback_no_batching(photo_root):
    _fallback_case(image_folder(photo_root, EVAL()), "batch_size=None", batch_size=None)


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, inner):
        self.inner, self.transform = inner, inner.transform

    def __iter__(self):
        return (self.inner[i] for i in range(len(self.inner)))


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_is_proxied(photo_root, workers):
    """An IterableDataset's chains are taken where its iterator calls them (each worker here
    streams the whole dataset, as the class does: the library's sharding is kept)."""
    ds = _Stream(image_folder(photo_root, EVAL()))
    ref = load_all(ds, autoproxy=False, num_workers=workers)
    out = load_all(ds, autoproxy=True, num_workers=workers)
    rep = last_report()
    assert rep["proxied"] and rep["decoded_on_dali"] == sum(len(b[1]) for b in out), rep
    compare(ref, out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_fallback_without_gpu_in_auto_mode(photo_root):
    ds = image_folder(photo_root, EVAL())
    ref = load_all(ds, autoproxy=False)
    out = load_all(ds, autoproxy=True, device="auto")
    rep = last_report()
    assert not rep["proxied"] and "no usable CUDA GPU" in rep["reason"]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ref, out))


def test_fallback_when_setup_fails(photo_root, monkeypatch):
    from dali_autoproxy.backends.dali import runner as pipeline

    def broken(*a, **k):
        raise RuntimeError("simulated pipeline build failure")
    monkeypatch.setattr(pipeline.DaliRunner, "_build", broken)
    _fallback_case(image_folder(photo_root, EVAL()), "set-up failed")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failed_build_while_workers_start_falls_back_with_plains_draws(photo_root, monkeypatch, workers):
    """The first pipeline builds while the workers start; where it fails they are stopped and
    plain ones started from the same generator states: a shuffled, randomly cropped epoch equals
    plain's, batch for batch, and nothing is left running."""
    from dali_autoproxy.backends.dali import runner as pipeline

    def broken(*a, **k):
        raise RuntimeError("simulated pipeline build failure")
    monkeypatch.setattr(pipeline.DaliRunner, "_build", broken)
    tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor()])
    _fallback_case(image_folder(photo_root, tf), "set-up failed", shuffle=True, num_workers=workers)
    assert not multiprocessing.active_children()


def test_fallback_without_dali_installed(photo_root, tmp_path):
    script = tmp_path / "no_dali.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.modules["nvidia.dali"] = None  # import nvidia.dali now raises ImportError
        sys.path.insert(0, {str(__import__('os').path.dirname(__file__))!r})
        import torch, json
        from helpers import image_folder, load_all, last_report
        from photos import MEAN, STD
        import torchvision.transforms as T
        ds = image_folder({photo_root!r}, T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor()]))
        ref = load_all(ds, autoproxy=False)
        out = load_all(ds, autoproxy=True, device="cpu")
        assert all(torch.equal(a[0], b[0]) for a, b in zip(ref, out))
        print(json.dumps(last_report()))
    """))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    import json
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    assert not rep["proxied"] and "DALI is not installed" in rep["reason"]
    assert "running plain torchvision" in res.stderr  # one message per loader, visible by default


# ---------------------------------------------------------------- errors, options, report
def test_bad_option_values_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"device='tpu'.*auto, gpu, cpu"):
        dali_autoproxy.enable(device="tpu")
    with pytest.raises(ValueError, match=r"output='gpu'.*auto, cpu"):
        dali_autoproxy.enable(output="gpu")
    with pytest.raises(ValueError, match=r"log_level='LOUD'"):
        dali_autoproxy.enable(log_level="LOUD")
    for bad in (0, 65, 2.5, "4", True):
        with pytest.raises(ValueError, match=r"lookahead=.*whole numbers 1 to 64"):
            dali_autoproxy.enable(lookahead=bad)
    monkeypatch.setenv("DALI_AUTOPROXY_LOOKAHEAD", "deep")
    with pytest.raises(ValueError, match="DALI_AUTOPROXY_LOOKAHEAD='deep'"):
        dali_autoproxy.enable()
    monkeypatch.setenv("DALI_AUTOPROXY_LOOKAHEAD", " 6 ")
    from dali_autoproxy.config import resolve_options
    assert resolve_options().lookahead == 6 and resolve_options(lookahead=2).lookahead == 2
    monkeypatch.delenv("DALI_AUTOPROXY_LOOKAHEAD")
    assert resolve_options().lookahead is None  # the default: main/runs.py's lookahead_batches
    monkeypatch.setenv("DALI_AUTOPROXY_DEVICE", "quantum")
    with pytest.raises(ValueError, match="DALI_AUTOPROXY_DEVICE='quantum'"):
        dali_autoproxy.enable()
    assert not dali_autoproxy.is_enabled()


def test_hw_decoder_load_option_is_validated_and_reaches_the_gpu_decoder(monkeypatch, photo_root):
    from nvidia.dali import Pipeline, fn

    from dali_autoproxy.backends.dali.lowering import Lowering
    from dali_autoproxy.config import Options, resolve_options
    from dali_autoproxy.plan.planning import build_plan
    for bad in (-0.1, 1.5, "0.5", True, float("nan")):
        with pytest.raises(ValueError, match=r"hw_decoder_load=.*numbers from 0 to 1"):
            dali_autoproxy.enable(hw_decoder_load=bad)
    monkeypatch.setenv("DALI_AUTOPROXY_HW_DECODER_LOAD", "most")
    with pytest.raises(ValueError, match="DALI_AUTOPROXY_HW_DECODER_LOAD='most'"):
        dali_autoproxy.enable()
    monkeypatch.setenv("DALI_AUTOPROXY_HW_DECODER_LOAD", " 0.25 ")
    assert resolve_options().hw_decoder_load == 0.25 and resolve_options(hw_decoder_load=1).hw_decoder_load == 1.0
    monkeypatch.delenv("DALI_AUTOPROXY_HW_DECODER_LOAD")
    assert resolve_options().hw_decoder_load == Options.hw_decoder_load == 0.9

    # the share goes to DALI's mixed (GPU) decoders only; the CPU decoder has no hardware part
    seen = []
    for name in ("image", "image_slice"):
        real = getattr(fn.decoders, name)
        monkeypatch.setattr(fn.decoders, name, lambda *a, _real=real, **kw: seen.append(kw) or _real(*a, **kw))
    for chain in (T.Compose([T.RandomResizedCrop(64), T.ToTensor()]), T.Compose([T.Resize(64), T.ToTensor()])):
        for device in ("gpu", "cpu"):
            with Pipeline(batch_size=2, num_threads=1, device_id=None):
                Lowering(build_plan(chain), "encoded", device, 0.5).graph()
    assert [kw.get("hw_decoder_load") for kw in seen] == [0.5, None, 0.5, None]
    assert [kw["device"] for kw in seen] == ["mixed", "cpu", "mixed", "cpu"]

    # and from enable() to the loader's pipelines
    dali_autoproxy.enable(device="cpu", log_level="ERROR", hw_decoder_load=0.3)
    try:
        it = iter(torch.utils.data.DataLoader(image_folder(photo_root, EVAL()), batch_size=4))
        next(it)
        assert [r.hw_decoder_load for r in it._self_runners.values()] == [0.3]
        del it
    finally:
        dali_autoproxy.disable()

def test_report_rows_and_table(photo_root, capsys):
    ds = image_folder(photo_root, EVAL())
    load_all(ds, autoproxy=True)
    rep = last_report()
    for key in ("proxied", "reason", "decode_on_dali", "worker_transforms", "dali_transforms", "device"):
        assert key in rep
    assert rep["dali_transforms"] == ["decode", "Resize", "CenterCrop", "ToTensor", "Normalize"]
    assert rep["device"] == "cpu" and rep["reason"] is None
    assert rep["samples"] == len(ds) and rep["batches"] == (len(ds) + 7) // 8
    dali_autoproxy.print_report(verbose=True)
    table = capsys.readouterr().out
    assert "proxied" in table.splitlines()[0] and "Resize, CenterCrop" in table


def test_report_is_compact_by_default_and_whole_when_verbose(photo_root):
    """The default table fits 100 columns (long reasons wrap); verbose has every column."""
    from dali_autoproxy.main.report import COLUMNS, WIDTH, format_report
    load_all(image_folder(photo_root, EVAL()), autoproxy=True)
    tf = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.RandomRotation(10)])
    load_all(image_folder(photo_root, tf), autoproxy=True)
    rows = dali_autoproxy.report()[-2:]
    compact = format_report(rows)
    assert max(map(len, compact.splitlines())) <= WIDTH, compact
    assert "RandomRotation" in compact.replace("\n", " ") and "worker_transforms" not in compact
    assert f"{rows[1]['batches']}" in compact and rows[1]["batches"] > 0
    verbose = format_report(rows, verbose=True)
    assert all(c in verbose.splitlines()[0] for c in COLUMNS) and len(verbose.splitlines()) == 4


def test_exif_rotation_is_not_applied(tmp_path):
    """PIL's loader ignores EXIF orientation; so must DALI's decoder."""
    from photos import photographs
    from PIL import Image
    d = tmp_path / "exif" / "c0"
    d.mkdir(parents=True)
    img = Image.fromarray(photographs()[0][:300, :400])
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW on display
    img.save(d / "rotated.jpg", exif=exif.tobytes(), quality=92)
    ds = image_folder(str(tmp_path / "exif"), T.Compose([T.ToTensor()]))
    ref = load_all(ds, autoproxy=False, num_workers=0, batch_size=1)
    out = load_all(ds, autoproxy=True, num_workers=0, batch_size=1)
    assert ref[0][0].shape == out[0][0].shape == (1, 3, 300, 400)
    assert float((ref[0][0] - out[0][0]).abs().mean()) * 255 < 0.5


def test_forked_worker_never_tears_down_inherited_pipelines(tmp_path):
    """Regression: a DALI pipeline left in a reference cycle (an exception's traceback can
    hold a loader) used to be collected inside a forked DataLoader worker, which then hung
    (or crashed) tearing down DALI threads that exist only in the parent."""
    script = tmp_path / "fork_gc.py"
    script.write_text(textwrap.dedent("""
        import gc, torch, torchvision.transforms as T
        from dali_autoproxy.plan.planning import build_plan
        from dali_autoproxy.backends.dali.runner import DaliRunner
        plan = build_plan(T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor()]))
        gc.disable()
        runner = DaliRunner(plan, "encoded", 8, "cpu", None)
        cycle = [runner]
        cycle.append(cycle)
        del runner, cycle

        class Collecting(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                gc.collect()  # the worker collects the garbage it inherited
                return i

        ctx = torch.multiprocessing.get_context("fork")
        loader = torch.utils.data.DataLoader(Collecting(), batch_size=4, num_workers=2, multiprocessing_context=ctx)
        print(sum(len(b) for b in loader))
    """))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split()[-1] == "8", res.stderr[-2000:]


class _BlurWithATensorRadius:
    """MSN's ``GaussianBlur`` as its ``data_manager.py`` writes it: the radius a tensor, which
    Pillow refuses (a TypeError, plain torchvision's run too)."""

    def __call__(self, img):
        from PIL import ImageFilter
        return img.filter(ImageFilter.GaussianBlur(radius=0.1 + torch.rand(1) * 1.9))


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _log_lines():
    log, handler = logging.getLogger("dali_autoproxy"), _Collect()
    log.addHandler(handler)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)


def test_a_loader_whose_code_raises_raises_plains_error_and_the_report_says_so(photo_root):
    """Plain's error type and message (in the main process: ``num_workers=0``, where the log is
    read here), the log names the step that needs the real image (not an error of the
    recording's own), and the report says what the loop got instead of a batch."""
    ds = image_folder(photo_root, T.Compose([T.RandomResizedCrop(64), _BlurWithATensorRadius(), T.ToTensor()]))
    errors = []
    for proxied in (False, True):
        with _log_lines() as lines, pytest.raises(TypeError) as info:
            load_all(ds, autoproxy=proxied, log_level="INFO", num_workers=0)
        errors.append(str(info.value).strip().splitlines()[-1])
    assert errors[0] == errors[1] and "2-item sequence" in errors[0], errors
    assert info.value.__context__ is None or "ProxySample" not in str(info.value.__context__), info.value.__context__
    text = "\n".join(lines)
    assert "needs pixels (Image.filter)" in text and "on a recording image" not in text, text
    assert "it runs in the worker; it runs in the worker" not in text, text
    rep = last_report()
    assert rep["batches"] == 0 and rep["raised"] == f"TypeError: {errors[1]}", rep
    assert "the loop got TypeError" in dali_autoproxy.format_report([rep]), rep


def test_the_log_names_the_chain_the_loop_runs(photo_root):
    """The transform replaced on ``loader.dataset`` after the DataLoader was made (DeiT's
    3-Augment): one line, at the loop, naming the chain that runs, nothing about the one
    replaced (nor ImageFolder's wrapper of it), not repeated at the second epoch."""
    import torchvision
    dali_autoproxy.enable(device="cpu", log_level="INFO")
    try:
        with _log_lines() as lines:
            ds = torchvision.datasets.ImageFolder(photo_root, T.Compose([T.RandomResizedCrop(64), T.ToTensor(),
                                                                         T.RandomErasing()]))
            loader = DataLoaderImportedEarly(ds, batch_size=4, num_workers=2)
            assert lines == []  # said when the loop starts, about what it runs
            loader.dataset.transform = T.Compose([T.RandomResizedCrop(64), T.RandomGrayscale(), T.ToTensor()])
            for _ in range(2):
                for _batch in loader:
                    pass
    finally:
        dali_autoproxy.disable()
    said = [line for line in lines if "DataLoader #" in line]
    assert len(said) == 1 and "RandomResizedCrop -> RandomGrayscale -> ToTensor" in said[0], lines
    assert not any("RandomErasing" in line or "stays in the worker" in line for line in lines), lines
