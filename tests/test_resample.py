"""Pillow's resize in the torch stage (torch_stage/resample.py) against Pillow itself, every
pixel, the border included: the float64 products (CPU, and the fallback), the Triton kernel (in
Triton's interpreter on the CPU; compiled on the GPU), and the issue's four loaders end to end
on DALI's CPU backend."""
import json
import os
import sys

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from helpers import compile_for_a_gpu, in_tritons_interpreter, last_report, load_all
from photos import make_photo_folder, photographs
from PIL import Image

import dali_autoproxy

HERE = os.path.dirname(os.path.abspath(__file__))
FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


COMPUTED = [FILTERS[k] for k in ("bilinear", "bicubic", "box")]  # filters whose weights the kernel computes


# _batch's largest crop and output sides, the pass-order batches' and the stage's largest images
# (smaller in the interpreter, which runs every program in Python)
SIDES = {"max_side": 160, "max_out": 120, "order_side": 200, "stage_side": 300}


def _batch(rng, n, max_side=None, max_out=None, filters=tuple(FILTERS.values())):
    """n random crops of photographs (each its own size), padded into one batch, with random
    output sizes and filters (of ``filters``): (x, in_hw, out_hw, kinds, crops)."""
    max_side, max_out = max_side or SIDES["max_side"], max_out or SIDES["max_out"]
    photos = photographs()
    crops, ins, outs = [], [], []
    for b in range(n):
        img = photos[b % len(photos)]
        h, w = (int(rng.integers(2, min(max_side, s))) for s in img.shape[:2])
        t, l = int(rng.integers(0, img.shape[0] - h)), int(rng.integers(0, img.shape[1] - w))
        crops.append(np.ascontiguousarray(img[t:t + h, l:l + w]))
        ins.append((h, w))
        outs.append((int(rng.integers(1, max_out)), int(rng.integers(1, max_out))))
    x = torch.zeros(n, 3, max(i[0] for i in ins), max(i[1] for i in ins))
    for b, c in enumerate(crops):
        x[b, :, :c.shape[0], :c.shape[1]] = torch.from_numpy(c).permute(2, 0, 1).float()
    kinds = rng.choice(list(filters), n)
    return x, np.array(ins), np.array(outs), kinds, crops


def _boxes(rng, ins: np.ndarray) -> np.ndarray:
    """A random box (top, left, bottom, right: C floats) inside each input size, or the whole image."""
    start = rng.uniform(0, 0.4, ins.shape) * ins
    end = ins - rng.uniform(0, 0.4, ins.shape) * ins
    boxes = np.concatenate([start, np.maximum(end, start + 0.5)], 1).astype(np.float32).astype(np.float64)
    whole = rng.random(len(ins)) < 0.25
    return np.where(whole[:, None], np.concatenate([0 * ins, ins], 1), boxes)


def _windows(rng, outs: np.ndarray) -> np.ndarray:
    """A random window (top, left, height, width) inside each output size: a crop after the resize."""
    size = np.stack([rng.integers(1, o + 1) for o in outs.T], 1)
    start = np.stack([rng.integers(0, o - s + 1) for o, s in zip(outs.T, size.T)], 1)
    return np.concatenate([start, size], 1).astype(np.int64)


def differences_from_pillow(resize, seed: int, batches: int, n: int = 6, windowed: bool = False,
                            filters=tuple(FILTERS.values()), boxed: bool = False, **sides) -> dict:
    """Samples whose resize differs from Pillow's anywhere, of all those tried; ``windowed``: a
    random crop of each resized image folded into the resize, against Pillow's resize, then crop;
    ``boxed``: a random box of each image resized (Pillow's ``box``), most of them inside it."""
    rng = np.random.default_rng(seed)
    total = bad = 0
    for _ in range(batches):
        x, ins, outs, kinds, crops = _batch(rng, n, filters=filters, **sides)
        window = _windows(rng, outs) if windowed else None
        boxes = _boxes(rng, ins) if boxed else None
        out = resize(x, ins, outs, kinds, **({"window": window} if windowed else {}),
                     **({"boxes": boxes} if boxed else {})).cpu()
        for b in range(n):
            box = None if boxes is None else tuple(float(v) for v in boxes[b][[1, 0, 3, 2]])
            ref = np.asarray(Image.fromarray(crops[b]).resize((int(outs[b][1]), int(outs[b][0])), int(kinds[b]),
                                                              box=box))
            if windowed:
                top, left, height, width = window[b]
                ref = ref[top:top + height, left:left + width]
            oh, ow = ref.shape[:2]
            got = out[b, :, :oh, :ow].permute(1, 2, 0).numpy().astype(np.uint8)
            padding_zero = bool((out[b, :, oh:, :] == 0).all() and (out[b, :, :, ow:] == 0).all())
            total += 1
            bad += int((ref != got).any() or not padding_zero)
    return {"samples": total, "different_from_pillow": bad}


