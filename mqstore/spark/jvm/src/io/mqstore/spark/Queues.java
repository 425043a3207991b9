package io.mqstore.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A store's ConsumeQueues as the planner and the reader use them (mqstore/store/store_files.py's QueueIndex and
 * consumequeue/format.py's 20-byte unit: i64 commitlog offset, i32 size, i64 tags code, big-endian). Files are
 * named by the byte position of their first unit (20 digits); a queue ends at its first unit of size 0; a
 * negative size is damage (rule consumequeue.1); units of size FILLER_SIZE at the start of a queue's first file
 * stand for entries before the queue began and are not entries.
 */
final class Queues {
    static final int UNIT_SIZE = 20;
    static final int FILLER_SIZE = 0x7FFFFFFF;
    static final String MARK_FILE = "dispatched_offset";  // consumequeue/mark.py: a big-endian i64 in config/

    private final Path directory;
    private List<Object[]> queues;  // {topic, queue id, directory}
    private final Map<Path, long[]> firstOffsets = new HashMap<>();

    Queues(String root) {
        this.directory = Paths.get(root, "consumequeue");
    }

    /** {topic, queue id (Integer), directory (Path)} of every queue, sorted by topic then id. */
    List<Object[]> queues() {
        if (queues != null) {
            return queues;
        }
        queues = new ArrayList<>();
        if (!Files.isDirectory(directory)) {
            return queues;
        }
        try (DirectoryStream<Path> topics = Files.newDirectoryStream(directory)) {
            for (Path topic : topics) {
                if (!Files.isDirectory(topic)) {
                    continue;
                }
                try (DirectoryStream<Path> ids = Files.newDirectoryStream(topic)) {
                    for (Path queue : ids) {
                        String name = queue.getFileName().toString();
                        if (!name.isEmpty() && name.length() <= 9 && name.chars().allMatch(Character::isDigit)) {
                            queues.add(new Object[] {topic.getFileName().toString(), Integer.parseInt(name), queue});
                        }
                    }
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException("cannot list the ConsumeQueues in " + directory, e);
        }
        queues.sort((a, b) -> {
            int byTopic = ((String) a[0]).compareTo((String) b[0]);
            return byTopic != 0 ? byTopic : Integer.compare((Integer) a[1], (Integer) b[1]);
        });
        return queues;
    }

    /** The queue's files as {first entry number, ...} and their paths, ascending. */
    static List<Path> files(Path queue, List<Long> firstEntries) {
        List<long[]> found = new ArrayList<>();
        Map<Long, Path> paths = new HashMap<>();
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(queue)) {
            for (Path entry : entries) {
                long start = LogFormat.parseSegmentName(entry.getFileName().toString());
                if (start >= 0 && start % UNIT_SIZE == 0) {
                    found.add(new long[] {start / UNIT_SIZE});
                    paths.put(start / UNIT_SIZE, entry);
                }
            }
        } catch (NoSuchFileException e) {
            return new ArrayList<>();
        } catch (IOException e) {
            throw new UncheckedIOException("cannot list ConsumeQueue " + queue, e);
        }
        found.sort((a, b) -> Long.compare(a[0], b[0]));
        List<Path> result = new ArrayList<>();
        for (long[] f : found) {
            firstEntries.add(f[0]);
            result.add(paths.get(f[0]));
        }
        return result;
    }

    /** Units of one file: {offsets, sizes} of [first, first+count) (count < 0: to the end), cut at the queue's end. */
    static long[][] readUnits(Path path, long first, long count) {
        byte[] raw;
        try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
            long from = Math.multiplyExact(first, UNIT_SIZE);
            long available = Math.max(0, channel.size() - from) / UNIT_SIZE;
            long take = count < 0 ? available : Math.min(count, available);
            if (take > Integer.MAX_VALUE / UNIT_SIZE) {
                throw new CorruptLogException("ConsumeQueue file is " + channel.size() + " bytes", path.toString(), 0,
                        "consumequeue.size");
            }
            ByteBuffer buffer = ByteBuffer.allocate((int) take * UNIT_SIZE);
            while (buffer.hasRemaining()) {
                if (channel.read(buffer, from + buffer.position()) < 0) {
                    break;
                }
            }
            raw = buffer.array();
        } catch (NoSuchFileException e) {
            return new long[][] {new long[0], new long[0]};
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read ConsumeQueue file " + path, e);
        }
        int n = raw.length / UNIT_SIZE;
        long[] offsets = new long[n];
        long[] sizes = new long[n];
        int written = n;
        for (int i = 0; i < n; i++) {
            int size = LogFormat.i32(raw, i * UNIT_SIZE + 8);
            if (size <= 0) {
                if (size < 0) {
                    throw new CorruptLogException("queue entry has size " + size, path.toString(),
                            (first + i) * UNIT_SIZE, "consumequeue.1");
                }
                written = i;
                break;
            }
            offsets[i] = LogFormat.i64(raw, i * UNIT_SIZE);
            sizes[i] = size;
        }
        return new long[][] {java.util.Arrays.copyOf(offsets, written), java.util.Arrays.copyOf(sizes, written)};
    }

