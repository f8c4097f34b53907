"""Test images: real photographs from scikit-image, re-encoded as JPEG files on disk."""
from __future__ import annotations

import os
from typing import Dict, List

import numpy as np
from PIL import Image

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
CLASS_TINTS = [(1.0, 0.25, 0.25), (0.25, 1.0, 0.25), (0.25, 0.25, 1.0)]


def photographs() -> List[np.ndarray]:
    from skimage import data
    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]


def _crop_resize(img: np.ndarray, rng: np.random.Generator) -> Image.Image:
    h, w = img.shape[:2]
    s = rng.uniform(0.55, 1.0)
    ch, cw = int(h * s), int(w * s)
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    out = Image.fromarray(img[y:y + ch, x:x + cw])
    return out.resize((int(rng.integers(240, 420)), int(rng.integers(240, 420))), Image.BILINEAR)


def make_photo_folder(root: str, per_class: int = 8, extras: bool = False) -> Dict[str, str]:
    """ImageFolder of 3 classes; class c is a photo tinted towards channel c, so the label
    can be read back from the pixels after any crop or flip. With ``extras``: a grayscale
    JPEG, an RGBA PNG, a palette PNG and a CMYK JPEG (these take PIL's route)."""
    rng = np.random.default_rng(1234)
    photos = photographs()
    special = {}
    for c, tint in enumerate(CLASS_TINTS):
        d = os.path.join(root, f"class{c}")
        os.makedirs(d, exist_ok=True)
        for k in range(per_class):
            img = _crop_resize(photos[(c + k) % len(photos)], rng)
            lum = np.asarray(img.convert("L"), dtype=np.float32)
            lum = 50 + 0.8 * lum
            tinted = np.clip(lum[..., None] * np.array(tint, dtype=np.float32), 0, 255).astype(np.uint8)
            Image.fromarray(tinted).save(os.path.join(d, f"{k:03d}.jpg"), quality=int(rng.integers(85, 96)))
    if extras:
        d = os.path.join(root, "class0")
        base = _crop_resize(photos[0], rng)
        special["gray"] = os.path.join(d, "gray.jpg")
        base.convert("L").save(special["gray"], quality=90)
        special["rgba"] = os.path.join(d, "alpha.png")
        rgba = base.convert("RGBA")
        rgba.putalpha(Image.fromarray(np.tile(np.arange(base.size[0], dtype=np.uint8), (base.size[1], 1))))
        rgba.save(special["rgba"])
        special["palette"] = os.path.join(d, "palette.png")
        base.convert("P", palette=Image.ADAPTIVE).save(special["palette"])
        special["cmyk"] = os.path.join(d, "cmyk.jpg")
        base.convert("CMYK").save(special["cmyk"], quality=90)
    return special


def make_gradient_folder(root: str, n: int = 6) -> None:
    """JPEGs whose red channel encodes x and green encodes y: a crop box (and a flip) can be
    read back from the output pixels."""
    d = os.path.join(root, "class0")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    for k in range(n):
        h, w = int(rng.integers(280, 360)), int(rng.integers(380, 480))
        x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
        y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
        img = np.stack([x, y, np.full_like(x, 128)], -1).round().astype(np.uint8)
        Image.fromarray(img).save(os.path.join(d, f"{k}.jpg"), quality=95)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def to_uint8_domain(x, normalized: bool):
    """Undo Normalize and ToTensor's scaling: the image in 0..255 levels, float."""
    import torch
    x = x.float()
    if normalized:
        x = x * torch.tensor(STD).view(-1, 3, 1, 1) + torch.tensor(MEAN).view(-1, 3, 1, 1)
    if x.max() <= 1.5:
        x = x * 255
    return x


def _jpeg(img: Image.Image, **save) -> bytes:
    import io
    buf = io.BytesIO()
    img.save(buf, "JPEG", **save)
    return buf.getvalue()


def jpeg_with_thumbnail(truncate: bool = False) -> bytes:
    """A small photo whose APP1 segment carries a JPEG thumbnail (as cameras write EXIF
    thumbnails). ``truncate``: cut shortly after the scan starts, so the file's last bytes
    still hold an FF D9 marker: the thumbnail's."""
    photo = Image.fromarray(photographs()[2][:240, :320])
    thumb = _jpeg(photo.resize((80, 60)), quality=75)
    main = _jpeg(photo, quality=85)
    payload = b"Exif\x00\x00" + thumb
    app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    data = main[:2] + app1 + main[2:]
    if truncate:
        scan = data.find(b"\xff\xda", len(app1))
        data = data[:max(scan + 200, 2 + len(app1) + 3000)]
        assert data.rfind(b"\xff\xd9", len(data) - 4096) != -1  # a trailing-marker check would pass it
    return data


def odd_jpegs() -> Dict[str, bytes]:
    """JPEG variants real datasets hold: encoder options, odd sizes, extra segments."""
    from PIL import ImageCms
    photos = photographs()
    base = Image.fromarray(photos[1][:300, :400])
    odd = Image.fromarray(photos[3][:257, :333])
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    return {
        "baseline_420": _jpeg(base, quality=90),
        "progressive": _jpeg(base, quality=90, progressive=True),
        "subsampling_422": _jpeg(base, quality=90, subsampling=1),
        "subsampling_444": _jpeg(base, quality=90, subsampling=0),
        "optimized_huffman": _jpeg(base, quality=80, optimize=True),
        "quality_50": _jpeg(base, quality=50),
        "quality_100": _jpeg(base, quality=100),
        "icc_profile": _jpeg(base, quality=90, icc_profile=icc),
        "restart_markers": _jpeg(base, quality=90, restart_marker_blocks=4),
        "trailing_garbage": _jpeg(base, quality=90) + b"\x00garbage" * 64,
        "odd_size_333x257": _jpeg(odd, quality=88),
        "tiny_17x9": _jpeg(odd.resize((17, 9), Image.BILINEAR), quality=92),
        "tall_40x600": _jpeg(odd.resize((40, 600), Image.BILINEAR), quality=90),
        "grayscale": _jpeg(base.convert("L"), quality=90),
        "exif_thumbnail": jpeg_with_thumbnail(),
    }


def make_odd_jpeg_folder(root: str) -> List[str]:
    """ImageFolder of the odd JPEG set (one class); returns the names in file order."""
    d = os.path.join(root, "odd")
    os.makedirs(d, exist_ok=True)
    names = sorted(odd_jpegs().items())
    for name, data in names:
        with open(os.path.join(d, f"{name}.jpg"), "wb") as f:
            f.write(data)
    return [n for n, _ in names]