def test_float64_products_equal_pillow_on_photographs():
    from dali_autoproxy.backends.torch_stage import resample
    resample._FORCE_TORCH_OPS = True
    try:
        assert differences_from_pillow(resample.pillow_resize, 0, 20) == {"samples": 120, "different_from_pillow": 0}
        assert differences_from_pillow(resample.pillow_resize, 5, 10, windowed=True) == {
            "samples": 60, "different_from_pillow": 0}
    finally:
        resample._FORCE_TORCH_OPS = False


@pytest.mark.parametrize("computed_on_the_device", [True, False], ids=["device_ops", "host"])
def test_kept_tables_are_pillows(computed_on_the_device):
    """The tables the Triton kernel reads, kept in flat buffers (computed by the device's float64
    ops as on the GPU, or on the host for LANCZOS/HAMMING/NEAREST), key by key equal to the host's
    transcription of precompute_coeffs (itself checked against Pillow above), across a growth of
    the buffers and a start-over past the limit."""
    from dali_autoproxy.backends.torch_stage import kept_tables as K
    from dali_autoproxy.backends.torch_stage import pillow_weights as W
    rng = np.random.default_rng(4)
    store = K.KeptTables(torch.device("cpu"))
    store.COMPUTED_ON = ("cpu",) if computed_on_the_device else ()
    store.LIMIT = 600_000
    asked = set()
    for _ in range(12):
        keys = [(int(n), 0.0, float(n), int(o), int(k)) for n, o, k in
                zip(rng.integers(1, 700, 40), rng.integers(1, 300, 40), rng.choice([0, 1, 2, 3, 4, 5], 40))]
        keys += [(400, float(np.float32(rng.uniform(0, 50))), float(np.float32(rng.uniform(100, 400))), 224, 3)]
        asked.update(keys)
        where = store.locate(keys)
        for key, (f_at, w_at, taps, out) in zip(keys, where.T):
            first, weights = W.axis_weights(*key)
            assert out == len(first) and taps == weights.shape[1]
            assert (store.first[f_at:f_at + out].numpy() == first).all()
            assert (store.weights[w_at:w_at + out * taps].numpy() == weights.ravel()).all()
    assert len(store.where) < len(asked)  # it started over (12 x ~100k weights asked), and stayed right


def test_a_whole_images_tables_come_with_every_size_up_to_a_multiple():
    """A batch missing many whole images' tables at one output size and filter brings their
    siblings (every input size up to a multiple of SIBLINGS), computed together, each equal to
    Pillow's; a batch of other crop sizes then computes nothing. A few misses bring none, but
    one past a family grows it."""
    from dali_autoproxy.backends.torch_stage import kept_tables as K
    from dali_autoproxy.backends.torch_stage import pillow_weights as W
    store = K.KeptTables(torch.device("cpu"))
    store.COMPUTED_ON = ("cpu",)
    store.locate([(300, 0.0, 300.0, 224, 2), (30, 0.0, 30.0, 341, 2)])
    assert len(store.where) == 2  # a few misses at an output size and filter: only the keys asked
    store.locate([(n, 0.0, float(n), 224, 2) for n in range(10, 10 + store.SIBLINGS_AFTER)])
    assert len(store.where) == store.SIBLINGS + 2  # 1..256 at 224, 300 and the one at 341
    keys = [(n, 0.0, float(n), 224, 2) for n in range(1, store.SIBLINGS + 1)]
    computed = store.n_weights
    where = store.locate(keys)
    assert store.n_weights == computed
    store.locate([(400, 0.0, 400.0, 224, 2)])  # one miss past a family: the family grows to the next multiple
    assert (511, 0.0, 511.0, 224, 2) in store.where and (513, 0.0, 513.0, 224, 2) not in store.where
    keys += [(n, 0.0, float(n), 224, 2) for n in (257, 300, 400, 512)]
    where = store.locate(keys)
    for key, (f_at, w_at, taps, out) in zip(keys, where.T):
        first, weights = W.axis_weights(*key)
        assert out == len(first) and taps == weights.shape[1]
        assert (store.first[f_at:f_at + out].numpy() == first).all()
        assert (store.weights[w_at:w_at + out * taps].numpy() == weights.ravel()).all()


