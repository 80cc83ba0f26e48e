"""Builds the extension dsa._dsa with the project's CMake (the repository root is this folder's
parent) and packages it with dsa/*.py. Environment: DSA_CUDA=ON|OFF|AUTO (default AUTO: the CUDA
backend when nvcc is found), DSA_BUILD_DIR (default python/build/cmake), DSA_JOBS (default 2)."""

import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not (ROOT / "CMakeLists.txt").exists():
            raise RuntimeError(f"dsa: the project's CMakeLists.txt is not at {ROOT}; install from "
                               f"a checkout of dsa.cpp (pip install ./python)")
        build = pathlib.Path(os.environ.get("DSA_BUILD_DIR", HERE / "build" / "cmake")).resolve()
        build.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}", "-DDSA_PYTHON=ON", "-DDSA_TESTS=OFF",
            "-DDSA_BENCH=OFF", f"-DDSA_CUDA={os.environ.get('DSA_CUDA', 'AUTO')}",
        ]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "_dsa", "-j",
                        os.environ.get("DSA_JOBS", "2")], check=True)
        built = list((build / "python" / "dsa").glob("_dsa*.so"))
        if len(built) != 1:
            raise RuntimeError(f"dsa: expected one _dsa*.so under {build}/python/dsa, found {built}")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(ext_modules=[CMakeExtension("dsa._dsa")], cmdclass={"build_ext": CMakeBuild})
