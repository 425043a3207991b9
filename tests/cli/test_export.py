"""`mqstore export`: Parquet, Arrow IPC and CSV files of a store's records, filtered like store.scan()."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqstore.store.scan import scan_store
from tests.cli.conftest import MESSAGES_PER_QUEUE, QUEUE_COUNT, TOPIC, body


def test_parquet_and_arrow_files_hold_the_scan(mqstore, store_dir, tmp_path):
    whole = scan_store(store_dir).read_all()
    run = mqstore("export", store_dir, tmp_path / "all.parquet", "--json")
    assert run.code == 0, run.err
    assert run.json()["rows"] == whole.num_rows == QUEUE_COUNT * MESSAGES_PER_QUEUE + 1
    assert pq.read_table(tmp_path / "all.parquet").equals(whole)
    run = mqstore("export", store_dir, tmp_path / "one.arrow", "--topic", TOPIC, "--queue", "1",
                  "--columns", "queue_offset,body")
    assert run.code == 0 and "rows written" in run.out
    table = pa.ipc.open_file(tmp_path / "one.arrow").read_all()
    assert table.column_names == ["queue_offset", "body"]
    assert sorted(zip(table.column("queue_offset").to_pylist(), table.column("body").to_pylist())) == [
        (i, body(1, i)) for i in range(MESSAGES_PER_QUEUE)]


def test_csv_has_hex_bodies_joined_keys_and_json_properties(mqstore, store_dir, tmp_path):
    out = tmp_path / "all.csv"
    assert mqstore("export", store_dir, out, "--start-offset", "0").code == 0
    with open(out, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == QUEUE_COUNT * MESSAGES_PER_QUEUE + 1
    binary = [row for row in rows if row["topic"] == "binary"][0]
    assert bytes.fromhex(binary["body"]) == bytes(range(256))
    first = [row for row in rows if row["topic"] == TOPIC][0]
    assert bytes.fromhex(first["body"]).startswith(b"order ")
    assert json.loads(first["properties"])["KEYS"] == first["keys"]
    assert first["tags"] == json.loads(first["properties"])["TAGS"]


def test_bad_arguments_are_refused(mqstore, store_dir, tmp_path):
    assert mqstore("export", store_dir, tmp_path / "x.unknown").code == 2
    assert mqstore("export", store_dir, "-", "--format", "parquet").code == 2
    run = mqstore("export", store_dir, tmp_path / "x.csv", "--columns", "nope")
    assert run.code == 1 and "unknown columns" in run.err


@pytest.mark.parametrize("kind", ["csv", "arrow"])
def test_stdout(store_dir, kind, capsysbinary):
    from mqstore.cli import main

    assert main(["export", str(store_dir), "-", "--format", kind, "--topic", "binary"]) == 0
    out = capsysbinary.readouterr().out
    if kind == "csv":
        assert out.count(b"\n") == 2
    else:
        assert pa.ipc.open_stream(out).read_all().num_rows == 1