def test_rows_located_by_their_codes_are_where_the_keys_are():
    """``locate_rows`` (a sorted search of whole images' codes, or the keys one by one where a
    box is not the whole image or a key is new) gives what ``locate`` gives, key by key, across
    new keys, old ones and a start-over."""
    from dali_autoproxy.backends.torch_stage import kept_tables as K
    rng = np.random.default_rng(8)
    store = K.KeptTables(torch.device("cpu"))
    store.COMPUTED_ON = ("cpu",)
    store.LIMIT = 400_000
    for _ in range(10):
        n = rng.integers(1, 600, 64).astype(np.float64)
        rows = np.stack([n, 0 * n, n, rng.integers(1, 300, 64), rng.choice([0, 2, 3, 4], 64)], 1)
        if rng.uniform() < 0.3:
            rows[0, 1:3] = [1.5, 50.25]  # a box: the keys one by one
        for batch in (rows, rows[::-1].copy(), rows[:5]):  # new, then kept
            got = store.locate_rows(batch).where
            keys = [(int(a), float(b), float(c), int(d), int(e)) for a, b, c, d, e in batch.tolist()]
            assert (got == store.locate(keys)).all()


def test_kept_tables_shared_by_threads_stay_right():
    """Three loaders' pipeline threads asking one store for new and shared keys at once (the
    buffers grown and started over past a small limit): every key's table is where the store says,
    in the buffers it handed over with the offsets."""
    import threading

    from dali_autoproxy.backends.torch_stage import kept_tables as K
    from dali_autoproxy.backends.torch_stage import pillow_weights as W
    store = K.KeptTables(torch.device("cpu"))
    store.COMPUTED_ON = ("cpu",)
    store.LIMIT = 300_000
    errors = []

    def ask(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            keys = [(int(n), 0.0, float(n), int(o), int(k)) for n, o, k in
                    zip(rng.integers(1, 400, 16), rng.integers(1, 200, 16), rng.choice([0, 2, 3, 4, 5], 16))]
            tables = store.located(keys)
            for key, (f_at, w_at, taps, out) in zip(keys, tables.where.T):
                first, weights = W.axis_weights(*key)
                if not ((tables.first[f_at:f_at + out].numpy() == first).all()
                        and (tables.weights[w_at:w_at + out * taps].numpy() == weights.ravel()).all()):
                    errors.append(key)
    threads = [threading.Thread(target=ask, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_pass_order_follows_pillow():
    """Pillow 13 resizes vertically first when the height shrinks by more than twice as many
    pixels as the width; the two orders round differently, so the rule is checked on a case
    where they disagree."""
    import PIL

    from dali_autoproxy.backends.torch_stage.resample import vertical_first
    order = vertical_first(np.array([[300, 200], [300, 200]]), np.array([[50, 190], [290, 100]]))
    assert list(order) == ([True, False] if int(PIL.__version__.split(".")[0]) >= 13 else [False, False])


def _triton_resize(x, ins, outs, kinds, window=None, boxes=None):
    """The Triton passes on the batch as the torch stage hands it over: DALI's uint8 HWC, permuted."""
    from dali_autoproxy.backends.torch_stage import _triton_resample, fused_resize
    as_dali_made_it = x.to(torch.uint8).permute(0, 2, 3, 1).contiguous().to(DEVICE).permute(0, 3, 1, 2)
    if boxes is None:
        boxes = np.concatenate([0 * ins, ins], 1).astype(np.float64)
    return fused_resize.two_passes(_triton_resample, as_dali_made_it, ins, outs, kinds, boxes, window)


def pass_order_differences(seed: int = 5, filters=tuple(FILTERS.values())) -> dict:
    """Pillow 13's pass order forced on, whatever Pillow is installed: a batch whose samples all
    resize vertically first, one all horizontally first, one with both; per batch, whether all
    and whether any go vertically first, and the values where the Triton passes (each with a
    window) differ from the torch ops. Each order's columns are checked on any Pillow."""
    from dali_autoproxy.backends.torch_stage import pillow_weights, resample
    rng, out = np.random.default_rng(seed), {}
    saved, pillow_weights.ORDERS_PASSES = pillow_weights.ORDERS_PASSES, True
    try:
        for name, rows_first in (("vertical first", [True] * 6), ("horizontal first", [False] * 6),
                                 ("both", [True, False] * 3)):
            x, ins, _, kinds, _ = _batch(rng, 6, max_side=SIDES["order_side"], filters=filters)
            outs = np.array([_shrinking(h, w) if first else _shrinking(w, h)[::-1]
                             for (h, w), first in zip(ins.tolist(), rows_first)])
            order = resample.vertical_first(ins, outs)
            window = _windows(rng, outs)
            resample._FORCE_TORCH_OPS = True
            try:
                want = resample.pillow_resize(x, ins, outs, kinds, window=window)
            finally:
                resample._FORCE_TORCH_OPS = False
            got = _triton_resize(x, ins, outs, kinds, window=window).cpu()
            out[name] = [bool(order.all()), bool(order.any()), int((want != got).sum()) + int(want.shape != got.shape)]
    finally:
        pillow_weights.ORDERS_PASSES = saved
    return out


def _shrinking(h: int, w: int):
    """An output size (height, width) of an h x w image that shrinks its height by more than
    twice as many pixels as its width (Pillow 13 resizes it vertically first)."""
    shrink = h - max(1, h // 4)
    return h - shrink, max(1, w - shrink // 3)


PASS_ORDERS = {"vertical first": [True, True, 0], "horizontal first": [False, False, 0], "both": [False, True, 0]}


I = T.InterpolationMode
STAGE_CHAINS = {  # chains whose end the second pass does (flips, ToFloat, Normalize), and one it cannot
    "train": lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]),
    "eval": lambda: T.Compose([T.Resize(72), T.CenterCrop(64), T.RandomVerticalFlip(), T.ToTensor(),
                               T.Normalize([0.5], [0.25])]),
    "v2 multiply": lambda: v2.Compose([v2.RandomResizedCrop(48, antialias=True), v2.RandomHorizontalFlip(),
                                       v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                                       v2.Normalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.4])]),
    "own sizes, uint8": lambda: T.Compose([T.Resize(40), T.RandomHorizontalFlip(), T.PILToTensor()]),
    "bicubic, two flips": lambda: T.Compose([T.RandomResizedCrop(56, interpolation=I.BICUBIC),
                                             T.RandomHorizontalFlip(), T.RandomHorizontalFlip(),
                                             T.RandomVerticalFlip(), T.ToTensor()]),
    "lanczos (tables)": lambda: T.Compose([T.Resize(72, interpolation=I.LANCZOS), T.CenterCrop(64),
                                           T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5], [0.25])]),
    "colour after": lambda: T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                                       T.ColorJitter(0.4, 0.4), T.ToTensor()]),
}


