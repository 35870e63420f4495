"""Offline `pip install --no-build-isolation ./python`: builds the extension with the project's
CMake (only the flashgrad_python target; no tests, no CLI) and packages it with the sources."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                               "-DFLASHGRAD_BUILD_TESTS=OFF", "-DFLASHGRAD_BUILD_TOOLS=OFF",
                               f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "flashgrad_python",
                               "-j", str(os.cpu_count() or 1)])
        built = glob.glob(os.path.join(build_dir, "python", "flashgrad", "_flashgrad*.so"))
        if len(built) != 1:
            raise RuntimeError(f"flashgrad: expected one built module, found {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    name="flashgrad",
    version="0.1.0",
    description="Exact, memory-efficient attention with a fused backward on CPUs",
    packages=["flashgrad", "flashgrad.torch"],
    package_dir={"": "."},
    ext_modules=[Extension("flashgrad._flashgrad", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
    zip_safe=False,
)
