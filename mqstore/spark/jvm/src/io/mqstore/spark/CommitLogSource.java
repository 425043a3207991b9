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
 * spark.read.format("commitlog-jvm"): batch reads of mqstore / RocketMQ 4.x stores, decoded in the JVM.
 *
 * The rows, schema, options and pushed filters are those of the Python source, format("commitlog")
 * (mqstore/spark/source.py); streaming stays with that one. docs/spark.md tells how to load the jar, and
 * docs/decisions/0027-jvm-spark-reader.md why both exist.
 */
public final class CommitLogSource implements TableProvider, DataSourceRegister {
    @Override
    public String shortName() {
        return ReadOptions.NAME;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return Columns.schema(ReadOptions.parse(options).withStoreColumn);
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new CommitLogTable(ReadOptions.parse(properties));
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
            return EnumSet.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap ignored) {
            return new CommitLogScan.Builder(options);
        }
    }
}
