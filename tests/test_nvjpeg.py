"""Which nvJPEG DALI's GPU decoder gets (dali_autoproxy/nvjpeg.py): enable() loads DALI's own
before torchvision's bundled copy can take its soname. The libraries load on a machine without
a GPU too, so this runs in CI."""
import ctypes
import json
import os
import subprocess
import sys

import pytest

from dali_autoproxy.backends.dali import nvjpeg

dali_nvjpeg = nvjpeg._dali_libraries()
needs_dali_nvjpeg = pytest.mark.skipif(not dali_nvjpeg, reason="DALI's nvJPEG wheel is not installed")


def test_asking_for_a_library_loads_nothing():
    assert nvjpeg.loaded_version("libnvjpeg_not_there.so.99") is None


@needs_dali_nvjpeg
def test_enable_loads_dalis_nvjpeg_first_and_its_version_decides_region_decodes():
    code = (
        "import dali_autoproxy, sys\n"
        "from dali_autoproxy.backends.dali import nvjpeg\n"
        "soname = __import__('os').path.basename(nvjpeg._dali_libraries()[0])\n"
        "assert nvjpeg.loaded_version(soname) is None, 'loaded before enable()'\n"
        "dali_autoproxy.enable(device='gpu')\n"
        "import torchvision, torchvision.io\n"
        "maps = open('/proc/self/maps').read()\n"
        "import json; print(json.dumps([nvjpeg.loaded_version(soname), nvjpeg._dali_libraries()[0] in maps,\n"
        "                               nvjpeg.region_decode_like_libjpeg()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "DALI_AUTOPROXY"})
    assert out.returncode == 0, out.stderr
    version, mapped, region = json.loads(out.stdout)
    own = nvjpeg._version(ctypes.CDLL(dali_nvjpeg[0]))
    assert mapped and tuple(version) == own  # DALI's own library is the one its soname gives
    assert region == (tuple(version) >= nvjpeg.FANCY_REGION_DECODE)


def test_cpu_device_loads_no_nvjpeg():
    code = ("import dali_autoproxy\n"
            "dali_autoproxy.enable(device='cpu')\n"
            "print('nvjpeg' in open('/proc/self/maps').read())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
