package io.mqstore.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.zip.CRC32;

/**
 * Where a store's log ends now, for {@link Planner}'s snapshot (scan_plan.py's rules): the ConsumeQueues'
 * verified furthest unit, where the walk to the written end may start, and that walk (rules 1 to 4 on every
 * record, the body CRCs of the last TAIL_CRC_RECORDS, the first that fails ending the snapshot).
 */
final class LogEnd {
    private LogEnd() {
    }

    static final int TAIL_CRC_RECORDS = 64;
    static final int CQ_UNIT_SIZE = 20;  // i64 commitlog offset, i32 size, i64 tags code (consumequeue/format.py)
    // scan_read.py's: bytes after a stop searched for a record start (4 MiB + 64 KiB, the default longest
    // message), and the zeros from the stop that end the log without that longer search
    static final int DAMAGE_LOOKAHEAD_BYTES = (4 << 20) + (64 << 10);
    static final int DAMAGE_ZEROS_END_BYTES = 64 << 10;
    static final int CHECKPOINT_FIELDS_BYTES = 48;  // flush/checkpoint.py: six big-endian i64
    static final int CHECKPOINT_FLUSHED_AT = 24;  // physic_flushed_offset

    /**
     * The end of the ConsumeQueues' furthest unit, when the record it points to is there (magic, TOTALSIZE and
     * PHYSICALOFFSET as the unit says), else -1: the walk to the written end starts there instead of at the
     * segment's start, as scan_plan._verified_dispatched_end does.
     */
    static long dispatchedEnd(String root, Planner.Segments segments) {
        if (segments.bases.length == 0) {
            return -1;
        }
        long bestEnd = -1;
        long bestOffset = -1;
        int bestSize = 0;
        Path queues = Paths.get(root, "consumequeue");
        if (!Files.isDirectory(queues)) {
            return -1;
        }
        try (DirectoryStream<Path> topics = Files.newDirectoryStream(queues)) {
            for (Path topic : topics) {
                if (!Files.isDirectory(topic)) {
                    continue;
                }
                try (DirectoryStream<Path> ids = Files.newDirectoryStream(topic)) {
                    for (Path queue : ids) {
                        long[] last = lastUnit(queue);
                        if (last != null && last[0] >= 0 && last[0] <= Long.MAX_VALUE - last[1]
                                && last[0] + last[1] > bestEnd) {  // units are untrusted: no overflow
                            bestEnd = last[0] + last[1];
                            bestOffset = last[0];
                            bestSize = (int) last[1];
                        }
                    }
                }
            }
        } catch (IOException e) {
            return -1;  // only a shortcut: the walk starts at the segment's start
        }
        long first = segments.bases[0];
        long base = bestOffset - Math.floorMod(bestOffset - first, segments.size);
        if (bestOffset < first || base > segments.bases[segments.bases.length - 1]
                || bestEnd > base + segments.size) {
            return -1;
        }
        try (FileChannel channel = FileChannel.open(segments.path(base), StandardOpenOption.READ)) {
            ByteBuffer head = ByteBuffer.allocate(LogFormat.OFFSET_PHYSICAL_OFFSET + 8);
            channel.read(head, bestOffset - base);
            if (head.position() < head.capacity() || head.getInt(0) != bestSize
                    || !LogFormat.isMessageMagic(head.getInt(LogFormat.OFFSET_MAGIC_CODE))
                    || head.getLong(LogFormat.OFFSET_PHYSICAL_OFFSET) != bestOffset) {
                return -1;
            }
        } catch (IOException e) {
            return -1;
        }
        return bestEnd;
    }

