"""Spark tests: one local SparkSession for the whole run, the RocketMQ fixture store, generated stores.

Without Java 17 every test that needs the session is skipped with the reason ("Java 17 not found (set
JAVA_HOME): ..."); the reader's tests that need no JVM still run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mqstore.spark.env import java_missing
from tests.conftest import FIXTURES_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_STORE = FIXTURES_DIR / "rocketmq-4.4.0-store" / "store"
FIXTURE_MANIFEST = FIXTURES_DIR / "rocketmq-4.4.0-store" / "manifest.jsonl"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
SPARK_DIR = Path(__file__).resolve().parent
_java_missing: list = []  # [reason or None], filled at the first collection


def pytest_collection_modifyitems(config, items):
    """Skip the tests here that use the `spark` session when Java 17 is not found (asked once, at collection)."""
    needing = [item for item in items if "spark" in getattr(item, "fixturenames", ())
               and SPARK_DIR in Path(str(item.fspath)).resolve().parents]
    if not needing:
        return
    if not _java_missing:
        _java_missing.append(java_missing())
    if _java_missing[0] is not None:
        skip = pytest.mark.skip(reason=_java_missing[0])
        for item in needing:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fixture_store() -> Path:
    """RocketMQ 4.4.0's store (read only: tests that write use a copy)."""
    if not FIXTURE_STORE.is_dir() or not FIXTURE_MANIFEST.is_file():
        pytest.fail(f"the RocketMQ fixture store is missing: {FIXTURE_STORE}")
    return FIXTURE_STORE.resolve()


@pytest.fixture(scope="session")
def manifest(fixture_store) -> list[dict]:
    with open(FIXTURE_MANIFEST, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(scope="session")
def spark():
    """A quiet local[2] session with the JVM reader's jar loaded (when javac is there to build it), so "commitlog"
    is the JVM reader; the Python source registered as "commitlog-python" (and as "commitlog" without the jar);
    filter pushdown enabled."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    import mqstore.spark

    builder = (SparkSession.builder.master("local[2]").appName("mqstore-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.streaming.stopTimeout", "10s")
               .config(PUSHDOWN_CONF, "true"))
    _jvm_jar.append(_configure_jvm_reader(builder))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    mqstore.spark.register(session)
    yield session
    session.stop()


_jvm_jar: list = []  # [the JVM reader's jar the session loaded, or the reason it has none]


def _configure_jvm_reader(builder) -> str:
    """Put the JVM reader's jar on the session's spark.jars (built once per run: it is cached by its hash)."""
    from mqstore.spark import jvm

    try:
        jar = jvm.jar_path()
    except jvm.JavacMissingError as exc:
        return f"no JVM reader jar: {exc}"
    jvm.configure(builder)
    return jar


@pytest.fixture
def jvm_reader(spark) -> str:
    """The format name of the JVM reader; the test is skipped when its jar could not be built (no javac)."""
    from mqstore.spark import jvm

    if not _jvm_jar or not _jvm_jar[0].endswith(".jar"):
        pytest.skip(_jvm_jar[0] if _jvm_jar else "the session has no JVM reader jar")
    return jvm.FORMAT_NAME


@pytest.fixture
def python_source(spark) -> str:
    """The format name of the Python source in the session: "commitlog-python" (registered in every session)."""
    from mqstore.spark.source import PYTHON_FORMAT_NAME

    return PYTHON_FORMAT_NAME


@pytest.fixture
def pushdown(spark):
    """Set filter pushdown on or off for one test: `pushdown(False)`; restored afterwards."""
    before = spark.conf.get(PUSHDOWN_CONF)

    def switch(enabled: bool) -> None:
        spark.conf.set(PUSHDOWN_CONF, "true" if enabled else "false")

    yield switch
    spark.conf.set(PUSHDOWN_CONF, before)
