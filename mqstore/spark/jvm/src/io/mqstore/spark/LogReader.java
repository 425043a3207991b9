package io.mqstore.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OffHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads one LogPartition into ColumnarBatches: each piece's records walked READ_CHUNK_BYTES at a time (each
 * piece must end exactly where planned, or at its segment's blank), every record checked (rules 1 to 4 of
 * commitlog/format.py) before a byte of it is used, the row filter applied to each, every requested column
 * decoded as commitlog/arrow_decode.py decodes it. A record that breaks a rule raises CorruptLogException with
 * file, position in the file and rule.
 */
final class LogReader implements PartitionReader<ColumnarBatch> {
    static final int READ_CHUNK_BYTES = 16 << 20;  // bytes of a segment held at once (or one larger record)
    static final int BATCH_ROWS = 8192;  // rows per ColumnarBatch
    static final int BATCH_BODY_BYTES = 16 << 20;  // a batch ends once its bodies pass this many bytes

    static final int QUEUE_GAP_BYTES = 16 * 1024;  // ConsumeQueue path: records closer than this are read at once

    private final StorePartition partition;
    private final LogPartition log;  // one of these two is null
    private final QueuePartition queue;
    private final RowFilter.Compiled filter;
    private final WritableColumnVector[] byId = new WritableColumnVector[Columns.COUNT];
    private final WritableColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final LogFormat.Layout layout = new LogFormat.Layout();
    private final byte[] label;
    private final long recordCrcFrom;  // records at or after this commitlog offset must have the pair; -1: none
    private final TopicDictionary topics = new TopicDictionary();

    private int piece = -1;
    private FileChannel channel;
    private String path;
    private long base;
    private long segmentEnd;
    private long pieceEnd;
    private long position;  // the commitlog offset of the next record
    private boolean pieceDone = true;

    private byte[] buf = new byte[0];
    private long bufAbs;  // commitlog offset of buf[0]
    private int bufLen;

    // per-record scratch
    private final byte[] msgId = new byte[56];
    private final HostCache bornHosts = new HostCache();
    private final HostCache storeHosts = new HostCache();
    private final PropertyColumns propertyColumns;

    // the ConsumeQueue path: the records of one topic in one segment, sorted by offset
    private int queueTopic = -1;  // index into queueTopics
    private String[] queueTopics;
    private byte[] expectTopic;
    private long[] queueOffsets = new long[0];
    private long[] queueSizes = new long[0];
    private int queueAt;  // the next record of queueOffsets
    private int queueGroupEnd;  // records [queueAt, queueGroupEnd) lie in the segment `base`

    LogReader(StorePartition partition, RowFilter filter, StructType schema, boolean offHeap) {
        this.partition = partition;
        this.log = partition instanceof LogPartition ? (LogPartition) partition : null;
        this.queue = partition instanceof QueuePartition ? (QueuePartition) partition : null;
        this.filter = filter.compile();
        int[] ids = Columns.ids(schema);
        vectors = new WritableColumnVector[ids.length];
        for (int i = 0; i < ids.length; i++) {
            vectors[i] = offHeap ? new OffHeapColumnVector(BATCH_ROWS, schema.fields()[i].dataType())
                    : new OnHeapColumnVector(BATCH_ROWS, schema.fields()[i].dataType());
            byId[ids[i]] = vectors[i];
        }
        propertyColumns = new PropertyColumns(byId);
        if (byId[Columns.TOPIC] != null) {
            byId[Columns.TOPIC].reserveDictionaryIds(BATCH_ROWS);
            byId[Columns.TOPIC].setDictionary(topics);
        }
        batch = new ColumnarBatch(vectors.clone());
        label = partition.label == null ? new byte[0] : partition.label.getBytes(StandardCharsets.UTF_8);
        recordCrcFrom = recordCrcFrom(partition.root);
    }

