"""The compiled core: one extension module, `mqstore.commitlog._native`, built from every C file in commitlog/csrc/.

pyproject.toml holds the project's metadata; this file only declares the extension, which setuptools cannot
take from pyproject.toml alone. Fuzz targets live in commitlog/csrc/fuzz/ and are not part of the module.

Compiler flags: the base set below, then the hardening flags the compiler accepts (each is tried on an empty
file first, so that a compiler without one still builds the module). Two environment variables change the build:

- MQSTORE_WERROR=1: warnings are errors (CI and the make targets set it; a user's build does not, so that a newer
  compiler's new warning never stops an install);
- MQSTORE_SANITIZE=1: AddressSanitizer and UndefinedBehaviorSanitizer, -O1, signed overflow undefined again
  (-fno-wrapv: Python's own CFLAGS carry -fwrapv, which hides it from UBSan), no _FORTIFY_SOURCE (ASan checks
  those calls itself); `make test-asan` and `make fuzz-python` build this way into build/asan/.
"""

import os
import subprocess
import sysconfig
import tempfile
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_SOURCES = sorted(glob("commitlog/csrc/*.c"))
BASE_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-strict-aliasing"]
# The usual hardening of a distribution's build (Debian's and Fedora's defaults), each kept only when the compiler
# takes it. _FORTIFY_SOURCE needs optimisation, which BASE_FLAGS gives; Python's own CFLAGS may define it already.
HARDENING_FLAGS = ["-fstack-protector-strong", "-fstack-clash-protection", "-Wformat", "-Wformat-security"]
FORTIFY_FLAG = "-D_FORTIFY_SOURCE=2"
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined",
                  "-fno-wrapv", "-g", "-O1"]


def _enabled(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class HardenedBuildExt(build_ext):
    """build_ext adding the flags above that this compiler accepts."""

    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            flags = [flag for flag in HARDENING_FLAGS if self._accepts(flag)]
            if _enabled("MQSTORE_SANITIZE"):
                flags += SANITIZE_FLAGS
                link = [flag for flag in SANITIZE_FLAGS if flag.startswith("-fsanitize")]
            else:
                python_cflags = sysconfig.get_config_var("CFLAGS") or ""
                if "_FORTIFY_SOURCE" not in python_cflags + os.environ.get("CFLAGS", ""):
                    flags.append(FORTIFY_FLAG)
                link = []
            if _enabled("MQSTORE_WERROR"):
                flags.append("-Werror")
            for extension in self.extensions:
                extension.extra_compile_args = BASE_FLAGS + flags
                extension.extra_link_args = link
        super().build_extensions()

    def _accepts(self, flag: str) -> bool:
        """Whether the compiler builds an empty file with `flag` and -Werror, without a word on stderr."""
        with tempfile.TemporaryDirectory() as directory:
            source = os.path.join(directory, "empty.c")
            with open(source, "w") as file:
                file.write("int mqstore_flag_probe(void) { return 0; }\n")
            command = [*self.compiler.compiler_so, "-Werror", flag, "-c", source, "-o", source + ".o"]
            done = subprocess.run(command, capture_output=True, text=True)
            return done.returncode == 0 and not done.stderr.strip()


setup(
    ext_modules=[
        Extension(
            "mqstore.commitlog._native",
            sources=NATIVE_SOURCES,
            depends=sorted(glob("commitlog/csrc/*.h")),
            libraries=["z"],
            extra_compile_args=BASE_FLAGS,
        )
    ],
    cmdclass={"build_ext": HardenedBuildExt},
)
