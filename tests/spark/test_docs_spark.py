"""docs/spark.md's Python examples run, in order, against the test session, and give the rows they promise."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import small_config
from tests.test_docs import python_blocks

REPO_ROOT = Path(__file__).resolve().parents[2]
ORDERS = 40
OTHERS = 10
QUEUES = 4


def _write_demo_store(root: Path) -> None:
    """A store like the demo's: JSON order bodies on `orders`, a few messages on another topic."""
    from mqstore import Message, MessageStore, PutStatus

    with MessageStore.open(str(root), small_config()) as store:
        for seq in range(ORDERS):
            body = json.dumps({"seq": seq, "amount": seq * 10}).encode()
            assert store.put(Message("orders", body, queue_id=seq % QUEUES)).status is PutStatus.PUT_OK
        for seq in range(OTHERS):
            assert store.put(Message("audit", b"event %d" % seq, queue_id=0)).status is PutStatus.PUT_OK
        store.wait_dispatched(30)


def test_spark_page_examples_run(spark, jvm_reader, tmp_path, capsys):
    """The page's blocks as one script; its relative paths become paths under the test's directory, because the
    session's JVM resolves relative paths against its own working directory, not the test's."""
    _write_demo_store(tmp_path / "demo-store")
    script = "\n".join(python_blocks((REPO_ROOT / "docs" / "spark.md").read_text(encoding="utf-8")))
    for name in ("demo-store", "out/", "chk/"):
        assert f'"{name}"' in script, f"docs/spark.md no longer uses {name!r}: update this test"
        script = script.replace(f'"{name}"', repr(str(tmp_path / name)))
    namespace: dict = {}
    exec(compile(script, "docs/spark.md", "exec"), namespace)

    shown = capsys.readouterr().out
    assert "|orders|" in shown and str(ORDERS) in shown, shown      # groupBy("topic").count().show()
    assert namespace["orders"].count() == sum(1 for seq in range(ORDERS) if seq % QUEUES in (0, 1))
    written = spark.read.parquet(str(tmp_path / "out"))
    assert written.count() == ORDERS + OTHERS                       # the availableNow stream read every record
    assert sorted(row.text for row in written.where("topic = 'audit'").collect()) == sorted(
        f"event {seq}" for seq in range(OTHERS))
    jvm_df = namespace["df"]                                       # the pushdown block's read: the JVM reader
    assert jvm_df.count() == ORDERS + OTHERS
    assert jvm_df.where("topic = 'orders'").count() == ORDERS


def test_spark_page_starts_the_session_with_the_jar_and_has_a_stream():
    blocks = python_blocks((REPO_ROOT / "docs" / "spark.md").read_text(encoding="utf-8"))
    assert any("mqstore.spark.configure(SparkSession.builder)" in block for block in blocks)
    assert any("readStream" in block for block in blocks)
    assert not any("commitlog-jvm" in block for block in blocks)  # the deprecated name is not taught
