package io.mqstore.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * What every partition of a read names: its store's root (a local directory, or a tier's shown URI), the label of
 * its `store` column, its segment size; for a tier, where its objects are and the store's record_crc_from_offset
 * from the manifest (a local store's is read from its settings file by the reader).
 */
abstract class StorePartition implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String root;
    final String label;
    final long segmentSize;
    final TierLocation tier;  // null: a local store
    final long tierRecordCrcFrom;  // a tier's; -1: no record CRCs

    StorePartition(String root, String label, long segmentSize) {
        this(root, label, segmentSize, null, -1);
    }

    StorePartition(String root, String label, long segmentSize, TierLocation tier, long tierRecordCrcFrom) {
        this.root = root;
        this.label = label;
        this.segmentSize = segmentSize;
        this.tier = tier;
        this.tierRecordCrcFrom = tierRecordCrcFrom;
    }
}
