"""Spark as a user meets it: the command the demo prints runs as printed, register() points a session's workers
at this interpreter, and without Java 17 the demo and these tests say so in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mqstore.spark
import mqstore.spark.source
from mqstore.demo import TOPICS, run_demo
from mqstore.spark.env import JAVA_NOT_FOUND, java_missing
from tests.spark.conftest import REPO_ROOT

SNIPPET_TIMEOUT_S = 300  # a new JVM and Spark session on a loaded 2-core machine: about 15-60 s
SHOW_ROW = re.compile(r"^\|\s*(\S+)\|\s*(\d+)\|$", re.MULTILINE)


def user_environment(**changes) -> dict:
    """The environment of a user's shell: nothing the test session set for its own Spark, and this virtual
    environment's bin/ not on PATH (so a worker started as plain `python3` could not import mqstore)."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env.update(changes)
    return {name: value for name, value in env.items() if value is not None}


def fake_java(directory: Path, version: str) -> Path:
    """A `java` whose -version prints `version` (as a JDK does, on stderr)."""
    directory.mkdir(parents=True)
    java = directory / "java"
    java.write_text(f'#!/bin/sh\necho \'openjdk version "{version}" 2020-01-01\' >&2\n', encoding="ascii")
    java.chmod(0o755)
    return java


# --- the command the demo prints --------------------------------------------------------------------------------
def test_the_command_the_demo_prints_reads_the_store_as_printed(spark, tmp_path, capsys):
    store = tmp_path / "demo-store"
    assert run_demo(str(store), 400, spark=spark) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = lines.index("to read the store with Spark yourself (docs/spark.md explains each line):")
    command = lines[at + 1].strip()
    # Run as printed, by a shell, from another directory, without the test session's Spark settings.
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=user_environment(), capture_output=True,
                          text=True, timeout=SNIPPET_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert dict(SHOW_ROW.findall(done.stdout)) == {topic: "100" for topic in TOPICS}


def test_register_points_a_running_sessions_workers_at_this_interpreter(spark, monkeypatch):
    context = spark.sparkContext
    monkeypatch.setattr(context, "pythonExec", mqstore.spark.PYSPARK_PYTHON_DEFAULT)  # as if PYSPARK_PYTHON was unset
    monkeypatch.setattr(mqstore.spark.source, "_WORKER_PYTHON_CHOSEN", False)
    assert mqstore.spark.register(spark) is spark
    assert context.pythonExec == sys.executable
    monkeypatch.setattr(context, "pythonExec", "/opt/chosen/python")  # the user's choice is kept
    mqstore.spark.register()  # the active session
    assert context.pythonExec == "/opt/chosen/python"


# --- without Java ------------------------------------------------------------------------------------------------
def run_java_check(env: dict) -> str:
    """The check tests/spark/conftest.py and the demo use, run in a process with `env`."""
    done = subprocess.run([sys.executable, "-c", "from mqstore.spark.env import java_missing; print(java_missing())"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_java_check_with_java_hidden_or_too_old(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_java_check(user_environment(PATH=str(empty), JAVA_HOME=None)) == f"{JAVA_NOT_FOUND}: no java in PATH"
    hidden = run_java_check(user_environment(JAVA_HOME=str(empty)))  # JAVA_HOME wins over PATH, as in spark-class
    assert hidden == f"{JAVA_NOT_FOUND}: no java in JAVA_HOME={empty}"
    old = fake_java(tmp_path / "jdk11" / "bin", "11.0.2")
    assert run_java_check(user_environment(JAVA_HOME=str(old.parents[1]))) == f"{JAVA_NOT_FOUND}: {old} is Java 11"
    eight = fake_java(tmp_path / "jdk8" / "bin", "1.8.0_292")
    assert run_java_check(user_environment(PATH=str(eight.parent), JAVA_HOME=None)).endswith(f"{eight} is Java 8")
    new = fake_java(tmp_path / "jdk17" / "bin", "17.0.15")
    assert run_java_check(user_environment(PATH=str(new.parent), JAVA_HOME=None)) == "None"


@pytest.mark.long  # about 11 s: a pytest of its own; the Java check itself is tested above, in `make test`
def test_without_java_the_spark_tests_are_skipped_with_the_reason(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/spark/test_errors.py", "tests/spark/test_reader.py::test_empty_and_unwritten_stores"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S,
                          env=user_environment(PATH=str(empty), JAVA_HOME=None, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(f"{JAVA_NOT_FOUND}: no java in PATH" in line for line in skipped)
    assert re.search(r"\b1 passed\b", done.stdout)  # the reader's test that needs no JVM still ran


def test_without_java_the_demo_writes_reads_and_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert java_missing() is not None
    assert run_demo(str(tmp_path / "demo-store"), 400) == 0  # the store part passed; the line says what is missing
    captured = capsys.readouterr()
    assert "demo OK" in captured.out
    said = [line for line in captured.out.splitlines() if JAVA_NOT_FOUND in line]
    assert said == [f"spark part skipped: {JAVA_NOT_FOUND}: no java in PATH"]
    assert "Traceback" not in captured.out + captured.err and "spark:" not in captured.out


# --- one name, two readers ---------------------------------------------------------------------------------------
class FakeRegistry:
    """spark.dataSource of a session: refuses "commitlog" as Spark does when the JVM reader's jar is loaded."""

    def __init__(self, jar_loaded: bool):
        self.jar_loaded, self.registered = jar_loaded, []

    def register(self, source):
        if self.jar_loaded and source.name() == "commitlog":
            raise RuntimeError("[DATA_SOURCE_ALREADY_EXISTS] Data source 'commitlog' already exists")
        self.registered.append(source.name())


class FakeSession:
    def __init__(self, jar_loaded: bool):
        self.dataSource = FakeRegistry(jar_loaded)

    @property
    def sparkContext(self):
        raise RuntimeError("no context (as on Spark Connect)")


def test_register_gives_the_python_source_the_name_only_without_the_jar(monkeypatch, recwarn):
    monkeypatch.setattr(mqstore.spark.source, "_warned", [])
    with_jar = FakeSession(jar_loaded=True)
    assert mqstore.spark.register(with_jar) is with_jar
    assert with_jar.dataSource.registered == ["commitlog-python"] and not recwarn.list
    without = FakeSession(jar_loaded=False)
    mqstore.spark.register(without)
    mqstore.spark.register(without)  # twice: harmless, and the warning is given once
    assert without.dataSource.registered == ["commitlog-python", "commitlog"] * 2
    said = [str(w.message) for w in recwarn.list if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "did not load the JVM reader's jar" in said[0]
    assert "mqstore.spark.configure(SparkSession.builder)" in said[0]


def test_configure_without_javac_warns_and_leaves_the_builder(monkeypatch):
    from mqstore.spark import jvm

    def missing():
        raise jvm.JavacMissingError("javac not found (looked in PATH)")

    class Builder:
        _options: dict = {}

        def config(self, key, value):
            raise AssertionError("the builder must be left as it was")

    monkeypatch.setattr(jvm, "jar_path", missing)
    builder = Builder()
    with pytest.warns(RuntimeWarning, match="jar is not built .*javac not found.* will be the Python source"):
        assert mqstore.spark.configure(builder) is builder
