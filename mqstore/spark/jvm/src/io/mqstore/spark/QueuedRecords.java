package io.mqstore.spark;

import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The records a QueuePartition's ConsumeQueue slices point to, in the order the reader takes them: topic after
 * topic (sorted), each topic's units merged by commitlog offset, grouped by segment. Each unit is checked against
 * its segment (offset inside it, size at least a record's minimum and not past the segment's end) when its
 * segment's group is formed, before the reader touches the record (consumequeue.matches-log).
 */
final class QueuedRecords {
    private final QueuePartition queue;
    private final String[] topics;
    private int topic = -1;  // index into topics
    private long[] offsets = new long[0];
    private long[] sizes = new long[0];
    private int at;  // the next unit of offsets
    private int groupEnd;  // units [at, groupEnd) lie in the segment `base`

    // the current record, set by next()
    long offset;
    int size;
    long base = -1;
    boolean segmentChanged;
    byte[] expectTopic;

    QueuedRecords(QueuePartition queue) {
        this.queue = queue;
        this.topics = Arrays.stream(queue.topics).distinct().sorted().toArray(String[]::new);
    }

    String topic() {
        return topics[topic];
    }

    /** Step to the next record (true), or false after the last. */
    boolean next() {
        segmentChanged = false;
        while (at >= groupEnd) {
            if (at >= offsets.length && !loadNextTopic()) {
                return false;
            }
            openGroup();
            segmentChanged = true;
        }
        offset = offsets[at];
        size = (int) sizes[at];
        at++;
        return true;
    }

    /** The units of the next topic's slices, sorted by commitlog offset; false when no topic is left. */
    private boolean loadNextTopic() {
        while (++topic < topics.length) {
            List<long[][]> parts = new ArrayList<>();
            for (int s = 0; s < queue.topics.length; s++) {
                if (queue.topics[s].equals(topics[topic])) {
                    parts.add(Queues.range(Paths.get(queue.queueDirs[s]), queue.firsts[s], queue.counts[s]));
                }
            }
            long[][] merged = parts.size() == 1 && ascending(parts.get(0)[0]) ? parts.get(0) : sorted(parts);
            offsets = merged[0];
            sizes = merged[1];
            at = 0;
            groupEnd = 0;
            expectTopic = topics[topic].getBytes(StandardCharsets.UTF_8);
            if (offsets.length > 0) {
                return true;
            }
        }
        return false;
    }

    private static boolean ascending(long[] values) {
        for (int i = 1; i < values.length; i++) {
            if (values[i] < values[i - 1]) {
                return false;
            }
        }
        return true;
    }

    /** The units of several slices (or one out of order, which damage can make) sorted by offset, stably. */
    private static long[][] sorted(List<long[][]> parts) {
        int total = 0;
        for (long[][] units : parts) {
            total += units[0].length;
        }
        long[][] pairs = new long[total][];
        int k = 0;
        for (long[][] units : parts) {
            for (int i = 0; i < units[0].length; i++) {
                pairs[k++] = new long[] {units[0][i], units[1][i]};
            }
        }
        Arrays.sort(pairs, (a, b) -> Long.compare(a[0], b[0]));
        long[] offsets = new long[total];
        long[] sizes = new long[total];
        for (int i = 0; i < total; i++) {
            offsets[i] = pairs[i][0];
            sizes[i] = pairs[i][1];
        }
        return new long[][] {offsets, sizes};
    }

    /** Find the segment of unit `at` and the units [at, groupEnd) in it; check each against the segment. */
    private void openGroup() {
        long segmentSize = queue.segmentSize;
        long first = offsets[at];
        base = first - Math.floorMod(first - queue.firstBase, segmentSize);
        long segmentEnd = base + segmentSize;
        int end = at;
        while (end < offsets.length && offsets[end] < segmentEnd) {
            end++;
        }
        groupEnd = end;
        for (int k = at; k < end; k++) {
            long unitOffset = offsets[k];
            if (unitOffset < queue.firstBase || sizes[k] < LogFormat.RECORD_SIZE_MIN
                    || sizes[k] > segmentEnd - unitOffset) {
                String path = Paths.get(queue.root, "commitlog", LogFormat.segmentName(base)).toString();
                throw new CorruptLogException("a ConsumeQueue unit of topic '" + topics[topic] + "' says " + sizes[k]
                        + " bytes at " + unitOffset, path, unitOffset - base, "consumequeue.matches-log");
            }
        }
    }
}
