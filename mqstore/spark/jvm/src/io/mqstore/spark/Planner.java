package io.mqstore.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;

/**
 * Planning a batch read, the log-path rules of mqstore/store/scan_plan.py:
 *
 * <pre>
 *   CASE                                        DECISION
 *   a segment's first 8 bytes are zero          preallocated, not written: not read (after the last written one)
 *   the last written segment                    read up to its written end, found by walking its records from its
 *                                               start to the first zero or invalid header (rules 1-4); the body
 *                                               CRCs of the last TAIL_CRC_RECORDS records are checked, the first
 *                                               that fails ends the snapshot (a record still being written); a
 *                                               record straddling the segment's end is invalid, so not included
 *   start_offset / end_offset                   segments wholly outside the range are not read
 *   a segment longer than 1.5x the target       cut at record starts about `target` bytes apart, each found by
 *                                               looking forward for a message magic whose PHYSICALOFFSET is its
 *                                               own position; the reader before a cut must land exactly on it,
 *                                               so a false cut is an error, never a wrong row
 *   small segments                              grouped, so each core gets about PARTITIONS_PER_CORE partitions
 *   a read of at most SMALL_READ_BYTES_PER_CORE a core  one partition a core
 *   a tier (load of a tier URI)                 the segments its manifest lists (TierManifest), all sealed: the
 *                                               written end is the tier's end, no walk; cuts found by range reads
 * </pre>
 *
 * The walk to the written end: {@link LogEnd}. ConsumeQueue reads for a topic filter and segments skipped by time:
 * {@link QueuePlanner}. Both only save reading; every record is tested against the filter, so the rows are the
 * same.
 */
final class Planner {
    private Planner() {
    }

    static final long MIB = 1L << 20;
    static final long PARTITION_BYTES_MAX = 256 * MIB;
    static final long PARTITION_BYTES_MIN = 64 * 1024;
    static final int PARTITIONS_PER_CORE = 2;
    static final long SMALL_READ_BYTES_PER_CORE = 32 * MIB;
    static final long CUT_SEARCH_BYTES_MAX = 64 * MIB;  // how far past the wanted cut a record start is looked for
    static final int CUT_WINDOW_BYTES = 1 << 20;  // read at once while looking for it (a record start is near)

    /**
     * The segments of one store: bases ascending, all `size` bytes; files of a local store's commitlog/ directory,
     * or the objects a tier's manifest lists (`tier` and `objects` set, for the planner's reads on the driver).
     */
    static final class Segments {
        final Path directory;  // null for a tier
        final long size;
        final long[] bases;
        final TierLocation tier;  // null for a local store
        final TierObjects objects;
        final long recordCrcFrom;  // a tier's, from its manifest (-1: none); a local store's is read by the reader

        Segments(Path directory, long size, long[] bases) {
            this(directory, size, bases, null, null, -1);
        }

        Segments(Path directory, long size, long[] bases, TierLocation tier, TierObjects objects, long recordCrcFrom) {
            this.directory = directory;
            this.size = size;
            this.bases = bases;
            this.tier = tier;
            this.objects = objects;
            this.recordCrcFrom = recordCrcFrom;
        }

        Path path(long base) {
            assert tier == null : "a tier's segments are objects";
            return directory.resolve(LogFormat.segmentName(base));
        }

        /** The file's path or the object's shown URI. */
        String name(long base) {
            return tier == null ? path(base).toString() : tier.display(TierManifest.segmentKey(base));
        }

        /** Exactly `length` bytes of the segment at `base` from `filePos` (inside the segment). */
        byte[] window(long base, long filePos, int length) throws IOException {
            assert filePos >= 0 && length >= 0 && filePos + length <= size : "a window inside the segment";
            byte[] into = new byte[length];
            if (tier != null) {
                objects.readRange(TierManifest.segmentKey(base), filePos, into, 0, length);
                return into;
            }
            try (SegmentMap segment = SegmentMap.open(path(base), base, size)) {
                segment.read(base + filePos, into, 0, length, "a record start looked for at planning");
            }
            return into;
        }
    }

