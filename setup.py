"""Compiles the GLSL kernels to SPIR-V while the package is built (needs glslc)."""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithShaders(build_py):
    def run(self):
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.check_call([sys.executable, os.path.join(here, "shaders", "compile.py")])
        super().run()


setup(cmdclass={"build_py": BuildWithShaders})