    @Override
    public boolean next() throws IOException {
        for (WritableColumnVector v : vectors) {
            v.reset();
        }
        propertyColumns.startBatch();
        topics.trim();
        int rows = 0;
        long bodyBytes = 0;
        while (rows < BATCH_ROWS && bodyBytes < BATCH_BODY_BYTES) {
            if (queue != null) {
                if (!nextQueued()) {
                    break;
                }
                int pos = (int) (position - bufAbs);
                if (decode(pos, position, rows)) {
                    bodyBytes += layout.bodyLength;
                    rows++;
                }
                continue;
            }
            if (pieceDone && !openNextPiece()) {
                break;
            }
            if (!locateNext()) {
                continue;
            }
            int pos = (int) (position - bufAbs);
            long offset = position;
            position += layout.size;
            if (position == pieceEnd) {
                pieceDone = true;
            }
            if (decode(pos, offset, rows)) {
                bodyBytes += layout.bodyLength;
                rows++;
            }
        }
        batch.setNumRows(rows);
        return rows > 0;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        closeChannel();
        batch.close();
    }

    // --- walking the pieces -----------------------------------------------------------------------------------
    private boolean openNextPiece() throws IOException {
        closeChannel();
        piece++;
        if (piece >= log.starts.length) {
            return false;
        }
        base = log.bases[piece];
        segmentEnd = base + partition.segmentSize;
        pieceEnd = log.ends[piece];
        position = log.starts[piece];
        openSegment();
        pieceDone = position >= pieceEnd;
        return true;
    }

    private void openSegment() throws IOException {
        Path file = Paths.get(partition.root, "commitlog", LogFormat.segmentName(base));
        path = file.toString();
        try {
            channel = FileChannel.open(file, StandardOpenOption.READ);
        } catch (NoSuchFileException e) {
            throw new UncheckedIOException("segment " + path + " was deleted while the read was running (retention?)",
                    e);
        }
        bufLen = 0;
        bufAbs = 0;
    }

    // --- the ConsumeQueue path --------------------------------------------------------------------------------
    /**
     * Locate the next record the partition's ConsumeQueue slices point to (true), topic after topic, segment
     * after segment, each run of close records read with one pread; false after the last. The record must be
     * the size its unit says and of the unit's topic (consumequeue.matches-log), and valid (rules 1 to 4, 6).
     */
    private boolean nextQueued() throws IOException {
        while (queueAt >= queueGroupEnd) {
            if (queueAt >= queueOffsets.length && !loadNextTopic()) {
                return false;
            }
            openQueueGroup();
        }
        int i = queueAt++;
        position = queueOffsets[i];
        int size = (int) queueSizes[i];
        long filePos = position - base;
        if (position < bufAbs || position + size > bufAbs + bufLen || bufLen == 0) {
            readQueueRun(i);
        }
        int pos = (int) (position - bufAbs);
        int total = LogFormat.i32(buf, pos);
        if (total != size) {
            throw new CorruptLogException("a ConsumeQueue unit says " + size + " bytes, the record there has TOTALSIZE "
                    + total, path, filePos, "consumequeue.matches-log");
        }
        layout.locate(buf, pos, segmentEnd - position, position, path, filePos);
        checkRecordCrcShape(buf, pos, position, filePos);
        if (layout.topicLength != expectTopic.length
                || !java.util.Arrays.equals(expectTopic, 0, expectTopic.length, buf, layout.topicStart,
                        layout.topicStart + layout.topicLength)) {
            throw new CorruptLogException("a ConsumeQueue of topic '" + queueTopics[queueTopic] + "' points at a "
                    + "record of topic " + LogFormat.escaped(buf, layout.topicStart, layout.topicLength), path, filePos,
                    "consumequeue.matches-log");
        }
        return true;
    }

    /** The units of the next topic's slices, sorted by commitlog offset; false when no topic is left. */
    private boolean loadNextTopic() {
        if (queueTopics == null) {
            queueTopics = java.util.Arrays.stream(queue.topics).distinct().sorted().toArray(String[]::new);
        }
        while (++queueTopic < queueTopics.length) {
            String topic = queueTopics[queueTopic];
            java.util.List<long[][]> parts = new java.util.ArrayList<>();
            int total = 0;
            for (int s = 0; s < queue.topics.length; s++) {
                if (queue.topics[s].equals(topic)) {
                    long[][] units = Queues.range(Paths.get(queue.queueDirs[s]), queue.firsts[s], queue.counts[s]);
                    parts.add(units);
                    total += units[0].length;
                }
            }
            long[][] pairs = new long[total][];
            int at = 0;
            for (long[][] units : parts) {
                for (int k = 0; k < units[0].length; k++) {
                    pairs[at++] = new long[] {units[0][k], units[1][k]};
                }
            }
            java.util.Arrays.sort(pairs, (a, b) -> Long.compare(a[0], b[0]));  // stable
            queueOffsets = new long[total];
            queueSizes = new long[total];
            for (int k = 0; k < total; k++) {
                queueOffsets[k] = pairs[k][0];
                queueSizes[k] = pairs[k][1];
            }
            queueAt = 0;
            queueGroupEnd = 0;
            expectTopic = topic.getBytes(StandardCharsets.UTF_8);
            if (total > 0) {
                return true;
            }
        }
        return false;
    }

