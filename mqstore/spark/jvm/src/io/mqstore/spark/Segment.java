package io.mqstore.spark;

import java.io.IOException;

/**
 * One segment of the log open for a reader: a mapped file of a local store ({@link SegmentMap}) or an object of a
 * tier read by byte ranges ({@link ObjectSegment}). The reader's walk and decoder read the bytes these put in
 * its buffer and check every one as they check a file's; {@link #name} is what errors name (the file's path, or
 * the object's URI).
 */
interface Segment extends AutoCloseable {
    /** The file's path or the object's shown URI. */
    String name();

    /**
     * The walk will read [from, end) of the log in order, one {@link #read} after another: a range-read segment
     * starts fetching ahead. Optional.
     */
    default void readAhead(long from, long end) {
    }

    /** How many bytes a walk reads at once: LogReader.READ_CHUNK_BYTES from a file, a range from an object. */
    default int readBytes() {
        return LogReader.READ_CHUNK_BYTES;
    }

    /** Read [at, at + count) of the log into into[intoAt, intoAt + count); IOException when the file ends first. */
    void read(long at, byte[] into, int intoAt, int count, String what) throws IOException;

    /** The big-endian i32 at commitlog offset `at`, or `missing` when the segment ends before it. */
    int i32(long at, int missing) throws IOException;

    /** Copy [at, at + count) of the log into into[0, count) (one record a ConsumeQueue unit points at). */
    void copy(long at, byte[] into, int count, String what) throws IOException;

    @Override
    void close() throws IOException;
}
