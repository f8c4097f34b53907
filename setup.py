"""Only here to ship dali_autoproxy.pth (the DALI_AUTOPROXY=1 start-up hook) into
site-packages, for normal and editable installs; all metadata is in setup.cfg."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "dali_autoproxy.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)


cmdclass = {"build_py": build_py_with_pth}

try:  # editable installs (PEP 660) write their own wheel: add the .pth to its root too
    from setuptools.command.editable_wheel import editable_wheel

    class editable_wheel_with_pth(editable_wheel):
        def _install_namespaces(self, installation_dir, pth_prefix):
            super()._install_namespaces(installation_dir, pth_prefix)
            shutil.copy(os.path.join(HERE, PTH), os.path.join(installation_dir, PTH))

    cmdclass["editable_wheel"] = editable_wheel_with_pth
except ImportError:  # pragma: no cover - old setuptools
    pass

setup(cmdclass=cmdclass)
