package io.mqstore.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * The planning cases of mqstore/store/scan_plan.py that the ConsumeQueues and the segments' first timestamps
 * decide:
 *
 * <pre>
 *   CASE                                              DECISION
 *   a topic filter, region the ConsumeQueues cover    read only the records the topic's queues point to; the
 *                                                     region ends at the writer's dispatched mark when there is
 *                                                     one (queues are written one after another), else at the
 *                                                     queues' furthest unit
 *   a topic filter, region past the dispatched end    walk the records and keep the topic's
 *   a time filter                                     skip segments whose records are all outside the range,
 *                                                     trusting store timestamps to grow along the log
 * </pre>
 *
 * Every value read here from disk only narrows what is read; the reader checks each record against its unit and
 * the row filter, so a wrong value costs an error, never a wrong row.
 */
final class QueuePlanner {
    private QueuePlanner() {
    }

    static final int QUEUE_PARTITION_RECORDS_MAX = 262144;  // records per partition on the ConsumeQueue path

    /**
     * A commitlog offset below which every record is in its ConsumeQueue, or -1 (scan_plan's
     * _queues_complete_below): the writer's published mark when it is a record start, else the queues'
     * verified furthest unit when no writer has the store open.
     */
    static long queuesCompleteBelow(String root, Planner.Segments segments, long furthest) {
        long mark = Queues.readMark(root);
        if (mark == -2 || mark == furthest) {
            return furthest;
        }
        if (segments.bases.length == 0 || mark <= segments.bases[0]) {
            return -1;
        }
        long base = mark - Math.floorMod(mark - segments.bases[0], segments.size);
        if (base > segments.bases[segments.bases.length - 1]) {
            return -1;
        }
        if (mark == base) {
            return mark;
        }
        ByteBuffer head = header(segments, base, mark - base, LogFormat.OFFSET_PHYSICAL_OFFSET + 8);
        if (head == null || head.position() < LogFormat.END_FILE_MIN_BLANK_LENGTH) {
            return -1;
        }
        int total = head.getInt(0);
        int magic = head.getInt(LogFormat.OFFSET_MAGIC_CODE);
        if (LogFormat.isMessageMagic(magic) && head.position() == head.capacity()
                && head.getLong(LogFormat.OFFSET_PHYSICAL_OFFSET) == mark) {
            return mark;
        }
        if (magic == LogFormat.BLANK_MAGIC_CODE && total == base + segments.size - mark) {
            return mark;
        }
        return -1;  // not a record start: a mark left by an older run, the log rewritten since
    }

    /** Up to `length` bytes of the segment at `base` from `filePos` (position() says how many), or null. */
    static ByteBuffer header(Planner.Segments segments, long base, long filePos, int length) {
        if (segments.tier != null) {  // a tier's segment is whole: a range read of the object
            try {
                ByteBuffer head = ByteBuffer.wrap(segments.window(base, filePos, length));
                return head.position(length);
            } catch (IOException e) {
                throw new java.io.UncheckedIOException("cannot read segment " + segments.name(base), e);
            }
        }
        ByteBuffer head = ByteBuffer.allocate(length);
        try (FileChannel channel = FileChannel.open(segments.path(base), StandardOpenOption.READ)) {
            while (head.hasRemaining() && channel.read(head, filePos + head.position()) > 0) {
                // read on
            }
        } catch (IOException e) {
            return null;
        }
        return head;
    }

    /** The segment bases that may hold a record in the filter's time range (null: all), by first timestamps. */
    static Set<Long> timeAllowed(Planner.StorePlan plan, RowFilter filter) {
        if (filter.timeLoUs == null && filter.timeHiUs == null) {
            return null;
        }
        List<Long> bases = new ArrayList<>();
        List<Long> firsts = new ArrayList<>();  // the store timestamp (us) of each segment's first record, or null
        for (long base : plan.segments.bases) {
            if (base >= plan.end) {
                break;
            }
            ByteBuffer head = header(plan.segments, base, 0, LogFormat.OFFSET_STORE_TIMESTAMP + 8);
            bases.add(base);
            firsts.add(head != null && head.position() == head.capacity()
                    && head.getInt(LogFormat.OFFSET_MAGIC_CODE) == LogFormat.MESSAGE_MAGIC_CODE
                    ? head.getLong(LogFormat.OFFSET_STORE_TIMESTAMP) * 1000 : null);
        }
        Set<Long> allowed = new HashSet<>();
        for (int i = 0; i < bases.size(); i++) {
            Long first = firsts.get(i);
            Long following = i + 1 < bases.size() ? firsts.get(i + 1) : null;
            if (first != null && filter.timeHiUs != null && first >= filter.timeHiUs) {
                continue;  // every record of the segment is stored at or after `first`
            }
            if (following != null && filter.timeLoUs != null && following < filter.timeLoUs) {
                continue;  // every record of the segment is stored at or before the next segment's first
            }
            allowed.add(bases.get(i));
        }
        return allowed;
    }