    /** {commitlog offset, size} of the last written unit of a queue directory's last file, or null. */
    private static long[] lastUnit(Path queue) throws IOException {
        if (!Files.isDirectory(queue)) {
            return null;
        }
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(queue)) {
            for (Path entry : entries) {
                if (LogFormat.parseSegmentName(entry.getFileName().toString()) >= 0) {
                    files.add(entry);
                }
            }
        }
        files.sort(null);
        for (int i = files.size() - 1; i >= 0; i--) {
            try (FileChannel channel = FileChannel.open(files.get(i), StandardOpenOption.READ)) {
                long lo = 0;
                long hi = channel.size() / CQ_UNIT_SIZE;  // units [0, lo) are written, [hi, ...) not
                ByteBuffer unit = ByteBuffer.allocate(CQ_UNIT_SIZE);
                while (lo < hi) {
                    long mid = (lo + hi) >>> 1;
                    if (unitSize(channel, mid, unit) > 0) {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                if (lo > 0 && unitSize(channel, lo - 1, unit) > 0) {
                    return new long[] {unit.getLong(0), unit.getInt(8)};
                }
            }
        }
        return null;
    }

    private static int unitSize(FileChannel channel, long index, ByteBuffer unit) throws IOException {
        unit.clear();
        while (unit.hasRemaining()) {
            if (channel.read(unit, index * CQ_UNIT_SIZE + unit.position()) < 0) {
                return 0;
            }
        }
        return unit.getInt(8);
    }

    /**
     * The written end of the log: the last segment whose first header is not zero, walked to its end from its
     * start, or from `dispatched` (a record start, the furthest one known) when that lies in it.
     */
    static long writtenEnd(Planner.Segments segments, long dispatched) {
        if (segments.bases.length == 0) {
            return 0;
        }
        for (int i = segments.bases.length - 1; i >= 0; i--) {
            long base = segments.bases[i];
            try (FileChannel channel = FileChannel.open(segments.path(base), StandardOpenOption.READ)) {
                ByteBuffer head = ByteBuffer.allocate(LogFormat.END_FILE_MIN_BLANK_LENGTH);
                channel.read(head, 0);
                if (head.getLong(0) != 0) {
                    long start = base < dispatched && dispatched <= base + segments.size ? dispatched : base;
                    if (start == base + segments.size) {
                        return start;
                    }
                    return walkToEnd(channel, segments.path(base).toString(), base, segments.size, start);
                }
            } catch (IOException e) {
                throw new UncheckedIOException("cannot read segment " + segments.path(base), e);
            }
        }
        return segments.bases[0];
    }

    private static long walkToEnd(FileChannel channel, String path, long base, long size, long start)
            throws IOException {
        MappedByteBuffer map = channel.map(FileChannel.MapMode.READ_ONLY, 0, size);
        long[] recent = new long[TAIL_CRC_RECORDS];  // positions of the last records walked, a ring
        byte[][] scratch = {new byte[64 * 1024]};
        int walked = 0;
        int pos = (int) (start - base);
        long end;
        while (true) {
            long remaining = size - pos;
            if (remaining < LogFormat.END_FILE_MIN_BLANK_LENGTH) {
                end = base + pos;
                break;
            }
            int total = map.getInt(pos);
            int magic = map.getInt(pos + LogFormat.OFFSET_MAGIC_CODE);
            if (magic == LogFormat.BLANK_MAGIC_CODE && total == remaining) {
                end = base + size;
                break;
            }
            if (!structureValid(map, pos, remaining, base + pos, scratch)) {
                end = base + pos;
                break;
            }
            recent[walked++ % TAIL_CRC_RECORDS] = pos;
            pos += total;
        }
        if (end < base + size) {
            refuseDamageBeforeRecords(map, path, base, size, end);
        }
        // the body CRCs of the last records: the first that fails is a record still being written
        int first = Math.max(0, walked - TAIL_CRC_RECORDS);
        CRC32 crc = new CRC32();
        for (int k = first; k < walked; k++) {
            int at = (int) recent[k % TAIL_CRC_RECORDS];
            if (base + at >= end) {
                break;
            }
            LogFormat.Layout layout = new LogFormat.Layout();
            byte[] record = new byte[map.getInt(at)];
            map.get(at, record);
            layout.locate(record, 0, size - at, base + at, path, at);
            crc.reset();
            crc.update(record, layout.bodyStart, layout.bodyLength);
            if (((int) crc.getValue() & 0x7FFFFFFF) != LogFormat.i32(record, LogFormat.OFFSET_BODY_CRC)) {
                end = base + at;
                break;
            }
        }
        return end;
    }

    /**
     * scan_read._refuse_damage_before_records: the walk stopped at `end`, where no record could be taken. A record
     * start (a message magic code whose PHYSICALOFFSET names its own place) within DAMAGE_LOOKAHEAD_BYTES after it
     * says the log goes on: the record at `end` is checked again (a writer may have finished it since) and, when it
     * still breaks rules 1 to 4, their CorruptLogException is thrown. DAMAGE_ZEROS_END_BYTES of zeros from `end`
     * are the end without the longer search.
     */
    private static void refuseDamageBeforeRecords(MappedByteBuffer map, String path, long base, long size,
                                                  long end) {
        int from = (int) (end - base);
        int want = (int) Math.min(size - from, DAMAGE_LOOKAHEAD_BYTES);
        int zeros = Math.min(want, DAMAGE_ZEROS_END_BYTES);
        boolean allZero = true;
        for (int i = 0; i < zeros && allZero; i++) {
            allZero = map.get(from + i) == 0;
        }
        if (allZero) {
            return;
        }
        byte[] raw = new byte[want];
        map.get(from, raw);
        if (recordStartAfter(raw, end)) {
            new LogFormat.Layout().locate(raw, 0, want, end, path, from);
        }
    }

    /** Whether `raw` (log bytes from commitlog offset rawAbs) holds a record start after its first byte. */
    static boolean recordStartAfter(byte[] raw, long rawAbs) {
        for (int start = 1; start + LogFormat.OFFSET_PHYSICAL_OFFSET + 8 <= raw.length; start++) {
            if (LogFormat.isMessageMagic(LogFormat.i32(raw, start + LogFormat.OFFSET_MAGIC_CODE))
                    && LogFormat.i64(raw, start + LogFormat.OFFSET_PHYSICAL_OFFSET) == rawAbs + start) {
                return true;
            }
        }
        return false;
    }

    /**
     * scan_read.checkpoint_flushed_offset: the commitlog offset below which the store's checkpoint says the log is
     * on disk, or -1 when it cannot say (no checkpoint, one too short, the marker of a checkpoint found damaged,
     * no offset: RocketMQ 4.4.0 keeps none). Read it before the log's files.
     */
    static long checkpointFlushed(String root) {
        if (Files.exists(Paths.get(root, "checkpoint.damaged"))) {
            return -1;
        }
        try (FileChannel channel = FileChannel.open(Paths.get(root, "checkpoint"), StandardOpenOption.READ)) {
            ByteBuffer head = ByteBuffer.allocate(CHECKPOINT_FIELDS_BYTES);
            while (head.hasRemaining() && channel.read(head) >= 0) {
                // read on to the fields' end or the file's
            }
            long flushed = head.hasRemaining() ? 0 : head.getLong(CHECKPOINT_FLUSHED_AT);
            return flushed > 0 ? flushed : -1;
        } catch (IOException e) {
            return -1;
        }
    }

    /**
     * scan_read.refuse_stop_below_flushed: a walk that stopped below the offset the checkpoint says was flushed,
     * inside the log's files, stopped at damage, not at the end (docs/recovery.md).
     */
    static void refuseStopBelowFlushed(Planner.Segments segments, long end, long flushed) {
        int count = segments.bases.length;
        if (flushed <= end || count == 0 || flushed > segments.bases[count - 1] + segments.size) {
            return;
        }
        long base = segments.bases[0];
        for (long candidate : segments.bases) {
            if (candidate <= end) {
                base = candidate;
            }
        }
        throw new CorruptLogException("the log's walk stops at commitlog offset " + end + ", inside the written part "
                + "of the log: the checkpoint says the log was flushed to " + flushed, segments.path(base).toString(),
                end - base, "commitlog.end");
    }

    /** Rules (1) to (4) for the record at `pos` of a mapped segment (false where the Python walk stops). */
    private static boolean structureValid(MappedByteBuffer map, int pos, long remaining, long offset,
                                          byte[][] scratch) {
        int total = map.getInt(pos);
        if (!LogFormat.isMessageMagic(map.getInt(pos + LogFormat.OFFSET_MAGIC_CODE))
                || total < LogFormat.RECORD_SIZE_MIN || total > remaining
                || map.getLong(pos + LogFormat.OFFSET_PHYSICAL_OFFSET) != offset) {
            return false;
        }
        if (scratch[0].length < total) {
            scratch[0] = new byte[total];
        }
        byte[] record = scratch[0];
        map.get(pos, record, 0, total);
        try {
            new LogFormat.Layout().locate(record, 0, total, offset, "", pos);
            return true;
        } catch (CorruptLogException e) {
            return false;
        }
    }

}
