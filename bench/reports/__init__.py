"""The blocks bench/report.py writes into bench/README.md, one module per benchmark family.

    cells.py     the cell formatters (rate, size, ratio, ...) and `table`, which every family uses
    put.py       the write path: put_get, flush_modes (and --sync, --peers), put_stalls, sync_share, aio_put,
                 disk_reservation
    dispatch.py  what follows the log: dispatch_lag, dispatch_process, index, recovery
    native.py    the compiled core against the pure-Python codec: crc32, native, native_scan
    spark.py     the Spark source: spark_read
    targets.py   the target tables: core (issue 21) and users (issue 30, README.md's Speed table)
    tier.py      the tiered store: tier_upload, tier_scan, tier_get
    timer.py     issue 32's queue semantics: timer, lease

Each `report_NAME(data)` takes the parsed `bench/results/NAME.json` and returns the Markdown under the block's
header line; bench/report.py maps result names to them, writes the header and places the blocks. A new benchmark
adds its function to its family's module (or a new module here) and a line to `BENCHMARKS` in bench/report.py.
"""