def stage_differences(device: str, seed: int = 0, n: int = 10) -> dict:
    """Per chain, the values where the torch stage with the fused resize (Triton) differs from
    the same stage as torch ops on the CPU, on photographs padded into DALI's hand-over."""
    from dali_autoproxy.backends.torch_stage import TorchStage, fused_color, resample
    from dali_autoproxy.plan.ir import PillowResize, split_at_takeover
    from dali_autoproxy.plan.planning import build_plan
    from dali_autoproxy.plan.settings import SETTINGS
    rng, photos, out = np.random.default_rng(seed), photographs(), {}
    for name, chain in STAGE_CHAINS.items():
        SETTINGS["resize"] = "pillow"
        try:
            plan = build_plan(chain())
        finally:
            SETTINGS["resize"] = "dali"
        ops = split_at_takeover(plan.ops)[1]
        assert type(ops[0]) is PillowResize, ops
        torch.manual_seed(seed)
        sizes = [(int(rng.integers(60, SIDES["stage_side"])), int(rng.integers(60, SIDES["stage_side"])))
                 for _ in range(n)]
        params = np.array([plan.draw(h, w) for h, w in sizes])
        resize = ops[0]
        ins = params[:, resize.span("in_height", "in_width")].astype(np.int64)
        x = torch.zeros((n, int(ins[:, 0].max()), int(ins[:, 1].max()), 3), dtype=torch.uint8)
        for b, (h, w) in enumerate(ins.tolist()):
            photo = photos[b % len(photos)]
            x[b, :h, :w] = torch.from_numpy(photo[:h, :w].copy())
        resample._FORCE_TORCH_OPS = True
        try:
            want = TorchStage(ops)(x, params)
        finally:
            resample._FORCE_TORCH_OPS = False
        out[name] = 0
        for _ in range(3 if device == "cuda" else 1):  # on the GPU: launched directly, then replayed graphs
            got = TorchStage(ops)(x.to(device), params)
            assert fused_color._STATE["usable"] is not False, "the Triton kernel failed: the torch ops ran instead"
            pairs = list(zip(want, got)) if isinstance(want, list) else [(want, got)]
            out[name] += sum(int((a != b.cpu()).sum()) + int(a.dtype != b.dtype) + int(a.shape != b.shape)
                             for a, b in pairs)
    return out


DEVICE = "cpu"