    /** Open the segment of record queueAt and find the records [queueAt, queueGroupEnd) of it; check their units. */
    private void openQueueGroup() throws IOException {
        closeChannel();
        long size = partition.segmentSize;
        long first = queueOffsets[queueAt];
        base = first - Math.floorMod(first - queue.firstBase, size);
        segmentEnd = base + size;
        int end = queueAt;
        while (end < queueOffsets.length && queueOffsets[end] < segmentEnd) {
            end++;
        }
        queueGroupEnd = end;
        openSegment();
        for (int k = queueAt; k < end; k++) {
            long offset = queueOffsets[k];
            if (offset < queue.firstBase || queueSizes[k] < LogFormat.RECORD_SIZE_MIN
                    || queueSizes[k] > segmentEnd - offset) {
                throw new CorruptLogException("a ConsumeQueue unit of topic '" + queueTopics[queueTopic] + "' says "
                        + queueSizes[k] + " bytes at " + offset, path, offset - base, "consumequeue.matches-log");
            }
        }
    }

    /** Read the run of close records from record i (one pread of at most READ_CHUNK_BYTES, or the one record). */
    private void readQueueRun(int i) throws IOException {
        long start = queueOffsets[i];
        long end = start + queueSizes[i];
        if (queueSizes[i] > READ_CHUNK_BYTES) {  // read alone, once its header agrees with its unit
            ensureAt(start, LogFormat.END_FILE_MIN_BLANK_LENGTH);
            if (LogFormat.i32(buf, 0) != queueSizes[i]) {
                return;  // nextQueued reports the disagreement
            }
        } else {
            for (int k = i + 1; k < queueGroupEnd; k++) {
                long recordEnd = queueOffsets[k] + queueSizes[k];
                if (queueOffsets[k] - end > QUEUE_GAP_BYTES || recordEnd - start > READ_CHUNK_BYTES) {
                    break;
                }
                end = Math.max(end, recordEnd);
            }
        }
        ensureAt(start, (int) (end - start));
    }

    /** buf = exactly [at, at + length) of the current segment. */
    private void ensureAt(long at, int length) throws IOException {
        if (buf.length < length) {
            buf = new byte[Math.max(length, Math.min(READ_CHUNK_BYTES, 2 * buf.length))];
        }
        ByteBuffer into = ByteBuffer.wrap(buf, 0, length);
        long filePos = at - base;
        while (into.hasRemaining()) {
            if (channel.read(into, filePos + into.position()) < 0) {
                throw new IOException("segment " + path + " ends at byte " + (filePos + into.position())
                        + ", before a record its ConsumeQueue points at: was it truncated or replaced?");
            }
        }
        bufAbs = at;
        bufLen = length;
    }

    private void closeChannel() throws IOException {
        if (channel != null) {
            channel.close();
            channel = null;
        }
    }

    /** Make buf hold [at, at + need) of the segment, reading from `at` up to the piece's end. */
    private void ensure(long at, int need) throws IOException {
        if (at >= bufAbs && at + need <= bufAbs + bufLen) {
            return;
        }
        int want = (int) Math.min(pieceEnd - at, Math.max(READ_CHUNK_BYTES, need));
        if (buf.length < want) {
            buf = new byte[Math.max(want, Math.min(READ_CHUNK_BYTES, 2 * buf.length))];
        }
        ByteBuffer into = ByteBuffer.wrap(buf, 0, want);
        long filePos = at - base;
        while (into.hasRemaining()) {
            int n = channel.read(into, filePos + into.position());
            if (n < 0) {
                throw new IOException("segment " + path + " ends at byte " + (filePos + into.position())
                        + ", before the end planned for this read: was it truncated or replaced?");
            }
        }
        bufAbs = at;
        bufLen = want;
    }

