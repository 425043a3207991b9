package io.mqstore.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * One segment of a local store open for a reader, read two ways. A walk reads windows with pread ({@link #read}): the kernel's
 * copy of a long run is the cheapest on this path, and a mapping walked once pays a page fault a few pages
 * (measured: docs/decisions/0046). A ConsumeQueue read copies each record its unit points to out of a read-only
 * mapping ({@link #copy}): no system call a record and none of the bytes between records, which a pread of
 * runs of close records copied (1 record in 16 of a log, the rest read for nothing). The mapping covers the file
 * as it was when first needed, at most the store's segment size; a copy past it is an IOException naming the
 * segment, as a short pread is; a file truncated under the mapping makes the copy fault (InternalError in the
 * JVM), also reported as an IOException.
 */
final class SegmentMap implements Segment {
    final String path;
    final long base;  // the commitlog offset of byte 0
    private final long segmentSize;
    private final FileChannel channel;
    private MappedByteBuffer map;  // made on the first copy
    private long mapped;  // bytes mapped

    private SegmentMap(String path, long base, long segmentSize, FileChannel channel) {
        this.path = path;
        this.base = base;
        this.segmentSize = segmentSize;
        this.channel = channel;
    }

    static SegmentMap open(Path file, long base, long segmentSize) throws IOException {
        try {
            return new SegmentMap(file.toString(), base, segmentSize, FileChannel.open(file, StandardOpenOption.READ));
        } catch (NoSuchFileException e) {
            throw new UncheckedIOException("segment " + file + " was deleted while the read was running (retention?)",
                    e);
        }
    }

    @Override
    public String name() {
        return path;
    }

    /** Read with pread; IOException when the file ends first. */
    @Override
    public void read(long at, byte[] into, int intoAt, int count, String what) throws IOException {
        ByteBuffer buffer = ByteBuffer.wrap(into, intoAt, count);
        long filePos = at - base;
        while (buffer.hasRemaining()) {
            long position = filePos + buffer.position() - intoAt;
            if (channel.read(buffer, position) < 0) {
                throw new IOException("segment " + path + " ends at byte " + position + ", before " + what
                        + ": was it truncated or replaced?");
            }
        }
    }

    /** The big-endian i32 at commitlog offset `at` of the mapping, or `missing` when the file ends before it. */
    @Override
    public int i32(long at, int missing) throws IOException {
        long filePos = at - base;
        if (filePos < 0 || filePos + 4 > mapping()) {
            return missing;
        }
        try {
            return map.getInt((int) filePos);
        } catch (InternalError e) {
            throw truncated(filePos, e);
        }
    }

    /** Copy from the mapping; IOException when the file ends first. */
    @Override
    public void copy(long at, byte[] into, int count, String what) throws IOException {
        long filePos = at - base;
        assert filePos >= 0 && count >= 0 && count <= into.length : "a copy inside the segment";
        if (filePos + count > mapping()) {
            throw new IOException("segment " + path + " ends at byte " + mapped + ", before " + what
                    + ": was it truncated or replaced?");
        }
        try {
            map.get((int) filePos, into, 0, count);
        } catch (InternalError e) {
            throw truncated(filePos, e);
        }
    }

    private long mapping() throws IOException {
        if (map == null) {
            mapped = Math.min(channel.size(), segmentSize);
            assert mapped <= Integer.MAX_VALUE : "segment sizes are checked at planning";
            map = channel.map(FileChannel.MapMode.READ_ONLY, 0, mapped);
        }
        return mapped;
    }

    private IOException truncated(long filePos, InternalError cause) {
        return new IOException("segment " + path + " became shorter than byte " + filePos + " while the read was "
                + "running: was it truncated or replaced?", cause);
    }

    @Override
    public void close() throws IOException {
        channel.close();  // the mapping, if any, stays valid until collected
    }
}
