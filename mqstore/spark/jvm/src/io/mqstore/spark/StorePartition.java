package io.mqstore.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/** What every partition of a read names: its store's root, the label of its `store` column, its segment size. */
abstract class StorePartition implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String root;
    final String label;
    final long segmentSize;

    StorePartition(String root, String label, long segmentSize) {
        this.root = root;
        this.label = label;
        this.segmentSize = segmentSize;
    }
}
