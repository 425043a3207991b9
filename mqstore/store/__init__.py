"""The engine: the MessageStore facade, its configuration, reads and index lookups, recovery, retention, verify
and the dispatch process. It builds on commitlog, consumequeue, indexfile and flush, and imports neither the
Spark source nor the command line."""
