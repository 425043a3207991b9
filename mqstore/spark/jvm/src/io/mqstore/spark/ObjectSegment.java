package io.mqstore.spark;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * One segment of a tier, an object read by byte ranges ({@link TierObjects#readRange}) into the reader's buffer,
 * which the walk and the decoder then check and read exactly as they read a file's bytes.
 *
 * A walk announces its range ({@link #readAhead}); from then on the segment keeps one range of READ_AHEAD_BYTES
 * in flight on a pool thread: the range a walk's next read asks for, since a walk reads its piece in order, each
 * read starting where the previous one ended (LogReader.ensure). So the object store's latency and transfer
 * overlap the decoding of the previous range. A read that does not start where the range in flight does reads
 * by itself (the range is dropped, and so is its error: the walk never asked for it). The range in flight and
 * the reader's own reads never run at once: every read, and close, first waits for it, so one TierObjects serves
 * both.
 */
final class ObjectSegment implements Segment {
    static final int READ_AHEAD_BYTES = LogReader.READ_CHUNK_BYTES;  // what a walk reads at once
    private static final ExecutorService READ_AHEAD = Executors.newCachedThreadPool(task -> {
        Thread thread = new Thread(task, "mqstore-tier-read-ahead");
        thread.setDaemon(true);
        return thread;
    });

    private final TierObjects objects;
    private final String key;
    private final String name;
    private final long base;
    private final long size;
    private long aheadEnd = -1;  // the announced walk's end, a position in the object; -1: none
    private Future<byte[]> ahead;  // the range in flight, [aheadAt, aheadAt + its length)
    private long aheadAt;
    private byte[] spare;  // the last range's array, for the next one of the same length

    ObjectSegment(TierObjects objects, TierLocation location, long base, long size) {
        this.objects = objects;
        this.key = TierManifest.segmentKey(base);
        this.name = location.display(key);
        this.base = base;
        this.size = size;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public void readAhead(long from, long end) {
        aheadEnd = Math.min(end - base, size);
        start(from - base);
    }

    private void start(long filePos) {
        if (ahead != null || aheadEnd < 0 || filePos >= aheadEnd) {
            return;
        }
        int count = (int) Math.min(READ_AHEAD_BYTES, aheadEnd - filePos);
        byte[] into = spare != null && spare.length == count ? spare : new byte[count];
        spare = null;
        aheadAt = filePos;
        ahead = READ_AHEAD.submit(() -> {
            objects.readRange(key, filePos, into, 0, count);
            return into;
        });
    }

    /** The range in flight once it is read, or null when it did not start at `filePos` (its error dropped). */
    private byte[] awaitAhead(long filePos) throws IOException {
        if (ahead == null) {
            return null;
        }
        Future<byte[]> pending = ahead;
        ahead = null;
        boolean wanted = aheadAt == filePos;
        try {
            return wanted ? pending.get() : null;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted reading " + name);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof RuntimeException) {
                throw (RuntimeException) cause;  // CorruptLogException: the object is short or missing
            }
            throw cause instanceof IOException ? (IOException) cause : new IOException("reading " + name, cause);
        } finally {
            if (!wanted) {
                finish(pending);
            }
        }
    }

    private static void finish(Future<byte[]> pending) {
        try {
            pending.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (ExecutionException e) {
            // a range nobody asked for
        }
    }

    @Override
    public void read(long at, byte[] into, int intoAt, int count, String what) throws IOException {
        long filePos = at - base;
        if (filePos < 0 || filePos > size - count) {
            throw new IOException("segment " + name + " holds " + size + " bytes, not [" + filePos + ", "
                    + (filePos + count) + ") for " + what);
        }
        int done = 0;
        byte[] fetched = awaitAhead(filePos);
        if (fetched != null) {
            done = Math.min(count, fetched.length);
            System.arraycopy(fetched, 0, into, intoAt, done);
            spare = fetched;
        }
        if (done < count) {
            objects.readRange(key, filePos + done, into, intoAt + done, count - done);
        }
        start(filePos + count);
    }

    @Override
    public int i32(long at, int missing) throws IOException {
        long filePos = at - base;
        if (filePos < 0 || filePos > size - 4) {
            return missing;
        }
        byte[] four = new byte[4];
        awaitAhead(-1);
        objects.readRange(key, filePos, four, 0, 4);
        return LogFormat.i32(four, 0);
    }

    @Override
    public void copy(long at, byte[] into, int count, String what) throws IOException {
        awaitAhead(-1);
        read(at, into, 0, count, what);
    }

    @Override
    public void close() throws IOException {
        if (ahead != null) {
            finish(ahead);  // not interrupted: an interrupt would close a file channel under the next reader
            ahead = null;
        }
    }
}