    private long[] firstOffsets(Path queue, List<Path> files) {
        long[] cached = firstOffsets.get(queue);
        if (cached == null || cached.length != files.size()) {
            cached = new long[files.size()];
            for (int i = 0; i < files.size(); i++) {
                long[][] units = readUnits(files.get(i), 0, 1);
                cached[i] = units[0].length > 0 ? units[0][0] : 1L << 62;
            }
            firstOffsets.put(queue, cached);
        }
        return cached;
    }

    /** One queue's entries with commitlog offsets in [lo, hi): {first entry number}, offsets, sizes. */
    long[][] entries(Path queue, long lo, long hi) {
        List<Long> numbers = new ArrayList<>();
        List<Path> files = files(queue, numbers);
        long[] none = new long[0];
        if (files.isEmpty()) {
            return new long[][] {{0}, none, none};
        }
        long[] firsts = firstOffsets(queue, files);
        int start = Math.max(upperBound(firsts, lo) - 1, 0);
        int stop = lowerBound(firsts, hi);
        long firstNumber = -1;
        List<long[][]> parts = new ArrayList<>();
        for (int f = start; f < Math.max(stop, start + 1); f++) {
            long[][] units = readUnits(files.get(f), 0, -1);
            int a = lowerBound(units[0], lo);
            int b = lowerBound(units[0], hi);
            if (units[1].length > 0 && units[1][0] == FILLER_SIZE) {  // a queue that starts late: not entries
                int fillers = 0;
                while (fillers < units[1].length && units[1][fillers] == FILLER_SIZE) {
                    fillers++;
                }
                a = Math.max(a, fillers);
            }
            if (a < b) {
                if (firstNumber < 0) {
                    firstNumber = numbers.get(f) + a;
                }
                parts.add(new long[][] {java.util.Arrays.copyOfRange(units[0], a, b),
                    java.util.Arrays.copyOfRange(units[1], a, b)});
            }
        }
        if (parts.isEmpty()) {
            return new long[][] {{0}, none, none};
        }
        int total = parts.stream().mapToInt(p -> p[0].length).sum();
        long[] offsets = new long[total];
        long[] sizes = new long[total];
        int at = 0;
        for (long[][] p : parts) {
            System.arraycopy(p[0], 0, offsets, at, p[0].length);
            System.arraycopy(p[1], 0, sizes, at, p[1].length);
            at += p[0].length;
        }
        return new long[][] {{firstNumber}, offsets, sizes};
    }

    /** Units [first, first+count) of a queue for the reader; CorruptLogException when fewer are written. */
    static long[][] range(Path queue, long first, int count) {
        List<Long> numbers = new ArrayList<>();
        List<Path> files = files(queue, numbers);
        long[] offsets = new long[count];
        long[] sizes = new long[count];
        int done = 0;
        long number = first;
        while (done < count) {
            int index = upperBound(numbers, number) - 1;
            if (index < 0) {
                throw new UncheckedIOException(new IOException("ConsumeQueue file of entry " + number + " in " + queue
                        + " was deleted while the read was running"));
            }
            long take = count - done;
            if (index + 1 < numbers.size()) {
                take = Math.min(take, numbers.get(index + 1) - number);
            }
            long[][] got = readUnits(files.get(index), number - numbers.get(index), take);
            if (got[0].length < take) {
                throw new CorruptLogException("ConsumeQueue holds " + got[0].length + " of the " + take
                        + " units planned from entry " + number, files.get(index).toString(),
                        (number - numbers.get(index)) * UNIT_SIZE, "consumequeue.matches-log");
            }
            System.arraycopy(got[0], 0, offsets, done, got[0].length);
            System.arraycopy(got[1], 0, sizes, done, got[1].length);
            done += got[0].length;
            number += got[0].length;
        }
        return new long[][] {offsets, sizes};
    }

    /**
     * The dispatched mark an mqstore writer publishes (consumequeue/mark.py): -2 without the file (no mqstore
     * writer has the store open), 0 when it is short or unreadable, else the offset (at least 0).
     */
    static long readMark(String root) {
        Path path = Paths.get(root, "config", MARK_FILE);
        try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
            if (channel.size() < 8) {
                return 0;
            }
            MappedByteBuffer map = channel.map(FileChannel.MapMode.READ_ONLY, 0, 8);
            return Math.max(map.getLong(0), 0);  // one 8-byte load: the writer stores the word at once
        } catch (NoSuchFileException e) {
            return -2;
        } catch (IOException e) {
            return 0;
        }
    }

    static int lowerBound(long[] sorted, long value) {
        int lo = 0;
        int hi = sorted.length;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (sorted[mid] < value) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    static int upperBound(long[] sorted, long value) {
        int lo = 0;
        int hi = sorted.length;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (sorted[mid] <= value) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    private static int upperBound(List<Long> sorted, long value) {
        long[] values = sorted.stream().mapToLong(Long::longValue).toArray();
        return upperBound(values, value);
    }
}
