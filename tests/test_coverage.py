"""Settings that are not translated say why; errors stay torchvision's. (Fidelity of each
transform: tests/test_catalogue.py.)"""
import pytest
import torchvision.transforms as T
from helpers import image_folder, load_all, why_not


@pytest.mark.parametrize("tf,reason", [
    (T.Compose([T.Pad(4, padding_mode="reflect"), T.ToTensor()]), "padding_mode='reflect'"),
    (T.Compose([T.RandomCrop(32, padding=4, padding_mode="edge"), T.ToTensor()]), "padding_mode='edge'"),
    (T.Compose([T.ToTensor(), T.RandomInvert()]), "on float tensors"),
    (T.Compose([T.Pad(-2), T.ToTensor()]), "negative"),
])
def test_untranslated_settings_say_why(tf, reason):
    assert reason in why_not(tf)


def test_crop_larger_than_image_raises_as_torchvision(photo_root):
    ds = image_folder(photo_root, T.Compose([T.RandomCrop(2000), T.PILToTensor()]))
    with pytest.raises(ValueError, match="Required crop size"):
        load_all(ds, autoproxy=False, num_workers=0)
    with pytest.raises(ValueError, match="Required crop size"):
        load_all(ds, autoproxy=True, num_workers=0)


def test_untranslated_colour_settings_say_why():
    for tf, reason in [
        (T.Compose([T.ToTensor(), T.RandomGrayscale(0.5)]), "on tensors"),
        (T.Compose([T.ToTensor(), T.RandomErasing(value="random")]), "normal noise"),
        (T.Compose([T.RandomErasing(), T.ToTensor()]), "float tensors only"),
        (T.Compose([T.RandomApply([T.RandomResizedCrop(64)]), T.ToTensor()]), "cannot be skipped per sample"),
        (T.Compose([T.RandomApply([T.Grayscale(1)]), T.ToTensor()]), "cannot be skipped per sample"),
        (T.Compose([T.RandomChoice([T.RandomInvert(), T.RandomSolarize(9)]), T.ToTensor()]), "picks or orders"),
        (T.Compose([T.RandomOrder([T.RandomInvert(), T.RandomSolarize(9)]), T.ToTensor()]), "picks or orders"),
    ]:
        assert reason in why_not(tf)