@pytest.mark.slow
def test_triton_kernel_in_tritons_interpreter_equals_pillow():
    """The kernel against Pillow, and the stage with it (the chain's end folded into the second
    pass) against the stage as torch ops: every value equal, in Triton's interpreter."""
    assert in_tritons_interpreter(__file__) == {"samples": 12, "different_from_pillow": 0,
                                                "windowed": {"samples": 12, "different_from_pillow": 0},
                                                "computed": COMPUTED_CASES["interpreter"],
                                                "boxed, windowed": {"samples": 12, "different_from_pillow": 0},
                                                "stage": {name: 0 for name in STAGE_CHAINS},
                                                "pass orders": PASS_ORDERS, "pass orders, computed": PASS_ORDERS}


def computed_differences(batches: int, **sides) -> dict:
    """The kernel that computes its weights (every filter of the batch one of COMPUTED): whole
    images, windows, and boxes (Pillow's ``box``) with windows, against Pillow."""
    return {case: differences_from_pillow(_triton_resize, seed, batches, windowed=windowed, filters=COMPUTED,
                                          boxed=boxed, **sides)
            for case, seed, windowed, boxed in (("whole", 21, False, False), ("windowed", 22, True, False),
                                                ("boxed, windowed", 23, True, True))}


COMPUTED_CASES = {where: {case: {"samples": 6 * n, "different_from_pillow": 0}
                          for case in ("whole", "windowed", "boxed, windowed")}
                  for where, n in (("interpreter", 1), ("gpu", 30))}


def test_resample_kernels_compile_for_a_gpu_in_every_variant():
    """Every constexpr variant the stage launches type-checks in Triton's compiler (the interpreter
    checks no types: a float32 source once compiled nowhere but on a GPU, at its first batch)."""
    pytest.importorskip("triton")
    import itertools

    from dali_autoproxy.backends.torch_stage import _triton_resample as kernels
    from dali_autoproxy.backends.torch_stage.fused_resize import META
    args = {"block": "*i64", "mean": "*fp32", "std": "*fp32", "C": "i32", "n_b": "i32", "scale": "fp32"}
    failed = []
    for src_float, dst_float, affine, normalize in itertools.product((False, True), (False, True), (0, 1, 2),
                                                                     (False, True)):
        common = dict(SRC_FLOAT=src_float, DST_FLOAT=dst_float, AFFINE=affine, NORMALIZE=normalize, META=META,
                      BLOCK_O=32, BLOCK_A=32)
        variants = [(kernels.resample_pass, common)] + [
            (kernels.resample_computed, dict(common, PASS=p, K=9 + 4 * windowed + 2, WINDOWED=windowed,
                                             ORDERS=True, N_FLIP_X=1, N_FLIP_Y=1))
            for p, windowed in itertools.product((0, 1), (False, True))]
        for kernel, constants in variants:
            try:
                compile_for_a_gpu(kernel, args, constants)
            except Exception as exc:  # the compiler's error names the line; keep the variant and the cause
                cause = exc.__cause__ or exc
                failed.append((kernel.fn.__name__, constants, f"{type(cause).__name__}: {cause}"[-300:]))
    assert failed == []


