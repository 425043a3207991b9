package io.mqstore.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.ArrayDeque;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OffHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads one partition into ColumnarBatches. A LogPartition's pieces are walked record by record, READ_CHUNK_BYTES
 * read at a time, each read starting where the last ended (each piece must end exactly where planned, or at its
 * segment's blank), from a local store's file or a tier's object ({@link Segment}: the same checks on both); a
 * QueuePartition's records are copied one by one from the mapped segments, only the records its units point to
 * ({@link QueuedRecords}). Every record is checked (rules 1 to 4 of commitlog/format.py, rule 6's shape) before a
 * byte of it is used, the row filter applied to each, every requested column decoded as
 * commitlog/arrow_decode.py decodes it. A record that breaks a rule raises CorruptLogException with file,
 * position in the file and rule.
 */
final class LogReader implements PartitionReader<ColumnarBatch> {
    static final int READ_CHUNK_BYTES = 16 << 20;  // bytes of a segment read at once on a walk (or one larger record)
    static final int BATCH_ROWS = 8192;  // rows per ColumnarBatch
    static final int BATCH_BODY_BYTES = 16 << 20;  // a batch ends once its bodies pass this many bytes

    private final StorePartition partition;
    private final LogPartition log;  // one of these two is null
    private final QueuedRecords queued;
    private final RowFilter.Compiled filter;
    private final WritableColumnVector[] byId = new WritableColumnVector[Columns.COUNT];
    private final WritableColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final LogFormat.Layout layout = new LogFormat.Layout();
    private final byte[] label;
    private final long recordCrcFrom;  // records at or after this commitlog offset must have the pair; -1: none
    private final TopicDictionary topics = new TopicDictionary();

    private int piece = -1;
    private Segment segment;
    private TierObjects objects;  // a tier's, opened at its first segment
    private final ArrayDeque<byte[]> readAheadSpare = new ArrayDeque<>();  // a tier's ranges' arrays, piece to piece
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

    LogReader(StorePartition partition, RowFilter filter, StructType schema, boolean offHeap) {
        this.partition = partition;
        this.log = partition instanceof LogPartition ? (LogPartition) partition : null;
        this.queued = partition instanceof QueuePartition ? new QueuedRecords((QueuePartition) partition) : null;
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
        recordCrcFrom = partition.tier != null ? partition.tierRecordCrcFrom : recordCrcFrom(partition.root);
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
            if (queued != null) {
                if (!nextQueued()) {
                    break;
                }
                if (decode(0, position, rows)) {
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
        closeSegment();
        if (objects != null) {
            objects.close();
        }
        batch.close();
    }

    // --- walking the pieces -----------------------------------------------------------------------------------
    private boolean openNextPiece() throws IOException {
        closeSegment();
        piece++;
        if (piece >= log.starts.length) {
            return false;
        }
        base = log.bases[piece];
        segmentEnd = base + partition.segmentSize;
        pieceEnd = log.ends[piece];
        position = log.starts[piece];
        openSegment();
        segment.readAhead(position, pieceEnd);
        pieceDone = position >= pieceEnd;
        return true;
    }

    private void closeSegment() throws IOException {
        if (segment != null) {
            segment.close();
            segment = null;
        }
    }

    private void openSegment() throws IOException {
        closeSegment();
        if (partition.tier != null) {
            if (objects == null) {
                objects = partition.tier.open();
            }
            segment = new ObjectSegment(objects, partition.tier, base, partition.segmentSize, readAheadSpare);
        } else {
            segment = SegmentMap.open(Paths.get(partition.root, "commitlog", LogFormat.segmentName(base)), base,
                    partition.segmentSize);
        }
        path = segment.name();
        bufLen = 0;
        bufAbs = 0;
    }

    // --- the ConsumeQueue path --------------------------------------------------------------------------------
    /**
     * Locate the next record the partition's ConsumeQueue units point to (true), copied alone to buf[0], or false
     * after the last. The record must be the size its unit says and of the unit's topic
     * (consumequeue.matches-log), and valid (rules 1 to 4, 6's shape), all checked before it is decoded.
     */
    private boolean nextQueued() throws IOException {
        if (!queued.next()) {
            return false;
        }
        if (queued.segmentChanged) {
            base = queued.base;
            segmentEnd = base + partition.segmentSize;
            openSegment();
        }
        position = queued.offset;
        int size = queued.size;
        long filePos = position - base;
        int total = segment.i32(position, size);  // a file that ends first: the copy below reports it
        if (total != size) {
            throw new CorruptLogException("a ConsumeQueue unit says " + size + " bytes, the record there has TOTALSIZE "
                    + total, path, filePos, "consumequeue.matches-log");
        }
        grow(size);
        segment.copy(position, buf, size, "a record its ConsumeQueue points at");
        bufAbs = position;
        bufLen = size;
        layout.locate(buf, 0, segmentEnd - position, position, path, filePos);
        checkRecordCrcShape(buf, 0, position, filePos);
        byte[] expect = queued.expectTopic;
        if (layout.topicLength != expect.length
                || !java.util.Arrays.equals(expect, 0, expect.length, buf, layout.topicStart,
                        layout.topicStart + layout.topicLength)) {
            throw new CorruptLogException("a ConsumeQueue of topic '" + queued.topic() + "' points at a record of "
                    + "topic " + LogFormat.escaped(buf, layout.topicStart, layout.topicLength), path, filePos,
                    "consumequeue.matches-log");
        }
        return true;
    }

    private void grow(int length) {
        if (buf.length < length) {
            buf = new byte[Math.max(length, Math.min(READ_CHUNK_BYTES, 2 * buf.length))];
        }
    }

    /**
     * Make buf hold [at, at + need) of the segment (at + need within the piece): the bytes from `at` that buf
     * holds are moved to its start, and READ_CHUNK_BYTES more (or what the record needs, at most the piece's end)
     * read after them. So each read starts where the previous one ended, as a tier's read-ahead expects.
     */
    private void ensure(long at, int need) throws IOException {
        long bufEnd = bufAbs + bufLen;
        if (at >= bufAbs && at + need <= bufEnd) {
            return;
        }
        int kept = at >= bufAbs && at < bufEnd ? (int) (bufEnd - at) : 0;
        long from = at + kept;
        int chunk = segment.readBytes();
        int more = (int) Math.min(pieceEnd - from, Math.max(chunk, need - kept));
        int want = Math.addExact(kept, more);
        int roomy = chunk + (chunk >> 2);  // a chunk and the records kept before it
        byte[] into = buf.length >= want ? buf
                : new byte[Math.max(want, want >= chunk ? roomy : Math.min(roomy, 2 * buf.length))];
        if (kept > 0) {
            System.arraycopy(buf, (int) (at - bufAbs), into, 0, kept);
        }
        buf = into;
        segment.read(from, buf, kept, more, "the end planned for this read");
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