    /**
     * Locate the record at `position` (true), or find the piece's end at its blank (false). Throws
     * CorruptLogException for anything else, as the Python reader's strict walk does.
     */
    private boolean locateNext() throws IOException {
        long left = pieceEnd - position;
        long filePos = position - base;
        if (left < LogFormat.END_FILE_MIN_BLANK_LENGTH) {
            if (pieceEnd == segmentEnd) {
                throw new CorruptLogException(left + " bytes are left at the end of the segment, less than a blank",
                        path, filePos, "commitlog.1");
            }
            throw pastEnd();
        }
        ensure(position, LogFormat.END_FILE_MIN_BLANK_LENGTH);
        int pos = (int) (position - bufAbs);
        int size = LogFormat.i32(buf, pos);
        int magic = LogFormat.i32(buf, pos + LogFormat.OFFSET_MAGIC_CODE);
        long remaining = segmentEnd - position;
        if (magic == LogFormat.BLANK_MAGIC_CODE && size == remaining) {
            if (pieceEnd != segmentEnd) {
                throw new CorruptLogException("a blank ends the segment at " + position + ", before the end "
                        + pieceEnd + " planned for this read", path, filePos, "commitlog.blank");
            }
            pieceDone = true;
            return false;
        }
        if (size == 0 && magic == 0) {
            throw new CorruptLogException("the log ends at offset " + position + ", before the end planned for this "
                    + "read: was the store truncated or a segment replaced?", path, filePos, "commitlog.end");
        }
        if (LogFormat.isMessageMagic(magic) && size >= LogFormat.RECORD_SIZE_MIN && size <= remaining) {
            if (position + size > pieceEnd) {
                throw pastEnd();
            }
            ensure(position, size);
            pos = (int) (position - bufAbs);
        }
        layout.locate(buf, pos, remaining, position, path, filePos);  // throws for rules 1 to 4
        checkRecordCrcShape(buf, pos, position, filePos);
        return true;
    }

    private CorruptLogException pastEnd() {
        return new CorruptLogException("the record at " + position + " runs past the end " + pieceEnd
                + " planned for this read", path, position - base, "commitlog.2");
    }

    // --- decoding one record ----------------------------------------------------------------------------------
    /** Put the located record at buf[pos] into row `row` when it passes the filter; false when filtered out. */
    private boolean decode(int pos, long offset, int row) {
        final byte[] b = buf;
        final LogFormat.Layout l = layout;
        int queueId = LogFormat.i32(b, pos + LogFormat.OFFSET_QUEUE_ID);
        long storeTimestamp = LogFormat.i64(b, l.storeAt - 8);
        if (filter.anyNumeric && !filter.numeric(queueId, offset, storeTimestamp * 1000)) {
            return false;
        }
        if (!filter.topic(b, l.topicStart, l.topicLength)) {
            return false;
        }
        WritableColumnVector v;
        if ((v = byId[Columns.TOPIC]) != null) {
            v.getDictionaryIds().putInt(row, topics.id(b, l.topicStart, l.topicLength));
        }
        if ((v = byId[Columns.QUEUE_ID]) != null) {
            v.putInt(row, queueId);
        }
        if ((v = byId[Columns.QUEUE_OFFSET]) != null) {
            v.putLong(row, LogFormat.i64(b, pos + LogFormat.OFFSET_QUEUE_OFFSET));
        }
        if ((v = byId[Columns.COMMITLOG_OFFSET]) != null) {
            v.putLong(row, offset);
        }
        if ((v = byId[Columns.BODY]) != null) {
            v.putByteArray(row, b, l.bodyStart, l.bodyLength);
        }
        if (byId[Columns.TAGS] != null || byId[Columns.KEYS] != null || byId[Columns.PROPERTIES] != null) {
            propertyColumns.put(b, row, l.propertiesStart, l.propertiesLength, l.common());
        }
        if ((v = byId[Columns.FLAG]) != null) {
            v.putInt(row, LogFormat.i32(b, pos + LogFormat.OFFSET_FLAG));
        }
        if ((v = byId[Columns.SYS_FLAG]) != null) {
            v.putInt(row, l.sysFlag);
        }
        if ((v = byId[Columns.BORN_TIMESTAMP]) != null) {
            v.putLong(row, LogFormat.i64(b, pos + LogFormat.OFFSET_BORN_TIMESTAMP) * 1000);
        }
        if ((v = byId[Columns.STORE_TIMESTAMP]) != null) {
            v.putLong(row, storeTimestamp * 1000);
        }
        if ((v = byId[Columns.BORN_HOST]) != null) {
            byte[] text = bornHosts.text(b, l.bornAt, l.bornLength);
            v.putByteArray(row, text, 0, text.length);
        }
        if ((v = byId[Columns.STORE_HOST]) != null) {
            byte[] text = storeHosts.text(b, l.storeAt, l.storeLength);
            v.putByteArray(row, text, 0, text.length);
        }
        if ((v = byId[Columns.RECONSUME_TIMES]) != null) {
            v.putInt(row, LogFormat.i32(b, l.storeAt + l.storeLength));
        }
        if ((v = byId[Columns.BODY_CRC]) != null) {
            v.putInt(row, LogFormat.i32(b, pos + LogFormat.OFFSET_BODY_CRC));
        }
        if ((v = byId[Columns.MSG_ID]) != null) {
            byte[] host = storeHosts.hex(b, l.storeAt, l.storeLength);
            System.arraycopy(host, 0, msgId, 0, host.length);
            int n = Hosts.hexLong(offset, msgId, host.length);
            v.putByteArray(row, msgId, 0, n);
        }
        if ((v = byId[Columns.STORE]) != null) {
            v.putByteArray(row, label, 0, label.length);
        }
        return true;
    }

