"""The compiled core: one extension module, `mqstore.commitlog._native`, built from every C file in commitlog/csrc/.

pyproject.toml holds the project's metadata; this file only declares the extension, which setuptools cannot
take from pyproject.toml alone. Fuzz targets live in commitlog/csrc/fuzz/ and are not part of the module.
"""

from glob import glob

from setuptools import Extension, setup

NATIVE_SOURCES = sorted(glob("commitlog/csrc/*.c"))

setup(
    ext_modules=[
        Extension(
            "mqstore.commitlog._native",
            sources=NATIVE_SOURCES,
            depends=sorted(glob("commitlog/csrc/*.h")),
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-fno-strict-aliasing"],
        )
    ],
)
