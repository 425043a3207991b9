package io.mqstore.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * spark.read / spark.readStream .format("commitlog"): batch and streaming reads of mqstore / RocketMQ 4.x
 * stores, decoded in the JVM; batch reads of a store's tier too, load("s3://bucket/prefix?..." or
 * "file:///dir"), each task reading its byte ranges from the object store ({@link TierLocation}).
 *
 * The rows, schema, options, pushed filters and stream offsets are those of the Python source
 * (mqstore/spark/source.py), which mqstore.spark.register() registers under the same name only in a session
 * that does not load this jar. docs/spark.md tells how to load it; docs/decisions/0041-one-spark-format-name.md
 * why there is one name.
 */
public class CommitLogSource implements TableProvider, DataSourceRegister {
    @Override
    public String shortName() {
        return ReadOptions.NAME;
    }

    /** format("commitlog-jvm"): the name of this reader before it took "commitlog"; deprecated, kept a release. */
    public static final class DeprecatedName extends CommitLogSource {
        @Override
        public String shortName() {
            return "commitlog-jvm";
        }
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return Columns.schema(ReadOptions.parse(options).withStoreColumn);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;  // so that a schema given with .schema(...) reaches getTable and is refused in our words
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        ReadOptions options = ReadOptions.parse(properties);
        StructType expected = Columns.schema(options.withStoreColumn);
        if (schema != null && !schema.simpleString().equals(expected.simpleString())) {
            throw new SourceException("the " + ReadOptions.NAME + " source has a fixed schema (" + expected.simpleString()
                    + "); do not pass another one (" + schema.simpleString() + ")");
        }
        return new CommitLogTable(options);
    }

    static final class CommitLogTable implements Table, SupportsRead {
        private final ReadOptions options;

        CommitLogTable(ReadOptions options) {
            this.options = options;
        }

        @Override
        public String name() {
            return ReadOptions.NAME;
        }

        @Override
        @SuppressWarnings("deprecation")
        public StructType schema() {
            return Columns.schema(options.withStoreColumn);
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap ignored) {
            return new CommitLogScan.Builder(options);
        }
    }
}