    /**
     * Rule (6)'s shape, as scan() checks it (docs/decisions/0036): a record-CRC pair holds 10 ASCII digits, and a
     * store that writes record CRCs has the pair on every record from `record_crc_from_offset` (its settings
     * file). The CRC values are not compared, as scan() does not compare them.
     */
    void checkRecordCrcShape(byte[] b, int pos, long offset, long filePos) {
        if (!layout.hasRecordCrc) {
            if (recordCrcFrom >= 0 && offset >= recordCrcFrom) {
                throw LogFormat.corrupt("6", "the record has no record-CRC property", path, offset, filePos);
            }
            return;
        }
        int at = pos + layout.size - 11;  // the 10 digits, then 0x02
        long eight = LogFormat.i64(b, at);
        int two = LogFormat.u16(b, at + 8);
        // a byte is a digit iff its high nibble is 3 and adding 6 leaves it 3 (the low nibble is at most 9)
        if ((eight & 0xF0F0F0F0F0F0F0F0L) != 0x3030303030303030L
                || ((eight + 0x0606060606060606L) & 0xF0F0F0F0F0F0F0F0L) != 0x3030303030303030L
                || (two & 0xF0F0) != 0x3030 || ((two + 0x0606) & 0xF0F0) != 0x3030) {
            throw LogFormat.corrupt("6", "the record-CRC property does not hold 10 digits", path, offset, filePos);
        }
    }

    /**
     * The commitlog offset from which the store's records must carry a record CRC, from its settings file
     * (config/mqstore.json, key record_crc_from_offset), as mqstore/store/scan_read.py's record_crc_from reads
     * it; -1 without one (a RocketMQ store, or a file that is not mqstore's: the store's open reports it).
     */
    static long recordCrcFrom(String root) {
        try {
            JsonNode value = new ObjectMapper().readTree(Paths.get(root, "config", "mqstore.json").toFile())
                    .path("record_crc_from_offset");
            if (value.isIntegralNumber() && value.canConvertToLong() && value.asLong() >= 0) {
                return value.asLong();
            }
        } catch (IOException | RuntimeException e) {
            // no settings file, or not JSON: no requirement
        }
        return -1;
    }

    /**
     * 'ip:port' and the hex digits of the last host bytes seen, remembered: a log's records mostly share their
     * hosts.
     */
    static final class HostCache {
        private final byte[] raw = new byte[LogFormat.HOST_V6_LENGTH];
        private int rawLength = -1;
        private byte[] text;
        private byte[] hex;

        private void remember(byte[] b, int at, int length) {
            if (length != rawLength || !java.util.Arrays.equals(raw, 0, length, b, at, at + length)) {
                System.arraycopy(b, at, raw, 0, length);
                rawLength = length;
                text = Hosts.format(b, at, length).getBytes(StandardCharsets.US_ASCII);
                hex = new byte[2 * length];
                Hosts.hex(b, at, length, hex, 0);
            }
        }

        byte[] text(byte[] b, int at, int length) {
            remember(b, at, length);
            return text;
        }

        byte[] hex(byte[] b, int at, int length) {
            remember(b, at, length);
            return hex;
        }
    }
}
