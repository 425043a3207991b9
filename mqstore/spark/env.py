"""What a local Spark session needs from the machine before the commitlog source can be used: Java 17 or later
(Spark 4 runs on 17 and 21) and Python workers that run an interpreter which imports mqstore.

Imports nothing of pyspark, so the demo and the tests can ask before paying for it:

    java_missing()          None, or the one line to print: "Java 17 not found (set JAVA_HOME)..."
    spark_missing()         the same, and whether pyspark imports
    use_this_interpreter()  PYSPARK_PYTHON = sys.executable unless the user chose one

Java is looked up as Spark's launcher (bin/spark-class) does: $JAVA_HOME/bin/java when JAVA_HOME is set, else
`java` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

JAVA_MAJOR_MIN = 17  # Spark 4's oldest supported Java
JAVA_VERSION_TIMEOUT_S = 20  # `java -version` on a loaded 2-core machine takes under a second
JAVA_NOT_FOUND = "Java 17 not found (set JAVA_HOME)"
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def _java_command() -> tuple[str | None, str]:
    """The java Spark's launcher would run, and where it was looked for."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        path = os.path.join(java_home, "bin", "java")
        return (path if os.access(path, os.X_OK) else None), f"JAVA_HOME={java_home}"
    return shutil.which("java"), "PATH"


def java_major(java: str) -> int | None:
    """The major version `java -version` reports (1.8 -> 8), None when it does not run or says nothing known."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=JAVA_VERSION_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    found = _VERSION.search(done.stderr + done.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def java_missing() -> str | None:
    """None when a Java Spark can run on is found, else one line saying so (starting with JAVA_NOT_FOUND)."""
    java, looked_in = _java_command()
    if java is None:
        return f"{JAVA_NOT_FOUND}: no java in {looked_in}"
    major = java_major(java)
    if major is None:
        return f"{JAVA_NOT_FOUND}: {java} -version does not tell a version"
    if major < JAVA_MAJOR_MIN:
        return f"{JAVA_NOT_FOUND}: {java} is Java {major}"
    return None


def spark_missing() -> str | None:
    """Why a local Spark session cannot start here (pyspark not importable, no Java 17), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"pyspark cannot be imported ({exc}); install the project's spark extra: pip install 'mqstore[spark]'"
    return java_missing()


def use_this_interpreter() -> None:
    """Make Spark's Python workers run this interpreter (which imports mqstore), unless the user chose one.

    Read when a SparkContext starts; a running one is handled by mqstore.spark.register()."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
