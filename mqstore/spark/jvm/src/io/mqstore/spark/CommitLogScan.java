package io.mqstore.spark;

import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The scan: pushed filters folded into the row filter (mqstore/store/scan_options.py's push_filters: topic =
 * / IN, queue_id = / IN, commitlog_offset and store_timestamp comparisons; IS NOT NULL of a non-null column),
 * the columns Spark needs, partitions planned by {@link Planner} and read by {@link LogReader}.
 */
final class CommitLogScan implements Scan, Batch {
    static final String OFF_HEAP_CONF = "spark.mqstore.commitlogJvm.offHeapVectors";

    private final ReadOptions options;
    private final RowFilter filter;
    private final StructType schema;

    CommitLogScan(ReadOptions options, RowFilter filter, StructType schema) {
        this.options = options;
        this.filter = filter;
        this.schema = schema;
    }

    @Override
    public StructType readSchema() {
        return schema;
    }

    @Override
    public String description() {
        return ReadOptions.NAME + " [" + filter + "]";
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        for (ReadOptions.StoreRef ref : options.stores) {
            if (ref.tier != null) {
                throw new SourceException("readStream of a tier (" + ref.root + ") is not supported: read the store "
                        + "that uploads to it, or spark.read the tier in batches");
            }
        }
        return new CommitLogStream(options, createReaderFactory(), checkpointLocation);
    }

    @Override
    public InputPartition[] planInputPartitions() {
        return Planner.planBatch(options.stores, filter).toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        // off-heap vectors unless the session says otherwise: 15-25% less JVM CPU on the 100 B full scan
        // (docs/decisions/0027-jvm-spark-reader.md)
        boolean offHeap = Boolean.parseBoolean(SQLConf.get().getConfString(OFF_HEAP_CONF, "true"));
        return new ReaderFactory(filter, schema, offHeap);
    }

    static final class ReaderFactory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final RowFilter filter;
        private final StructType schema;
        private final boolean offHeap;

        ReaderFactory(RowFilter filter, StructType schema, boolean offHeap) {
            this.filter = filter;
            this.schema = schema;
            this.offHeap = offHeap;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new LogReader((StorePartition) partition, filter, schema, offHeap);
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException(ReadOptions.NAME + " reads columnar batches only");
        }
    }

    static final class Builder implements ScanBuilder, SupportsPushDownFilters, SupportsPushDownRequiredColumns {
        private final ReadOptions options;
        private RowFilter filter;
        private StructType schema;
        private Filter[] pushed = new Filter[0];

        Builder(ReadOptions options) {
            this.options = options;
            this.filter = options.filter;
            this.schema = Columns.schema(options.withStoreColumn);
        }

        @Override
        public Scan build() {
            return new CommitLogScan(options, filter, schema);
        }

        @Override
        public void pruneColumns(StructType required) {
            Set<String> names = new HashSet<>();
            for (StructField field : required.fields()) {
                names.add(field.name());
            }
            List<StructField> kept = new ArrayList<>();
            for (StructField field : Columns.schema(options.withStoreColumn).fields()) {
                if (names.contains(field.name())) {
                    kept.add(field);
                }
            }
            schema = new StructType(kept.toArray(new StructField[0]));
        }

        @Override
        public Filter[] pushFilters(Filter[] filters) {
            List<Filter> rest = new ArrayList<>();
            List<Filter> taken = new ArrayList<>();
            for (Filter item : filters) {
                RowFilter narrowed = fold(filter, item, options.withStoreColumn);
                if (narrowed == null) {
                    rest.add(item);
                } else {
                    filter = narrowed;
                    taken.add(item);
                }
            }
            pushed = taken.toArray(new Filter[0]);
            return rest.toArray(new Filter[0]);
        }

        @Override
        public Filter[] pushedFilters() {
            return pushed;
        }
    }

    /** `f` AND `item` when the reader can apply `item` exactly, else null (Spark keeps it). */
    static RowFilter fold(RowFilter f, Filter item, boolean withStoreColumn) {
        String[] refs = item.references();
        if (refs.length != 1) {
            return null;
        }
        String column = refs[0];
        if (item instanceof IsNotNull) {
            boolean nonNull = false;
            for (StructField field : Columns.schema(withStoreColumn).fields()) {
                nonNull |= field.name().equals(column) && !field.nullable();
            }
            return nonNull ? f : null;
        }
        if (column.equals("topic") || column.equals("queue_id")) {
            Object[] values;
            if (item instanceof EqualTo) {
                values = new Object[] {((EqualTo) item).value()};
            } else if (item instanceof In) {
                values = ((In) item).values();
            } else {
                return null;
            }
            if (column.equals("topic")) {
                Set<String> topics = new HashSet<>();
                for (Object v : values) {
                    if (!(v instanceof String)) {
                        return null;
                    }
                    topics.add((String) v);
                }
                return f.withTopics(topics);
            }
            Set<Integer> ids = new HashSet<>();
            for (Object v : values) {
                if (!(v instanceof Integer)) {
                    return null;
                }
                ids.add((Integer) v);
            }
            return f.withQueueIds(ids);
        }
        boolean offsets = column.equals("commitlog_offset");
        if (!offsets && !column.equals("store_timestamp")) {
            return null;
        }
        Object raw = value(item);
        Long value = null;
        if (offsets && raw instanceof Long) {
            value = (Long) raw;
        } else if (!offsets && raw instanceof Timestamp) {
            Timestamp t = (Timestamp) raw;
            value = Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000;
        } else if (!offsets && raw instanceof Instant) {
            value = ReadOptions.micros((Instant) raw);
        }
        if (value == null || value == Long.MAX_VALUE) {
            return null;
        }
        Long lo = null;
        Long hi = null;
        if (item instanceof EqualTo) {
            lo = value;
            hi = value + 1;
        } else if (item instanceof GreaterThan) {
            lo = value + 1;
        } else if (item instanceof GreaterThanOrEqual) {
            lo = value;
        } else if (item instanceof LessThan) {
            hi = value;
        } else if (item instanceof LessThanOrEqual) {
            hi = value + 1;
        } else {
            return null;
        }
        return offsets ? f.withOffsets(lo, hi) : f.withTimes(lo, hi);
    }

    private static Object value(Filter item) {
        if (item instanceof EqualTo) {
            return ((EqualTo) item).value();
        } else if (item instanceof GreaterThan) {
            return ((GreaterThan) item).value();
        } else if (item instanceof GreaterThanOrEqual) {
            return ((GreaterThanOrEqual) item).value();
        } else if (item instanceof LessThan) {
            return ((LessThan) item).value();
        } else if (item instanceof LessThanOrEqual) {
            return ((LessThanOrEqual) item).value();
        }
        return null;
    }
}