@pytest.mark.gpu
def test_triton_kernel_on_the_gpu_equals_pillow():
    """Compiled, launched directly and replayed from CUDA graphs (every batch of a shape after
    its first: more batches than graphs, so each graph's buffers are refilled)."""
    from dali_autoproxy.backends.torch_stage import fused_resize
    global DEVICE
    DEVICE = "cuda"
    replays = fused_resize.GRAPHS.replays
    try:
        assert differences_from_pillow(_triton_resize, 2, 30) == {"samples": 180, "different_from_pillow": 0}
        assert fused_resize.GRAPHS.replays - replays >= 20, "the batches were not replayed from graphs"
        assert differences_from_pillow(_triton_resize, 3, 30, windowed=True) == {
            "samples": 180, "different_from_pillow": 0}
        assert computed_differences(30) == COMPUTED_CASES["gpu"]
        assert differences_from_pillow(_triton_resize, 24, 20, windowed=True, boxed=True) == {
            "samples": 120, "different_from_pillow": 0}  # every filter: most from the tables
        assert stage_differences("cuda", n=64) == {name: 0 for name in STAGE_CHAINS}
        assert pass_order_differences() == PASS_ORDERS
        assert pass_order_differences(filters=COMPUTED) == PASS_ORDERS
    finally:
        DEVICE = "cpu"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_first_batch_does_not_wait_for_the_compiler(device, monkeypatch):
    """The product's stages compile their Triton kernels behind the first batch: on a GPU the
    first call starts a thread that launches them on a copy, and the batches take the torch ops
    until it ends, then the kernels; a later stage of the same ops (the next loader's) starts no
    thread. Every batch equals the torch ops' result on the CPU, before and after; no kernel
    failed. On the CPU backend (no Triton there) nothing is started. A stage with colour maths
    (whose CUDA torch ops may round otherwise than the kernels) waits for them."""
    from dali_autoproxy.backends import torch_stage
    from dali_autoproxy.backends.torch_stage import TorchStage, fused_color
    from dali_autoproxy.plan.ir import split_at_takeover
    from dali_autoproxy.plan.planning import build_plan
    from dali_autoproxy.plan.settings import SETTINGS
    monkeypatch.setattr(torch_stage, "_COMPILED", set())  # as in a process that has compiled none
    SETTINGS["resize"] = "pillow"
    try:
        plan = build_plan(STAGE_CHAINS["train"]())
        colour = split_at_takeover(build_plan(STAGE_CHAINS["colour after"]()).ops)[1]
    finally:
        SETTINGS["resize"] = "dali"
    assert not TorchStage(colour, compile_behind=True).compile_behind
    ops = split_at_takeover(plan.ops)[1]
    torch.manual_seed(3)
    photo = photographs()[0]
    batches = []
    for k in range(4):
        params = np.array([plan.draw(120, 160) for _ in range(6)])
        x = torch.from_numpy(np.ascontiguousarray(photo[:120, :160])).unsqueeze(0).repeat(6, 1, 1, 1)
        batches.append((x.roll(k, dims=2), params))
    want = [TorchStage(ops)(x, params) for x, params in batches]
    stage = TorchStage(ops, compile_behind=True)
    got = [stage(batches[0][0].to(device), batches[0][1])]
    if device == "cpu":
        assert stage.compiling is None
    else:
        assert stage.compiling is not None and stage.compiling.name == "dali_autoproxy-triton-compile"
        got.append(stage(batches[1][0].to(device), batches[1][1]))  # the torch ops, or the kernels if compiled
        stage.compiling.join(120)
        assert not stage.compiling.is_alive() and fused_color._STATE["usable"] is True
        later = TorchStage(ops, compile_behind=True)
        assert torch.equal(later(batches[0][0].to(device), batches[0][1]).cpu(), want[0])
        assert later.compiling is None
    got += [stage(x.to(device), params) for x, params in batches[len(got):]]
    for a, b in zip(want, got):
        assert torch.equal(a, b.cpu())


def test_only_batches_of_bounded_size_take_the_torch_ops_while_kernels_compile():
    """A train batch of photographs (128 x 500 x 400) takes the torch ops while the kernels compile;
    one of large photos (128 x 2000 x 1500, a float64 copy of 9 GB) waits for the kernels."""
    from dali_autoproxy.backends.torch_stage import torch_ops_fit
    one = torch.zeros((1, 1, 1, 1), dtype=torch.uint8)
    assert torch_ops_fit(one.expand(128, 500, 400, 3))
    assert not torch_ops_fit(one.expand(128, 2000, 1500, 3))
    assert not torch_ops_fit([one[0].expand(2000, 1500, 3)] * 64 + [one[0].expand(20, 30, 3)] * 64)
    assert torch_ops_fit([one[0].expand(500, 400, 3), one[0].expand(300, 450, 3)] * 64)


