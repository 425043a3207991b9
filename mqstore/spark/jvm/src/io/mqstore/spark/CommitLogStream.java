package io.mqstore.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * Structured Streaming micro-batches, as mqstore/spark/source.py's CommitLogStreamReader makes them: the offset
 * is {"stores": {"/abs/store": commitlog offset}}, the offset up to which each store has been read, always a
 * record start (or a segment end), so the Python source's checkpoints and these are the same JSON. A store the
 * offset does not know is read from its beginning; maxRecordsPerTrigger / maxBytesPerTrigger count log records
 * (before filters), shared between the stores with new records, at least one record a micro-batch;
 * Trigger.AvailableNow reads up to each store's written end when the query starts.
 */
final class CommitLogStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    static final String INITIAL_OFFSETS_FILE = "initial-offsets.json";  // in the source's checkpoint directory

    private final ReadOptions options;
    private final PartitionReaderFactory readers;
    private final String checkpointLocation;
    private Map<String, Long> target;  // AvailableNow: where each store ends for this query

    CommitLogStream(ReadOptions options, PartitionReaderFactory readers, String checkpointLocation) {
        this.options = options;
        this.readers = readers;
        this.checkpointLocation = checkpointLocation;
    }

    /** The stream's offset: the commitlog offset read up to, per store root, in the order of the stores. */
    static final class StoreOffsets extends Offset {
        final Map<String, Long> stores;

        StoreOffsets(Map<String, Long> stores) {
            this.stores = stores;
        }

        @Override
        public String json() {
            ObjectMapper mapper = new ObjectMapper();
            ObjectNode root = mapper.createObjectNode();
            ObjectNode inner = root.putObject("stores");
            stores.forEach(inner::put);
            return root.toString();
        }

        static StoreOffsets parse(String json) {
            Map<String, Long> stores = new LinkedHashMap<>();
            try {
                JsonNode inner = new ObjectMapper().readTree(json).path("stores");
                for (Iterator<Map.Entry<String, JsonNode>> it = inner.fields(); it.hasNext(); ) {
                    Map.Entry<String, JsonNode> e = it.next();
                    stores.put(e.getKey(), e.getValue().asLong());
                }
            } catch (IOException e) {
                throw new SourceException("not a commitlog stream offset: " + json);
            }
            return new StoreOffsets(stores);
        }
    }

    private static long logStart(ReadOptions.StoreRef ref) {
        Planner.Segments segments = Planner.listSegments(ref.root);
        return segments.bases.length == 0 ? 0 : segments.bases[0];
    }

    /**
     * Where a new query starts. With startingOffsets=latest the ends found when the query first starts are kept in
     * its checkpoint (as Spark's Kafka source keeps its own), so a query restarted before its first micro-batch
     * still starts there and reads what was appended since.
     */
    @Override
    public Offset initialOffset() {
        if (!options.startLatest) {
            Map<String, Long> stores = new LinkedHashMap<>();
            for (ReadOptions.StoreRef ref : options.stores) {
                stores.put(ref.root, logStart(ref));
            }
            return new StoreOffsets(stores);
        }
        org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(checkpointLocation, INITIAL_OFFSETS_FILE);
        try {
            org.apache.hadoop.fs.FileSystem fs = path.getFileSystem(
                    org.apache.spark.sql.SparkSession.active().sessionState().newHadoopConf());
            if (fs.exists(path)) {
                try (java.io.InputStream in = fs.open(path)) {
                    return StoreOffsets.parse(new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8));
                }
            }
            Map<String, Long> stores = new LinkedHashMap<>();
            for (ReadOptions.StoreRef ref : options.stores) {
                stores.put(ref.root, Planner.planStore(ref).end);
            }
            StoreOffsets initial = new StoreOffsets(stores);
            try (java.io.OutputStream out = fs.create(path, false)) {
                out.write(initial.json().getBytes(java.nio.charset.StandardCharsets.UTF_8));
            }
            return initial;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot keep the stream's initial offsets in " + path, e);
        }
    }

    @Override
    public Offset deserializeOffset(String json) {
        return StoreOffsets.parse(json);
    }

    /** Where each store resumes; a store the offsets do not know yet is new: all of it is to be read. */
    private Map<String, Long> starts(Offset start) {
        Map<String, Long> known = ((StoreOffsets) start).stores;
        Map<String, Long> starts = new LinkedHashMap<>();
        for (ReadOptions.StoreRef ref : options.stores) {
            starts.put(ref.root, known.containsKey(ref.root) ? known.get(ref.root) : logStart(ref));
        }
        return starts;
    }

    private Map<String, Long> ends(Map<String, Long> starts) {
        Map<String, Long> ends = new LinkedHashMap<>();
        for (ReadOptions.StoreRef ref : options.stores) {
            long start = starts.get(ref.root);
            long end = Math.max(Planner.planStore(ref, start).end, start);
            if (target != null) {
                end = Math.max(start, Math.min(end, target.getOrDefault(ref.root, start)));
            }
            ends.put(ref.root, end);
        }
        return ends;
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        target = null;
        Map<String, Long> firsts = new LinkedHashMap<>();
        for (ReadOptions.StoreRef ref : options.stores) {
            firsts.put(ref.root, logStart(ref));
        }
        target = ends(firsts);
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        if (options.maxRecordsPerTrigger != null) {
            return ReadLimit.maxRows(options.maxRecordsPerTrigger);
        }
        if (options.maxBytesPerTrigger != null) {
            return ReadLimit.maxBytes(options.maxBytesPerTrigger);
        }
        return ReadLimit.allAvailable();
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("the commitlog stream takes a read limit: latestOffset(start, limit)");
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
        Map<String, Long> starts = starts(start);
        Map<String, Long> ends = ends(starts);
        if (limit instanceof ReadAllAvailable) {
            return new StoreOffsets(ends);
        }
        Long rowsMax = limit instanceof ReadMaxRows ? Long.valueOf(((ReadMaxRows) limit).maxRows())
                : options.maxRecordsPerTrigger;
        Long bytesMax = limit instanceof ReadMaxBytes ? Long.valueOf(((ReadMaxBytes) limit).maxBytes())
                : options.maxBytesPerTrigger;
        if (rowsMax == null && bytesMax == null) {
            return new StoreOffsets(ends);
        }
        List<ReadOptions.StoreRef> pending = new ArrayList<>();
        for (ReadOptions.StoreRef ref : options.stores) {
            if (ends.get(ref.root) > starts.get(ref.root)) {
                pending.add(ref);
            }
        }
        long share = Math.max(1, pending.size());
        for (ReadOptions.StoreRef ref : pending) {
            ends.put(ref.root, admit(ref, starts.get(ref.root), ends.get(ref.root),
                    rowsMax == null ? null : ceilDiv(rowsMax, share), bytesMax == null ? null : ceilDiv(bytesMax, share)));
        }
        return new StoreOffsets(ends);
    }

    private static Long ceilDiv(long a, long b) {
        return -Math.floorDiv(-a, b);
    }

    @Override
    public Offset reportLatestOffset() {
        return null;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        Map<String, Long> starts = starts(start);
        Map<String, Long> ends = ((StoreOffsets) end).stores;
        List<InputPartition> partitions = new ArrayList<>();
        for (ReadOptions.StoreRef ref : options.stores) {
            long lo = starts.get(ref.root);
            long hi = ends.getOrDefault(ref.root, lo);
            if (hi > lo) {
                partitions.addAll(Planner.planStream(ref, lo, hi));
            }
        }
        return partitions.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return readers;
    }

    @Override
    public void commit(Offset end) {
    }

    @Override
    public void stop() {
    }

    /**
     * The record start up to which a micro-batch reads from `start`: within the limits, one record at least.
     * Records are walked by their headers (magic and TOTALSIZE checked against the segment: the reader checks
     * the rest when it reads them).
     */
    static long admit(ReadOptions.StoreRef ref, long start, long end, Long rowsMax, Long bytesMax) {
        Planner.Segments segments = Planner.listSegments(ref.root);
        long first = segments.bases.length == 0 ? 0 : segments.bases[0];
        long rows = 0;
        long data = 0;
        long position = start;
        ByteBuffer chunk = ByteBuffer.allocate(LogReader.READ_CHUNK_BYTES);
        while (position < end) {
            long base = position - Math.floorMod(position - first, segments.size);
            long segmentEnd = base + segments.size;
            long pieceEnd = Math.min(end, segmentEnd);
            String path = segments.path(base).toString();
            int length = readChunk(segments, base, position, (int) Math.min(pieceEnd - position, chunk.capacity()),
                    chunk);
            int at = 0;
            while (at + LogFormat.END_FILE_MIN_BLANK_LENGTH <= length) {
                long offset = position + at;
                int total = chunk.getInt(at);
                int magic = chunk.getInt(at + LogFormat.OFFSET_MAGIC_CODE);
                if (magic == LogFormat.BLANK_MAGIC_CODE && total == segmentEnd - offset) {
                    at = -1;
                    break;
                }
                if (!LogFormat.isMessageMagic(magic) || total < LogFormat.RECORD_SIZE_MIN
                        || (long) total > pieceEnd - offset) {
                    throw new CorruptLogException("invalid commitlog record at commitlog offset " + offset + ": magic "
                            + String.format("0x%08X", magic) + ", TOTALSIZE " + total + " (to " + pieceEnd + ")", path,
                            offset - base, LogFormat.isMessageMagic(magic) ? "commitlog.2" : "commitlog.1");
                }
                if (rows > 0 && ((rowsMax != null && rows >= rowsMax) || (bytesMax != null && data + total > bytesMax))) {
                    return offset;
                }
                rows++;
                data += total;
                if ((long) at + total > length) {  // a record longer than what the chunk holds of it
                    at += total;
                    break;
                }
                at += total;
            }
            if (at == 0) {
                throw new CorruptLogException("only " + (pieceEnd - position) + " bytes are left before " + pieceEnd
                        + ", less than a record header", path, position - base, "commitlog.1");
            }
            position = at < 0 ? segmentEnd : position + at;
        }
        return end;
    }

    private static int readChunk(Planner.Segments segments, long base, long position, int want, ByteBuffer chunk) {
        chunk.clear().limit(want);
        try (FileChannel channel = FileChannel.open(segments.path(base), StandardOpenOption.READ)) {
            while (chunk.hasRemaining()) {
                if (channel.read(chunk, position - base + chunk.position()) < 0) {
                    throw new IOException("segment " + segments.path(base) + " is shorter than planned");
                }
            }
        } catch (NoSuchFileException e) {
            throw new UncheckedIOException("segment " + segments.path(base) + " was deleted while the read was running"
                    + " (retention?)", e);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return want;
    }
}
