"""CRC-32 per call in C for record-sized and large inputs: zlib (linked by the build), ISA-L (the `isal` package's
copy, loaded with dlopen from its Python extension module: it ships no library to link) and each path of mq_crc32
(commitlog/csrc/crc32.c, the compiled core's: zlib, pclmul, vpclmul) that this CPU can run.

    .venv/bin/python bench/crc32.py            # full run (about 30 s)
    .venv/bin/python bench/crc32.py --quick    # smoke run

Compiles bench/crc32_compare.c with the machine's C compiler (-O2, as setup.py builds the module), prints two
tables of ns per call and GB/s (chained: each call waits for the previous one's value, a CRC's latency;
independent: calls that may overlap in the CPU, its throughput), timed in the process's CPU time (the machine
is shared), and writes bench/results/crc32.json (crc32_quick.json). `chosen` is the path mq_crc32 takes here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _libpython() -> list[str]:
    """Linker flags for the interpreter's library: isal's extension module needs its symbols to load at all (it
    is no library of its own), so the comparison program carries an interpreter it never starts."""
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION")
    return [f"-L{libdir}", "-Wl,--no-as-needed", f"-lpython{version}", f"-Wl,-rpath,{libdir}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a second or two")
    parser.add_argument("--out", default=None, help="result JSON path")
    args = parser.parse_args()
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        print("no C compiler", file=sys.stderr)
        return 2
    import isal.isal_zlib

    with tempfile.TemporaryDirectory() as scratch:
        program = os.path.join(scratch, "crc32_compare")
        subprocess.run([compiler, "-O2", "-std=c11", "-I", os.path.join(ROOT, "commitlog", "csrc"),
                        os.path.join(ROOT, "bench", "crc32_compare.c"),
                        os.path.join(ROOT, "commitlog", "csrc", "crc32.c"), "-lz", "-ldl", *_libpython(),
                        "-o", program],
                       check=True)
        output = subprocess.run([program, isal.isal_zlib.__file__, "0.01" if args.quick else "1"], check=True,
                                capture_output=True, text=True).stdout
    result = json.loads(output)
    functions = result["functions"]
    for kind, suffix in (("chained", "_ns"), ("independent", "_independent_ns")):
        print(f"\nns per call, {kind} (GB/s in brackets); mq_crc32 takes {result['chosen']!r} here")
        print(f"{'bytes':>8} " + " ".join(f"{name:>18}" for name in functions))
        for row in result["rows"]:
            cells = (f"{row[name + suffix]:>9.1f} ({row['bytes'] / row[name + suffix]:>5.2f})" for name in functions)
            print(f"{row['bytes']:>8}  " + " ".join(f"{cell:>18}" for cell in cells))
    result.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  machine=platform.processor() or platform.machine(),
                  command="bench/crc32.py" + (" --quick" if args.quick else ""), load_average=os.getloadavg(),
                  clock="CLOCK_PROCESS_CPUTIME_ID")
    result.pop("sink", None)
    path = args.out or os.path.join(ROOT, "bench", "results", "crc32_quick.json" if args.quick else "crc32.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