@pytest.mark.gpu
def test_graphs_shared_by_threads_stay_right(monkeypatch):
    """Three pipeline threads, each on its own stream, resizing batches of the same shapes at
    once (so replaying the same graphs, their buffers refilled in turn; weights from tables and
    computed): every batch equals the same batch resized alone."""
    import threading

    from dali_autoproxy.backends.torch_stage import _triton_resample, fused_resize
    from dali_autoproxy.backends.torch_stage.launch_graphs import LaunchGraphs
    graphs = LaunchGraphs("exact resize")
    monkeypatch.setattr(fused_resize, "GRAPHS", graphs)
    rng = np.random.default_rng(11)
    batches = [_batch(rng, 6, filters=COMPUTED if k % 2 else tuple(FILTERS.values()))[:4] for k in range(6)]

    def resize(x, ins, outs, kinds):
        boxes = np.concatenate([0 * ins, ins], 1).astype(np.float64)
        return fused_resize.two_passes(_triton_resample, x.to(torch.uint8).cuda(), ins, outs, kinds,
                                       boxes)
    want = [resize(*b).cpu() for b in batches]  # each shape's first batch: launched directly
    wrong, replays = [], graphs.replays

    def pipeline_thread():
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(8):
                got = [resize(*b) for b in batches]
                wrong.extend(k for k, (g, w) in enumerate(zip(got, want)) if not torch.equal(g.cpu(), w))
    threads = [threading.Thread(target=pipeline_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert graphs.replays - replays == 3 * 8 * len(batches)


def _training_loop(stop, errors, draws):
    """A training loop's thread: synchronizes the device, empties torch's cache and draws from
    torch's CUDA generator (dropout), over and over."""
    while not stop.is_set():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            draws.append(torch.randn(64, device="cuda").cpu())
        except Exception as exc:  # noqa: BLE001 - what the loop would have raised
            errors.append(f"{type(exc).__name__}: {exc}"[:200])


@pytest.mark.gpu
def test_a_loop_that_synchronizes_and_draws_while_graphs_are_captured(monkeypatch):
    """CUDA forbids a device-wide synchronize while a stream captures, and loses the capture: the
    loop's torch.cuda.synchronize and empty_cache wait for a capture in progress instead. The
    captures leave torch's CUDA generator alone: the loop's draws are the ones it makes without
    the stage, and so is its next draw after the graphs' replays."""
    import threading

    from dali_autoproxy.backends.torch_stage import _triton_resample, fused_resize
    from dali_autoproxy.backends.torch_stage.launch_graphs import LaunchGraphs
    graphs = LaunchGraphs("exact resize")
    monkeypatch.setattr(fused_resize, "GRAPHS", graphs)
    rng = np.random.default_rng(12)
    batches = [_batch(rng, 4, max_side=40 + 8 * k)[:4] for k in range(12)]
    stop, errors, draws = threading.Event(), [], []
    torch.manual_seed(7)
    loop = threading.Thread(target=_training_loop, args=(stop, errors, draws))
    loop.start()
    try:
        for _ in range(3):  # first batch of a shape launched, the next ones captured, then replayed
            for x, ins, outs, kinds in batches:
                boxes = np.concatenate([0 * ins, ins], 1).astype(np.float64)
                fused_resize.two_passes(_triton_resample, x.to(torch.uint8).cuda(), ins, outs, kinds, boxes)
        torch.cuda.synchronize()
    finally:
        stop.set()
        loop.join()
        dali_autoproxy.disable()
    after = torch.randn(64, device="cuda").cpu()
    assert errors == [] and graphs.enabled and graphs.replays >= len(batches), (errors[:3], graphs.replays)
    torch.manual_seed(7)
    plain = [torch.randn(64, device="cuda").cpu() for _ in range(len(draws) + 1)]
    assert draws and all(torch.equal(a, b) for a, b in zip(draws + [after], plain))


def test_device_wide_syncs_wait_for_a_capture_in_progress():
    """CPU twin (no capture here): while enabled, once the stage has captured, torch.cuda's
    synchronize and empty_cache are the ledger's, wait while a capture holds the lock, and
    disable() gives the originals back."""
    import threading

    from dali_autoproxy.backends.torch_stage import launch_graphs
    from dali_autoproxy.patches import ledger
    originals = [getattr(torch.cuda, name) for name in launch_graphs.DEVICE_WIDE_SYNCS]
    dali_autoproxy.enable(device="cpu")
    try:
        launch_graphs.hold_device_syncs_during_captures()
        assert {"synchronize", "empty_cache"} <= {p.rsplit(".", 1)[1] for p in ledger.patched()}
        returned = threading.Event()

        def loop():
            try:
                torch.cuda.synchronize()  # raises here, without CUDA, once it gets the lock
            except Exception:  # noqa: BLE001
                pass
            returned.set()
        with launch_graphs.CAPTURING:
            thread = threading.Thread(target=loop)
            thread.start()
            assert not returned.wait(0.3), "synchronize ran while a capture held the lock"
        assert returned.wait(10)
        thread.join()
    finally:
        dali_autoproxy.disable()
    assert [getattr(torch.cuda, name) for name in launch_graphs.DEVICE_WIDE_SYNCS] == originals


@pytest.fixture(scope="module")
def photos_33(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("photos33"))
    make_photo_folder(root, per_class=11)
    return root



@pytest.mark.parametrize("name,chain", [
    ("RandomResizedCrop(224)", [T.RandomResizedCrop(224)]),
    ("RandomResizedCrop(64)", [T.RandomResizedCrop(64)]),
    ("RandomResizedCrop(96) bicubic", [T.RandomResizedCrop(96, interpolation=I.BICUBIC)]),
    ("RandomResizedCrop(96) nearest", [T.RandomResizedCrop(96, interpolation=I.NEAREST)]),
    ("Resize(224), CenterCrop(224)", [T.Resize(224), T.CenterCrop(224)]),
    ("Resize(64), CenterCrop(64)", [T.Resize(64), T.CenterCrop(64)]),
    ("Resize(150), CenterCrop(200) (padded)", [T.Resize(150), T.CenterCrop(200)]),
    ("Resize((400, 500)) upscaled", [T.Resize((400, 500))]),
    ("Resize(150, max_size=200), CenterCrop(140)", [T.Resize(150, max_size=200), T.CenterCrop(140)]),
    ("RandomGrayscale, RandomResizedCrop(96)", [T.RandomGrayscale(0.5), T.RandomResizedCrop(96)]),
    ("RandomResizedCrop(96), RandAugment", [T.RandomResizedCrop(96), T.RandAugment()]),
    ("RandomResizedCrop(96), TrivialAugmentWide", [T.RandomResizedCrop(96), T.TrivialAugmentWide()]),
    ("v2: RandomResizedCrop(96), flip, TrivialAugmentWide", [v2.RandomResizedCrop(96), v2.RandomHorizontalFlip(),
                                                             v2.TrivialAugmentWide()]),
])
def test_resized_loaders_equal_plain_torchvision_border_included(photos_33, name, chain):
    """resize="pillow": the four loaders of the resampling issue and the chains around them,
    same seed and draws: 0 levels anywhere, and the policies after the crop exact too."""
    last = v2.PILToTensor() if name.startswith("v2") else T.PILToTensor()
    compose = v2.Compose if name.startswith("v2") else T.Compose
    ds = torchvision.datasets.ImageFolder(photos_33, compose(chain + [last]))
    kw = dict(seed=11, shuffle=True, batch_size=8)
    ref = load_all(ds, autoproxy=False, **kw)
    out = load_all(ds, autoproxy=True, resize="pillow", **kw)
    rep = last_report()
    assert rep["proxied"] and rep["decode_on_dali"] and not rep["partial"], rep
    assert sum(len(y) for _, y in out) >= 32
    for (a, la), (b, lb) in zip(ref, out):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_the_option_is_validated_and_reaches_the_plan(monkeypatch):
    from dali_autoproxy.config import resolve_options
    from dali_autoproxy.plan.ir import PillowResize, Resize
    from dali_autoproxy.plan.planning import build_plan
    assert resolve_options(environ={}).resize == "pillow"
    assert resolve_options(environ={"DALI_AUTOPROXY_RESIZE": "dali"}).resize == "dali"
    with pytest.raises(ValueError, match="DALI_AUTOPROXY_RESIZE='exact'.*dali, pillow"):
        resolve_options(environ={"DALI_AUTOPROXY_RESIZE": "exact"})
    import dali_autoproxy
    chain = T.Compose([T.RandomResizedCrop(32), T.ToTensor()])
    try:
        dali_autoproxy.enable(device="cpu", resize="dali")
        assert Resize in [type(op) for op in build_plan(chain).ops]
    finally:
        dali_autoproxy.disable()
    assert PillowResize in [type(op) for op in build_plan(chain).ops]  # disable() restores the default


def test_spawned_workers_plan_with_the_main_process_options(photo_root):
    """Spawn and forkserver workers start from the defaults: the options reach them through the
    loader's worker_init_fn, so they plan what the main process planned (one pipeline)."""
    chain = T.Compose([T.RandomResizedCrop(48), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.PILToTensor()])
    ds = torchvision.datasets.ImageFolder(photo_root, chain)
    for fidelity, resize in (("fast", "dali"), ("exact", "pillow")):
        load_all(ds, autoproxy=True, fidelity=fidelity, resize=resize, multiprocessing_context="spawn")
        rep = last_report()
        assert rep["proxied"] and rep["dali_transforms"].count("ColorJitter") == 1, rep  # no second plan


if __name__ == "__main__":  # the interpreter test's subprocess
    DEVICE = sys.argv[1]
    SIDES.update(max_side=90, max_out=70, order_side=90, stage_side=96)
    from dali_autoproxy.backends.torch_stage.kept_tables import KeptTables
    KeptTables.COMPUTED_ON = ("cuda", "cpu")  # new tables computed by the device's torch ops, as on the GPU
    from dali_autoproxy.backends.torch_stage import _triton_resample, resample
    resample._triton_kernel = lambda x: _triton_resample  # the interpreted kernels on the CPU
    print(json.dumps(dict(differences_from_pillow(_triton_resize, 1, 2),
                          windowed=differences_from_pillow(_triton_resize, 6, 2, windowed=True),
                          computed=computed_differences(1, max_side=64, max_out=48),
                          stage=stage_differences("cpu", n=2),
                          **{"boxed, windowed": differences_from_pillow(_triton_resize, 24, 2, windowed=True,
                                                                        boxed=True)},
                          **{"pass orders": pass_order_differences(),
                             "pass orders, computed": pass_order_differences(filters=COMPUTED)})))
