package io.mqstore.spark;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayDeque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * One segment of a tier, an object read by byte ranges ({@link TierObjects#readRange}) into the reader's buffer,
 * which the walk and the decoder then check and read exactly as they read a file's bytes.
 *
 * A walk announces its range ({@link #readAhead}); from then on the segment keeps up to READ_AHEAD_RANGES ranges
 * of RANGE_BYTES in flight on pool threads, the next ones of the walk: a walk reads its piece in order, each
 * read starting where the previous one ended (LogReader.ensure, RANGE_BYTES at a time), so the object store's
 * latency and transfer overlap the decoding, and a task waits for one range only at the start of a piece. A
 * read that does not start where the ranges in flight do reads by itself (those ranges are dropped, and so are
 * their errors: the walk never asked for them). Ranges are read one after another (parallel GETs were slower
 * against the test server, decision 0051), and the segment's own reads and its close first wait for them, so
 * one TierObjects serves them all.
 */
final class ObjectSegment implements Segment {
    // one GET, as much as a local walk reads at once; 4 MiB ranges, four in flight, measured slower (decision 0051)
    static final int RANGE_BYTES = LogReader.READ_CHUNK_BYTES;
    static final int READ_AHEAD_RANGES = 2;  // in flight a segment: the next two of the walk
    private static final ExecutorService READ_AHEAD = Executors.newCachedThreadPool(task -> {
        Thread thread = new Thread(task, "mqstore-tier-read-ahead");
        thread.setDaemon(true);
        return thread;
    });

    /** A range of the object in flight: [at, at + length), its bytes once read. */
    private static final class Range {
        final long at;
        final int length;
        final Future<byte[]> bytes;

        Range(long at, int length, Future<byte[]> bytes) {
            this.at = at;
            this.length = length;
            this.bytes = bytes;
        }
    }

    private final TierObjects objects;
    private final String key;
    private final String name;
    private final long base;
    private final long size;
    private final ArrayDeque<byte[]> spare;  // the arrays of ranges read, for the next ranges (the reader's)
    private final ArrayDeque<Range> ahead = new ArrayDeque<>();  // in order, contiguous
    private long aheadEnd = -1;  // the announced walk's end, a position in the object; -1: none
    private long aheadNext;  // where the next range to start begins
    private byte[] head;  // the first range's bytes once awaited
    private int headUsed;  // of them, those already handed out

    ObjectSegment(TierObjects objects, TierLocation location, long base, long size, ArrayDeque<byte[]> spare) {
        this.objects = objects;
        this.key = TierManifest.segmentKey(base);
        this.name = location.display(key);
        this.base = base;
        this.size = size;
        this.spare = spare;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public int readBytes() {
        return RANGE_BYTES;
    }

    @Override
    public void readAhead(long from, long end) {
        drop();
        aheadEnd = Math.min(end - base, size);
        aheadNext = from - base;
        refill();
    }

    /** Start ranges until READ_AHEAD_RANGES are in flight or the announced end is reached. */
    private void refill() {
        while (ahead.size() < READ_AHEAD_RANGES && aheadNext < aheadEnd) {
            long at = aheadNext;
            int length = (int) Math.min(RANGE_BYTES, aheadEnd - at);
            byte[] pooled = spare.poll();
            byte[] into = pooled != null && pooled.length == length ? pooled : new byte[length];
            Future<byte[]> previous = ahead.isEmpty() ? null : ahead.peekLast().bytes;
            ahead.add(new Range(at, length, READ_AHEAD.submit(() -> {
                if (previous != null) {
                    previous.get();  // one range at a time: these objects serve one thread at once
                }
                objects.readRange(key, at, into, 0, length);
                return into;
            })));
            aheadNext = at + length;
        }
    }

    private byte[] await(Range range) throws IOException {
        try {
            return range.bytes.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted reading " + name);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof ExecutionException && cause.getCause() != null) {
                cause = cause.getCause();  // the range before it failed: the same error
            }
            if (cause instanceof RuntimeException) {
                throw (RuntimeException) cause;  // CorruptLogException: the object is short or missing
            }
            throw cause instanceof IOException ? (IOException) cause : new IOException("reading " + name, cause);
        }
    }

    /** Drop the ranges in flight once they are done (their errors with them): nobody asked for them. */
    private void drop() {
        for (Range range : ahead) {
            try {
                range.bytes.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            } catch (ExecutionException e) {
                // a range the walk did not ask for
            }
        }
        ahead.clear();
        head = null;
        headUsed = 0;
    }

    @Override
    public void read(long at, byte[] into, int intoAt, int count, String what) throws IOException {
        long filePos = at - base;
        if (filePos < 0 || filePos > size - count) {
            throw new IOException("segment " + name + " holds " + size + " bytes, not [" + filePos + ", "
                    + (filePos + count) + ") for " + what);
        }
        if (!ahead.isEmpty() && ahead.peekFirst().at + headUsed != filePos) {
            drop();  // not where the walk was going: read by itself, then read ahead from its end
            aheadNext = filePos + count;
        }
        int done = 0;
        while (done < count && !ahead.isEmpty()) {
            Range first = ahead.peekFirst();
            if (head == null) {
                head = await(first);
            }
            int take = Math.min(count - done, first.length - headUsed);
            System.arraycopy(head, headUsed, into, intoAt + done, take);
            done += take;
            headUsed += take;
            if (headUsed == first.length) {
                ahead.pollFirst();
                if (spare.size() < READ_AHEAD_RANGES) {
                    spare.offer(head);
                }
                head = null;
                headUsed = 0;
            }
        }
        if (done < count) {
            objects.readRange(key, filePos + done, into, intoAt + done, count - done);
            aheadNext = Math.max(aheadNext, filePos + count);
        }
        refill();
    }

    @Override
    public int i32(long at, int missing) throws IOException {
        long filePos = at - base;
        if (filePos < 0 || filePos > size - 4) {
            return missing;
        }
        byte[] four = new byte[4];
        drop();
        objects.readRange(key, filePos, four, 0, 4);
        return LogFormat.i32(four, 0);
    }

    @Override
    public void copy(long at, byte[] into, int count, String what) throws IOException {
        drop();
        read(at, into, 0, count, what);
    }

    @Override
    public void close() {
        drop();  // waited for, not interrupted: an interrupt would close a file channel under the next reader
    }
}
