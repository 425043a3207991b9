"""`mqstore export`: a store's records, or a filtered part of them, to a Parquet, Arrow IPC or CSV file.

It reads through `mqstore.store.scan.scan_store` (the columns and filters of `MessageStore.scan()` and of the Spark
source), batch by batch, so a store larger than memory is exported in constant memory. The store's files are
read, not opened as a store: a writer may be appending (the export ends at the written end when it starts).
CSV has no nested or binary columns: there `body` is hex, `keys` space-separated, `properties` a JSON object.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.cli.common import print_json

FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".ipc": "arrow", ".feather": "arrow", ".csv": "csv"}
_HEX_PAIRS = np.frombuffer(b"".join(f"{b:02X}".encode() for b in range(256)), dtype=np.uint16)


def add_parser(add) -> None:
    """Add the subcommand through `add(name, help)` (cli.py's helper that adds the common store options)."""
    export = add("export", "write the store's records (all or filtered) to a Parquet, Arrow IPC or CSV file")
    export.add_argument("output", metavar="OUTPUT", help="the file to write; '-' writes Arrow IPC or CSV to stdout")
    export.add_argument("--format", choices=sorted(set(FORMATS.values())),
                        help="parquet, arrow (IPC file; a stream on stdout) or csv; default from OUTPUT's suffix")
    export.add_argument("--topic", action="append", dest="topics", metavar="TOPIC",
                        help="only this topic (may be repeated)")
    export.add_argument("--queue", type=int, action="append", dest="queues", metavar="Q",
                        help="only this queue id (may be repeated)")
    export.add_argument("--start-offset", type=int, metavar="N", help="commitlog offsets from N (inclusive)")
    export.add_argument("--end-offset", type=int, metavar="N", help="commitlog offsets before N")
    export.add_argument("--start-time", type=int, metavar="MS", help="stored at or after MS (ms since the epoch)")
    export.add_argument("--end-time", type=int, metavar="MS", help="stored before MS (ms since the epoch)")
    export.add_argument("--columns", help="comma-separated columns (default all): " + ", ".join(_columns()))


def _columns() -> tuple:
    from mqstore.store.scan import COLUMNS

    return COLUMNS


def cmd_export(args) -> int:
    from mqstore.store.scan import scan_store

    kind = args.format or FORMATS.get(os.path.splitext(args.output)[1].lower())
    if kind is None:
        print(f"mqstore: cannot tell the format of {args.output!r}: give --format", file=sys.stderr)
        return 2
    if args.output == "-" and kind == "parquet":
        print("mqstore: Parquet needs a file, not stdout", file=sys.stderr)
        return 2
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    reader = scan_store(args.store, columns=columns, topic=args.topics, queue_ids=args.queues,
                        start_offset=args.start_offset, end_offset=args.end_offset, start_time=args.start_time,
                        end_time=args.end_time)
    rows = _write(reader, kind, args.output)
    size = os.path.getsize(args.output) if args.output != "-" else None
    if args.json:
        print_json({"output": args.output, "format": kind, "rows": rows, "bytes": size})
    elif args.output != "-":
        print(f"{rows} rows written to {args.output} ({kind}, {size} bytes)")
    return 0


def _write(reader: pa.RecordBatchReader, kind: str, output: str) -> int:
    rows = 0
    sink = sys.stdout.buffer if output == "-" else output
    if kind == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(sink, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    elif kind == "arrow":
        opener = pa.ipc.new_stream if output == "-" else pa.ipc.new_file
        with opener(sink, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    else:
        import pyarrow.csv as csv

        schema = csv_schema(reader.schema)
        with csv.CSVWriter(sink, schema) as writer:
            for batch in reader:
                writer.write_batch(csv_batch(batch, schema))
                rows += batch.num_rows
    return rows


def csv_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of csv_batch's batches: nested and binary columns as strings."""
    return pa.schema([pa.field(f.name, pa.string(), f.nullable) if f.name in ("body", "keys", "properties") else f
                      for f in schema])


def csv_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` with `body` as upper-case hex, `keys` space-separated and `properties` as a JSON object."""
    columns = []
    for name, column in zip(batch.schema.names, batch.columns):
        if name == "body":
            column = _hex(column)
        elif name == "keys":
            column = pc.binary_join(column.cast(pa.list_(pa.string())), " ")
        elif name == "properties":
            column = pa.array([json.dumps(dict(pairs), ensure_ascii=False) for pairs in column.to_pylist()],
                              pa.string())
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _hex(binary: pa.Array) -> pa.Array:
    """Upper-case hex of each value of a binary array (two digits a byte), with numpy."""
    n = len(binary)
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int32, count=n + 1)
    data = binary.buffers()[2]
    first, last = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
    raw = np.frombuffer(data, dtype=np.uint8, count=last)[first:] if last else np.zeros(0, np.uint8)
    digits = np.take(_HEX_PAIRS, raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(((offsets - offsets[0]) * 2).astype(np.int32)),
                                       pa.py_buffer(digits.tobytes()))