    /** One queue's selected units: its topic and directory, the first entry's number, offsets, sizes, wanted. */
    static final class Selected {
        final String topic;
        final Path directory;
        final long first;
        final long[] offsets;
        final long[] sizes;
        final boolean[] wanted;

        Selected(String topic, Path directory, long first, long[] offsets, long[] sizes, boolean[] wanted) {
            this.topic = topic;
            this.directory = directory;
            this.first = first;
            this.offsets = offsets;
            this.sizes = sizes;
            this.wanted = wanted;
        }

        long wantedBytes() {
            long total = 0;
            for (int i = 0; i < sizes.length; i++) {
                total += wanted[i] ? sizes[i] : 0;
            }
            return total;
        }
    }

    /** The units in [lo, hi) of each queue of the filter's topics (and queue ids). */
    static List<Selected> select(Planner.StorePlan plan, Queues queues, RowFilter filter, long lo, long hi,
                                 Set<Long> allowed) {
        List<Selected> found = new ArrayList<>();
        long size = plan.segments.size;
        long firstBase = plan.segments.bases[0];
        for (Object[] q : queues.queues()) {
            if (!filter.topics.contains((String) q[0])
                    || (filter.queueIds != null && !filter.queueIds.contains((Integer) q[1]))) {
                continue;
            }
            long[][] entries = queues.entries((Path) q[2], lo, hi);
            if (entries[1].length == 0) {
                continue;
            }
            boolean[] wanted = new boolean[entries[1].length];
            for (int i = 0; i < wanted.length; i++) {
                long offset = entries[1][i];
                wanted[i] = allowed == null || allowed.contains(offset - Math.floorMod(offset - firstBase, size));
            }
            found.add(new Selected((String) q[0], (Path) q[2], entries[0][0], entries[1], entries[2], wanted));
        }
        return found;
    }

    /** QueuePartitions of about `target` bytes of records each (scan_plan's _queue_groups). */
    static List<QueuePartition> group(Planner.StorePlan plan, List<Selected> found, long target) {
        List<Object[]> slices = new ArrayList<>();  // {topic, directory, first, count, bytes}
        for (Selected s : found) {
            int at = 0;
            while (at < s.offsets.length) {
                long bytes = 0;
                int stop = at;
                while (stop < s.offsets.length && stop - at < QUEUE_PARTITION_RECORDS_MAX
                        && (stop == at || bytes + (s.wanted[stop] ? s.sizes[stop] : 0) <= target)) {
                    bytes += s.wanted[stop] ? s.sizes[stop] : 0;
                    stop++;
                }
                int a = at;
                int b = stop;
                while (a < b && !s.wanted[a]) {
                    a++;
                }
                while (b > a && !s.wanted[b - 1]) {
                    b--;
                }
                if (a < b) {
                    slices.add(new Object[] {s.topic, s.directory.toString(), s.first + a, b - a, bytes});
                }
                at = stop;
            }
        }
        List<QueuePartition> partitions = new ArrayList<>();
        List<Object[]> current = new ArrayList<>();
        long currentBytes = 0;
        for (Object[] slice : slices) {
            if (!current.isEmpty() && currentBytes + (Long) slice[4] > target) {
                partitions.add(partition(plan, current));
                current = new ArrayList<>();
                currentBytes = 0;
            }
            current.add(slice);
            currentBytes += (Long) slice[4];
        }
        if (!current.isEmpty()) {
            partitions.add(partition(plan, current));
        }
        return partitions;
    }

    private static QueuePartition partition(Planner.StorePlan plan, List<Object[]> slices) {
        int n = slices.size();
        String[] topics = new String[n];
        String[] directories = new String[n];
        long[] firsts = new long[n];
        int[] counts = new int[n];
        for (int i = 0; i < n; i++) {
            topics[i] = (String) slices.get(i)[0];
            directories[i] = (String) slices.get(i)[1];
            firsts[i] = (Long) slices.get(i)[2];
            counts[i] = (Integer) slices.get(i)[3];
        }
        return new QueuePartition(plan.ref.root, plan.ref.label, plan.segments.size, plan.segments.bases[0], topics,
                directories, firsts, counts);
    }
}