    static Segments listSegments(String root) {
        Path directory = Paths.get(root, "commitlog");
        List<Long> found = new ArrayList<>();
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(directory)) {
            for (Path entry : entries) {
                long base = LogFormat.parseSegmentName(entry.getFileName().toString());
                if (base >= 0) {
                    found.add(base);
                }
            }
        } catch (NoSuchFileException e) {
            throw new SourceException("not a RocketMQ store (no commitlog/ directory): " + root);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot list " + directory, e);
        }
        found.sort(null);
        List<Long> bases = new ArrayList<>();
        List<Long> sizes = new ArrayList<>();
        for (long base : found) {
            try {
                sizes.add(Files.size(directory.resolve(LogFormat.segmentName(base))));
                bases.add(base);
            } catch (NoSuchFileException e) {
                // deleted by retention while listing
            } catch (IOException e) {
                throw new UncheckedIOException("cannot stat a segment of " + directory, e);
            }
        }
        if (bases.isEmpty()) {
            return new Segments(directory, 0, new long[0]);
        }
        long size = sizes.get(sizes.size() - 1);
        long[] result = new long[bases.size()];
        for (int i = 0; i < bases.size(); i++) {
            result[i] = bases.get(i);
            String path = directory.resolve(LogFormat.segmentName(result[i])).toString();
            if (sizes.get(i) != size || size <= 0 || size > Integer.MAX_VALUE) {
                throw new CorruptLogException("segment is " + sizes.get(i) + " bytes, the store's segments are " + size
                        + " (at most " + Integer.MAX_VALUE + ")", path, 0, "commitlog.segment-size");
            }
            if (i > 0 && result[i] - result[i - 1] != size) {
                throw new CorruptLogException("segments are not contiguous: " + LogFormat.segmentName(result[i - 1])
                        + " is followed by " + LogFormat.segmentName(result[i]), directory.toString(), 0,
                        "commitlog.contiguous");
            }
        }
        return new Segments(directory, size, result);
    }

    /** A store's snapshot: its segments and the written end of its log now. */
    static final class StorePlan {
        final ReadOptions.StoreRef ref;
        final Segments segments;
        final long end;
        final long furthest;  // the queues' verified furthest unit's end, or -1

        StorePlan(ReadOptions.StoreRef ref, Segments segments, long end, long furthest) {
            this.ref = ref;
            this.segments = segments;
            this.end = end;
            this.furthest = furthest;
        }
    }

    static StorePlan planStore(ReadOptions.StoreRef ref) {
        return ref.tier != null ? planTier(ref) : planStore(ref, -1);
    }

    /**
     * A tier's snapshot: the segments its manifest lists, all sealed, so the written end is the end of the last
     * one, as for a whole store with no writer. `objects` stays open for the planner's reads (closed by
     * planBatch).
     */
    static StorePlan planTier(ReadOptions.StoreRef ref) {
        TierObjects objects = ref.tier.open();
        TierManifest manifest = TierManifest.load(ref.tier, objects);
        if (manifest.segmentSize > Integer.MAX_VALUE) {
            throw new SourceException("the tier " + ref.tier.uri + " has segments of " + manifest.segmentSize
                    + " bytes; this reader reads segments of at most " + Integer.MAX_VALUE);
        }
        Segments segments = new Segments(null, manifest.segmentSize, manifest.bases, ref.tier, objects,
                manifest.recordCrcFrom);
        return new StorePlan(ref, segments, manifest.end(), -1);
    }

    /** The snapshot, the walk to the written end starting at `knownStart` (a record start, or -1) when it helps. */
    static StorePlan planStore(ReadOptions.StoreRef ref, long knownStart) {
        long flushed = LogEnd.checkpointFlushed(ref.root);  // first: what it says was on disk before the walk
        Segments segments = listSegments(ref.root);
        long dispatched = LogEnd.dispatchedEnd(ref.root, segments);
        long end = LogEnd.writtenEnd(segments, Math.max(dispatched, knownStart));
        LogEnd.refuseStopBelowFlushed(segments, end, flushed);
        return new StorePlan(ref, segments, end, dispatched);
    }

    /**
     * Bytes per partition: one partition a core for a small read (at most SMALL_READ_BYTES_PER_CORE a core: a task
     * costs more than balancing saves), else a multiple of PARTITIONS_PER_CORE partitions per core, none above the
     * maximum.
     */
    static long partitionTarget(long totalBytes) {
        int cores = Runtime.getRuntime().availableProcessors();
        if (totalBytes <= SMALL_READ_BYTES_PER_CORE * cores) {
            return Math.max(PARTITION_BYTES_MIN, ceilDiv(totalBytes, cores));
        }
        long slots = (long) PARTITIONS_PER_CORE * cores;
        long count = slots * Math.max(1, ceilDiv(totalBytes, PARTITION_BYTES_MAX * slots));
        return Math.min(PARTITION_BYTES_MAX, Math.max(PARTITION_BYTES_MIN, ceilDiv(totalBytes, count)));
    }

    private static long ceilDiv(long a, long b) {
        return -Math.floorDiv(-a, b);
    }

    /**
     * The partitions of a batch read of `stores`, each store up to its written end now: with a topic filter, the
     * records the ConsumeQueues point to below the dispatched end (QueuePartitions) and the log past it; segments
     * that hold no record of a time filter's range are skipped.
     */
    static List<StorePartition> planBatch(List<ReadOptions.StoreRef> stores, RowFilter filter) {
        List<StorePartition> partitions = new ArrayList<>();
        if (filter.isEmpty()) {
            return partitions;
        }
        List<StorePlan> plans = new ArrayList<>();
        try {
            List<List<long[]>> pieces = new ArrayList<>();  // per store: {base, start, end}
            List<List<QueuePlanner.Selected>> units = new ArrayList<>();
            long total = 0;
            for (ReadOptions.StoreRef ref : stores) {
                StorePlan plan = planStore(ref);
                plans.add(plan);
                List<long[]> own = new ArrayList<>();
                List<QueuePlanner.Selected> selected = new ArrayList<>();
                total += pieces(plan, filter, own, selected);
                pieces.add(own);
                units.add(selected);
            }
            long target = partitionTarget(total);
            for (int s = 0; s < plans.size(); s++) {
                partitions.addAll(QueuePlanner.group(plans.get(s), units.get(s), target));
                partitions.addAll(group(plans.get(s), pieces.get(s), target));
            }
        } finally {
            for (StorePlan plan : plans) {
                closeQuietly(plan.segments.objects);
            }
        }
        return partitions;
    }

    /**
     * One store's share of a batch read: the log pieces to walk ({base, start, end}) into `own`, the ConsumeQueue
     * units to read into `selected`; the bytes they hold.
     */
    private static long pieces(StorePlan plan, RowFilter filter, List<long[]> own,
                               List<QueuePlanner.Selected> selected) {
        ReadOptions.StoreRef ref = plan.ref;
        long lo = plan.segments.bases.length == 0 ? 0
                : Math.max(plan.segments.bases[0], filter.offsetLo == null ? 0 : filter.offsetLo);
        long hi = filter.offsetHi == null ? plan.end : Math.min(plan.end, filter.offsetHi);
        if (plan.segments.bases.length == 0 || lo >= hi) {
            return 0;
        }
        long total = 0;
        Set<Long> allowed = QueuePlanner.timeAllowed(plan, filter);
        // a tier is walked: its ConsumeQueue images are not read yet (every record is filtered)
        long dispatched = ref.tier != null ? -1
                : Math.min(QueuePlanner.queuesCompleteBelow(ref.root, plan.segments, plan.furthest), plan.end);
        boolean byQueues = filter.topics != null && dispatched > lo;
        long logLo = lo;
        if (byQueues) {
            selected.addAll(QueuePlanner.select(plan, new Queues(ref.root), filter, lo, Math.min(hi, dispatched),
                    allowed));
            logLo = dispatched;  // a record start: the queues cover everything before it
        }
        for (long base : plan.segments.bases) {
            long segmentEnd = base + plan.segments.size;
            if (logLo >= hi || segmentEnd <= logLo || base >= hi || base >= plan.end
                    || (allowed != null && !allowed.contains(base))) {
                continue;
            }
            long start = byQueues && base <= logLo ? logLo : base;
            own.add(new long[] {base, start, Math.min(segmentEnd, plan.end)});
            total += Math.min(segmentEnd, plan.end) - start;
        }
        for (QueuePlanner.Selected s : selected) {
            total += s.wantedBytes();
        }
        return total;
    }

    private static void closeQuietly(TierObjects objects) {
        if (objects != null) {
            try {
                objects.close();
            } catch (IOException e) {
                // only the planner's reads used it
            }
        }
    }

    /** The partitions of one store's records in [lo, hi) (both record starts): one streaming micro-batch. */
    static List<LogPartition> planStream(ReadOptions.StoreRef ref, long lo, long hi) {
        Segments segments = listSegments(ref.root);
        long first = segments.bases.length == 0 ? 0 : segments.bases[0];
        if (lo < first) {
            throw new UncheckedIOException(new IOException("store " + ref.root + ": the records from commitlog offset "
                    + lo + " were deleted by retention before this query read them (the log now starts at " + first
                    + ")"));
        }
        List<long[]> pieces = new ArrayList<>();
        for (long base : segments.bases) {
            long segmentEnd = base + segments.size;
            if (segmentEnd <= lo || base >= hi) {
                continue;
            }
            pieces.add(new long[] {base, Math.max(base, lo), Math.min(segmentEnd, hi)});
        }
        return group(new StorePlan(ref, segments, hi, -1), pieces, partitionTarget(hi - lo));
    }

    private static List<LogPartition> group(StorePlan plan, List<long[]> pieces, long target) {
        List<LogPartition> partitions = new ArrayList<>();
        List<long[]> current = new ArrayList<>();
        long currentBytes = 0;
        for (long[] piece : pieces) {
            for (long[] part : split(plan, piece, target)) {
                long length = part[2] - part[1];
                if (!current.isEmpty() && currentBytes + length > target) {
                    partitions.add(partition(plan, current));
                    current = new ArrayList<>();
                    currentBytes = 0;
                }
                current.add(part);
                currentBytes += length;
            }
        }
        if (!current.isEmpty()) {
            partitions.add(partition(plan, current));
        }
        return partitions;
    }

    private static LogPartition partition(StorePlan plan, List<long[]> parts) {
        long[] bases = new long[parts.size()];
        long[] starts = new long[parts.size()];
        long[] ends = new long[parts.size()];
        for (int i = 0; i < parts.size(); i++) {
            bases[i] = parts.get(i)[0];
            starts[i] = parts.get(i)[1];
            ends[i] = parts.get(i)[2];
        }
        return new LogPartition(plan.ref.root, plan.ref.label, plan.segments.size, plan.segments.tier,
                plan.segments.recordCrcFrom, bases, starts, ends);
    }

    /** Cut a long piece at record starts about `target` bytes apart. */
    private static List<long[]> split(StorePlan plan, long[] piece, long target) {
        List<long[]> parts = new ArrayList<>();
        long base = piece[0];
        long start = piece[1];
        long end = piece[2];
        if (end - start <= target * 3 / 2) {
            parts.add(piece);
            return parts;
        }
        try {
            long position = start;
            while (end - position > target * 3 / 2) {
                long cut = recordStartAtOrAfter(plan.segments, base, position + target, end);
                if (cut < 0) {
                    break;
                }
                parts.add(new long[] {base, position, cut});
                position = cut;
            }
            parts.add(new long[] {base, position, end});
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read segment " + plan.segments.name(base), e);
        }
        return parts;
    }

    /**
     * The first position at or after `wanted` (before `end`) where a message record of this segment starts: a
     * message magic code whose PHYSICALOFFSET is its own position and whose TOTALSIZE fits. Read CUT_WINDOW_BYTES
     * at a time (one range read of a tier's object), each window overlapping the last by a header.
     */
    static long recordStartAtOrAfter(Segments segments, long base, long wanted, long end) throws IOException {
        final int head = LogFormat.OFFSET_PHYSICAL_OFFSET + 8;  // the bytes a candidate needs
        long limit = Math.min(end - LogFormat.RECORD_SIZE_MIN, Math.addExact(wanted, CUT_SEARCH_BYTES_MAX));
        long from = wanted;
        while (from <= limit) {
            int length = (int) Math.min(CUT_WINDOW_BYTES, limit - from + head);
            byte[] window = segments.window(base, from - base, length);
            for (int i = 0; i + head <= length; i++) {
                long at = from + i;
                if (LogFormat.isMessageMagic(LogFormat.i32(window, i + LogFormat.OFFSET_MAGIC_CODE))
                        && LogFormat.i64(window, i + LogFormat.OFFSET_PHYSICAL_OFFSET) == at) {
                    int total = LogFormat.i32(window, i);
                    if (total >= LogFormat.RECORD_SIZE_MIN && at + total <= end) {
                        return at;
                    }
                }
            }
            from += length - head + 1;
        }
        return -1;
    }
}
