"""The JVM reader of the "commitlog" format: its jar, built here from the Java sources in mqstore/spark/jvm/src.

    from pyspark.sql import SparkSession
    import mqstore.spark

    builder = SparkSession.builder.master("local[2]")
    spark = mqstore.spark.configure(builder).getOrCreate()     # adds the jar to spark.jars
    df = spark.read.format("commitlog").load("/path/to/store")
    tier = spark.read.format("commitlog").load("s3://bucket/prefix?endpoint_override=host:9000&scheme=http")

A tier URI (s3://, file://, or a scheme Hadoop's FileSystem knows) reads the store its uploader copied there, as
its manifest lists it, each task reading its byte ranges from the object store: no local copy, nothing but the
jar and the JDK's own HTTP client (docs/spark.md, "Reading a tier").

`jar_path()` compiles the sources with `javac --release 17` against the jars of the installed pyspark and packs
them, with the DataSourceRegister service file, into mqstore-spark-jvm-<hash>.jar: in mqstore/spark/jvm/build
when the package directory is writable, else in the user's cache directory ($XDG_CACHE_HOME or ~/.cache,
mqstore/). The hash covers the sources and the Spark version, so a changed source or another pyspark builds a
new jar; an unchanged one is reused. Needs a JDK (javac) 17 or later; JavacMissingError says so when it is not
found. No jar is kept in the repository. When the jar cannot be built, `configure` warns and leaves the builder
as it was, and mqstore.spark.register() gives the session the Python source under the same name
(docs/decisions/0041-one-spark-format-name.md). The jar also answers to "commitlog-jvm", this reader's name
before it took "commitlog": deprecated, kept for one release.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import warnings
import zipfile

from mqstore.spark.env import _java_command

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm", "src")
RESOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm", "resources")
BUILD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm", "build")
JAR_PREFIX = "mqstore-spark-jvm-"
JAVA_RELEASE = "17"  # Spark 4's oldest supported Java
STALE_JAR_S = 7 * 24 * 3600  # an older jar unused this long is removed when a new one is built
JAVAC_TIMEOUT_S = 600  # a cold javac on a loaded 2-core machine takes about 10 s
FORMAT_NAME = "commitlog"
DEPRECATED_FORMAT_NAME = "commitlog-jvm"  # the reader's name until it took "commitlog"; kept for one release


class JavacMissingError(RuntimeError):
    """No javac (a JDK 17 or later) was found to build the JVM reader's jar."""


def _sources() -> list[str]:
    found = glob.glob(os.path.join(SOURCE_DIR, "**", "*.java"), recursive=True)
    found += glob.glob(os.path.join(RESOURCE_DIR, "**", "*"), recursive=True)
    return sorted(p for p in found if os.path.isfile(p))


def _spark_jars() -> tuple[str, str]:
    """(pyspark's jars directory, its version)."""
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "jars"), pyspark.__version__


def _fingerprint(spark_version: str) -> str:
    digest = hashlib.sha256(f"spark {spark_version} release {JAVA_RELEASE}\n".encode())
    for path in _sources():
        digest.update(os.path.relpath(path, os.path.dirname(SOURCE_DIR)).encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(handle.read())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _build_dir() -> str:
    try:
        os.makedirs(BUILD_DIR, exist_ok=True)
        if os.access(BUILD_DIR, os.W_OK):
            return BUILD_DIR
    except OSError:
        pass
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "mqstore")
    os.makedirs(directory, exist_ok=True)
    return directory


def _javac() -> str:
    java, where = _java_command()
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(os.path.join(os.environ["JAVA_HOME"], "bin", "javac"))
    if java is not None:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(java)), "javac"))
    candidates.append(shutil.which("javac") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise JavacMissingError(f"javac not found (looked in {where} and PATH): the JVM reader of format('{FORMAT_NAME}') "
                            f"is built from Java sources and needs a JDK {JAVA_RELEASE} or later (not only a JRE); "
                            f"set JAVA_HOME to one; without it mqstore.spark.register() gives the session the "
                            f"Python source")


def jar_path() -> str:
    """The JVM reader's jar for the installed pyspark, built first when it is missing or out of date."""
    jars_dir, spark_version = _spark_jars()
    directory = _build_dir()
    jar = os.path.join(directory, f"{JAR_PREFIX}{_fingerprint(spark_version)}.jar")
    if os.path.isfile(jar):
        try:
            os.utime(jar)  # in use: another process's build keeps it (_remove_stale_jars)
        except OSError:
            pass
        return jar
    javac = _javac()
    with tempfile.TemporaryDirectory(prefix="mqstore-jvm-") as work:
        classes = os.path.join(work, "classes")
        sources = [p for p in _sources() if p.endswith(".java")]
        command = [javac, "--release", JAVA_RELEASE, "-nowarn", "-Xlint:none", "-encoding", "UTF-8",
                   "-cp", os.path.join(jars_dir, "*"), "-d", classes, *sources]
        done = subprocess.run(command, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"building the JVM reader's jar failed ({javac} exited {done.returncode}):\n"
                               f"{done.stderr or done.stdout}")
        partial = os.path.join(work, os.path.basename(jar))
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: mqstore.spark.jvm\n\n")
            for root in (classes, RESOURCE_DIR):
                for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
                    if os.path.isfile(path):
                        archive.write(path, os.path.relpath(path, root))
        shutil.copyfile(partial, jar + ".tmp")
        os.replace(jar + ".tmp", jar)  # another process building the same jar writes the same bytes
    _remove_stale_jars(directory, keep=jar)
    return jar


def _remove_stale_jars(directory: str, keep: str, now: float | None = None) -> list[str]:
    """Remove the reader's older jars (other sources, other Spark versions) unused for STALE_JAR_S: a jar that
    another process's session was configured with a moment ago stays, so that its start does not miss it."""
    now = time.time() if now is None else now
    removed = []
    for old in glob.glob(os.path.join(directory, f"{JAR_PREFIX}*.jar")):
        try:
            if old != keep and now - max(os.path.getmtime(old), os.path.getatime(old)) > STALE_JAR_S:
                os.remove(old)
                removed.append(old)
        except OSError:
            pass  # gone already, or not ours to remove
    return removed


def configure(builder):
    """Add the JVM reader's jar to a SparkSession builder's spark.jars (after any jars already set) and return
    the builder. Must be called before the session (its JVM) starts: a running session does not load jars.

    When the jar cannot be built (no javac, a failed build) this warns, saying why, and returns the builder as
    it was: mqstore.spark.register() then gives the session the Python source under the same name."""
    try:
        jar = jar_path()
    except (JavacMissingError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"mqstore.spark.configure: the JVM reader's jar is not built ({exc}); format('commitlog') "
                      f"will be the Python source", RuntimeWarning, stacklevel=2)
        return builder
    options = getattr(builder, "_options", {})
    existing = [j for j in str(options.get("spark.jars", "")).split(",") if j.strip()]
    if jar not in existing:
        existing.append(jar)
    return builder.config("spark.jars", ",".join(existing))


def main() -> int:
    """`python -m mqstore.spark.jvm` (make install): build the jar, or say in one line why it is not built."""
    from mqstore.spark.env import java_missing

    missing = java_missing()
    if missing is not None:
        print(f"JVM reader jar not built: {missing}")
        return 0
    try:
        print(f"JVM reader jar: {jar_path()}")
    except JavacMissingError as exc:
        print(f"JVM reader jar not built: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
