package io.mqstore.spark;

/**
 * Records of one store found through its ConsumeQueues, fixed at planning (mqstore/store/scan_read.py's
 * QueuePartition): slice i is `counts[i]` entries of the queue in directory `queueDirs[i]` (topic `topics[i]`)
 * from entry number `firsts[i]`. The reader reads the units again and each record must be the size and topic its
 * unit says.
 */
final class QueuePartition extends StorePartition {
    private static final long serialVersionUID = 1L;

    final long firstBase;  // the base of the store's first segment at planning: segments are counted from it
    final String[] topics;
    final String[] queueDirs;
    final long[] firsts;
    final int[] counts;

    QueuePartition(String root, String label, long segmentSize, long firstBase, String[] topics, String[] queueDirs,
                   long[] firsts, int[] counts) {
        super(root, label, segmentSize);
        this.firstBase = firstBase;
        this.topics = topics;
        this.queueDirs = queueDirs;
        this.firsts = firsts;
        this.counts = counts;
    }
}
