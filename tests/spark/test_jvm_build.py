"""mqstore.spark.jvm: the JVM reader's jar is built from the sources, named by their hash and the Spark
version, added after any jars a session already lists, and a missing javac is said in plain words."""

from __future__ import annotations

import os
import zipfile

import pytest

from mqstore.spark import jvm


class FakeBuilder:
    def __init__(self, **options):
        self._options = dict(options)

    def config(self, key, value):
        self._options[key] = value
        return self


def test_configure_appends_the_jar_to_the_jars_already_set(monkeypatch):
    monkeypatch.setattr(jvm, "jar_path", lambda: "/opt/jars/mqstore-spark-jvm-x.jar")
    builder = jvm.configure(FakeBuilder(**{"spark.jars": "/a.jar,/b.jar"}))
    assert builder._options["spark.jars"] == "/a.jar,/b.jar,/opt/jars/mqstore-spark-jvm-x.jar"
    assert jvm.configure(builder)._options["spark.jars"].count("mqstore-spark-jvm-x.jar") == 1  # not twice
    assert jvm.configure(FakeBuilder())._options["spark.jars"] == "/opt/jars/mqstore-spark-jvm-x.jar"


def test_the_jar_name_follows_the_sources_and_the_spark_version(monkeypatch, tmp_path):
    assert jvm._fingerprint("4.3.0") != jvm._fingerprint("4.2.0")
    source = tmp_path / "src" / "A.java"
    source.parent.mkdir()
    source.write_text("class A {}\n")
    monkeypatch.setattr(jvm, "SOURCE_DIR", str(tmp_path / "src"))
    monkeypatch.setattr(jvm, "RESOURCE_DIR", str(tmp_path / "none"))
    before = jvm._fingerprint("4.3.0")
    source.write_text("class A { int x; }\n")
    assert jvm._fingerprint("4.3.0") != before


def test_the_built_jar_holds_the_source_and_its_service_file():
    with zipfile.ZipFile(jvm.jar_path()) as jar:
        names = set(jar.namelist())
        service = jar.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode().strip()
    assert service.splitlines() == ["io.mqstore.spark.CommitLogSource",  # "commitlog"
                                    "io.mqstore.spark.CommitLogSource$DeprecatedName"]  # "commitlog-jvm"
    assert "io/mqstore/spark/CommitLogSource.class" in names and "io/mqstore/spark/LogReader.class" in names


def test_a_missing_javac_is_said_in_plain_words(monkeypatch, tmp_path):
    monkeypatch.setattr(jvm, "BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(jvm.JavacMissingError, match="javac not found .* needs a JDK 17 or later"):
        jvm.jar_path()
    assert not list((tmp_path / "build").glob("*.jar"))


def test_a_new_build_removes_only_older_jars_left_unused(tmp_path):
    """A jar another process's session may be starting with stays; one unused for STALE_JAR_S goes."""
    kept, recent, stale = (tmp_path / f"{jvm.JAR_PREFIX}{name}.jar" for name in ("new", "recent", "stale"))
    other = tmp_path / "unrelated.jar"
    for path in (kept, recent, stale, other):
        path.write_bytes(b"PK")
    now = 2_000_000_000.0
    os.utime(recent, (now - 60, now - 60))
    os.utime(stale, (now - jvm.STALE_JAR_S - 60, now - jvm.STALE_JAR_S - 60))
    os.utime(kept, (now - jvm.STALE_JAR_S - 60, now - jvm.STALE_JAR_S - 60))  # the one being returned
    assert jvm._remove_stale_jars(str(tmp_path), keep=str(kept), now=now) == [str(stale)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (kept, recent, other))
