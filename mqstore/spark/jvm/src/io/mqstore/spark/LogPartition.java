package io.mqstore.spark;

/**
 * Pieces of one store's log (a local store's files or a tier's objects), fixed at planning: piece i is the records of the segment at `bases[i]` from
 * `starts[i]` (a record start) to `ends[i]` (exactly, or through the segment's end-of-segment blank).
 */
final class LogPartition extends StorePartition {
    private static final long serialVersionUID = 1L;

    final long[] bases;
    final long[] starts;
    final long[] ends;

    LogPartition(String root, String label, long segmentSize, TierLocation tier, long tierRecordCrcFrom, long[] bases,
                 long[] starts, long[] ends) {
        super(root, label, segmentSize, tier, tierRecordCrcFrom);
        this.bases = bases;
        this.starts = starts;
        this.ends = ends;
    }

    long bytes() {
        long total = 0;
        for (int i = 0; i < starts.length; i++) {
            total += ends[i] - starts[i];
        }
        return total;
    }
}
