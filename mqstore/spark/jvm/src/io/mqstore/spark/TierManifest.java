package io.mqstore.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * A tier's manifest, read and checked as mqstore/tier/manifest.py reads it (the layout and the validity rule are
 * documented there; this class holds the same checks). Generation g is in the slot tier/manifest.(g % 2).json,
 * each slot `{"manifest":DOCUMENT,"crc32":"<8 hex>"}` with the CRC-32 of DOCUMENT's bytes; the newest whole slot
 * is the manifest. A slot is valid iff (0) it has that wrapper and its CRC-32 matches, (1) DOCUMENT is a JSON
 * object with format "mqstore-tier" and version 1, (2) every number is an int in its range (offsets and sizes
 * 0..2^63-1, checksums 0..2^32-1, the store block's settings in theirs), (3) segments are sorted and contiguous,
 * each base a multiple of the segment size, (4) queues_end is at most the tier's end, null only with no queue file
 * listed, (5) queue and index file names are the 20- and 17-digit names the store uses, sorted, topics are valid
 * topic names and queue ids at most 7 digits, (6) a queue file holds at most consume_queue_entries_per_file units.
 * Anything else is a CorruptLogException with rule `tier.manifest` naming the slot's object. A spoiled slot beside
 * a whole one is a write a crash tore: the whole one is read. Only the segments and the store block are kept:
 * this reader walks the log.
 *
 * The tier's end is the end of its last segment; every segment is sealed (its records end with RocketMQ's
 * end-of-file blank), so the tier is a store with no writer whose written end is that end.
 */
final class TierManifest {
    static final String[] KEYS = {"tier/manifest.0.json", "tier/manifest.1.json"};  // generation g: KEYS[g % 2]
    static final byte[] SLOT_HEAD = "{\"manifest\":".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    static final int SLOT_TAIL_BYTES = ",\"crc32\":\"00000000\"}".length();
    static final String FORMAT = "mqstore-tier";
    static final int VERSION = 1;
    static final int BYTES_MAX = 1 << 30;  // manifest.py's MANIFEST_BYTES_MAX
    static final long CRC_MAX = (1L << 32) - 1;
    static final String RULE = "tier.manifest";
    static final int QUEUE_NAME_DIGITS = 20;
    static final int INDEX_NAME_DIGITS = 17;
    static final int QUEUE_ID_DIGITS_MAX = 7;
    static final int QUEUE_UNIT_BYTES = 20;
    static final long INDEX_FILE_BYTES_MAX = Integer.MAX_VALUE;  // indexfile/format.py's FILE_SIZE_BYTES_MAX
    private static final Pattern TOPIC = Pattern.compile("[A-Za-z0-9_%|-]{1,127}");  // commitlog.py's TOPIC_PATTERN

    final long generation;
    final long segmentSize;
    final long[] bases;
    final long recordCrcFrom;  // -1: the store writes no record CRCs (null in the manifest)

    private TierManifest(long generation, long segmentSize, long[] bases, long recordCrcFrom) {
        this.generation = generation;
        this.segmentSize = segmentSize;
        this.bases = bases;
        this.recordCrcFrom = recordCrcFrom;
    }

    static String segmentKey(long base) {
        return "commitlog/" + LogFormat.segmentName(base);
    }

    /** The end of the tier's last segment (every record below it is in the tier), or 0 for an empty tier. */
    long end() {
        return bases.length == 0 ? 0 : Math.addExact(bases[bases.length - 1], segmentSize);
    }

    /** The newest whole manifest slot of the tier at `location`; SourceException when it has none (not a tier,
     * nothing uploaded), CorruptLogException when no slot is whole. */
    static TierManifest load(TierLocation location, TierObjects objects) {
        TierManifest newest = null;
        CorruptLogException spoiled = null;
        int present = 0;
        String spoiledKey = null;
        for (String key : KEYS) {
            byte[] raw;
            try {
                raw = objects.readAll(key, BYTES_MAX);
            } catch (IOException e) {
                throw new SourceException("cannot read the tier manifest " + location.display(key) + ": "
                        + e.getMessage());
            }
            if (raw == null) {
                continue;
            }
            present++;
            try {
                TierManifest found = parseSlot(raw, location.display(key));
                if (newest == null || found.generation > newest.generation) {
                    newest = found;
                }
            } catch (CorruptLogException e) {
                spoiled = e;
                spoiledKey = key;
            }
        }
        if (newest != null) {
            return newest;
        }
        if (present == 2 || (spoiled != null && !spoiledKey.equals(KEYS[1]))) {
            throw spoiled;  // only generation 1's slot, alone and spoiled, is a torn first write: no manifest yet
        }
        throw new SourceException("no tier manifest at " + location.display(KEYS[0]) + " or " + KEYS[1] + ": "
                + location.uri + " is not a tier, or its store has uploaded nothing yet");
    }

    /** A manifest from a slot's bytes: the wrapper and its CRC-32 checked, then the document (parse). */
    static TierManifest parseSlot(byte[] raw, String where) {
        Checks checks = new Checks(where);
        int head = SLOT_HEAD.length;
        if (raw.length < head + SLOT_TAIL_BYTES || !java.util.Arrays.equals(raw, 0, head, SLOT_HEAD, 0, head)) {
            throw checks.bad("not a manifest slot (" + raw.length + " bytes: torn or damaged)");
        }
        int tail = raw.length - SLOT_TAIL_BYTES;
        String tailText = new String(raw, tail, SLOT_TAIL_BYTES, java.nio.charset.StandardCharsets.ISO_8859_1);
        String listed = tailText.length() == SLOT_TAIL_BYTES && tailText.startsWith(",\"crc32\":\"")
                && tailText.endsWith("\"}") ? tailText.substring(10, 18) : "";
        java.util.zip.CRC32 crc = new java.util.zip.CRC32();
        crc.update(raw, head, tail - head);
        if (!listed.matches("[0-9a-f]{8}") || Long.parseLong(listed, 16) != crc.getValue()) {
            throw checks.bad("its CRC-32 '" + listed + "' does not match its document (torn or damaged)");
        }
        return parse(java.util.Arrays.copyOfRange(raw, head, tail), where);
    }

    private static final class Checks {
        final String where;

        Checks(String where) {
            this.where = where;
        }

        CorruptLogException bad(String reason) {
            return new CorruptLogException("the tier manifest " + where + " is not valid: " + reason, where, 0, RULE);
        }

        long number(JsonNode value, String what, long low, long high) {
            if (value == null || !value.isIntegralNumber() || !value.canConvertToLong() || value.asLong() < low
                    || value.asLong() > high) {
                throw bad(what + " must be an int in " + low + ".." + high + ", got " + shown(value));
            }
            return value.asLong();
        }

        JsonNode array(JsonNode value, String what, int length) {
            if (value == null || !value.isArray() || (length >= 0 && value.size() != length)) {
                throw bad(what + " must be a list" + (length >= 0 ? " of " + length : "") + ", got " + shown(value));
            }
            return value;
        }

        String name(JsonNode value, int digits, String what) {
            if (value == null || !value.isTextual() || value.asText().length() != digits
                    || !value.asText().chars().allMatch(c -> c >= '0' && c <= '9')) {
                throw bad(what + " " + shown(value));
            }
            return value.asText();
        }

        static String shown(JsonNode value) {
            String text = value == null ? "nothing" : value.toString();
            return text.length() > 200 ? text.substring(0, 200) + "..." : text;
        }
    }

    /** A manifest from its bytes; CorruptLogException (rule tier.manifest, `where` its object) when it is not valid. */
    static TierManifest parse(byte[] raw, String where) {
        Checks checks = new Checks(where);
        if (raw.length > BYTES_MAX) {
            throw checks.bad(raw.length + " bytes, more than " + BYTES_MAX);
        }
        JsonNode document;
        try {
            document = new ObjectMapper().enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS).readTree(raw);
        } catch (JsonProcessingException e) {
            throw checks.bad("not JSON (" + e.getOriginalMessage() + ")");
        } catch (IOException e) {
            throw checks.bad("not JSON (" + e.getMessage() + ")");
        }
        if (document == null || !document.isObject()) {
            throw checks.bad("not a JSON object");
        }
        JsonNode format = document.get("format");
        JsonNode version = document.get("version");
        if (format == null || !format.isTextual() || !format.asText().equals(FORMAT) || version == null
                || !version.isIntegralNumber() || !version.canConvertToInt() || version.asInt() != VERSION) {
            throw checks.bad("format " + Checks.shown(format) + " version " + Checks.shown(version) + ", expected '"
                    + FORMAT + "' version " + VERSION);
        }
        JsonNode store = document.get("store");
        if (store == null || !store.isObject()) {
            throw checks.bad("store must be an object");
        }
        long segmentSize = checks.number(store.get("segment_size_bytes"), "store.segment_size_bytes", 4096, 1L << 40);
        long entriesPerFile = checks.number(store.get("consume_queue_entries_per_file"),
                "store.consume_queue_entries_per_file", 1, 50_000_000);
        checks.number(store.get("index_slot_count"), "store.index_slot_count", 1, 50_000_000);
        checks.number(store.get("index_entry_count_max"), "store.index_entry_count_max", 1, 100_000_000);
        JsonNode crcFrom = store.get("record_crc_from_offset");
        long recordCrcFrom = crcFrom == null || crcFrom.isNull() ? -1
                : checks.number(crcFrom, "store.record_crc_from_offset", 0, Long.MAX_VALUE);
        long generation = checks.number(document.get("generation"), "generation", 0, Long.MAX_VALUE);
        checks.number(document.get("written_ms"), "written_ms", 0, Long.MAX_VALUE);
        long[] bases = segments(checks, document.get("segments"), segmentSize);
        boolean anyQueueFile = queues(checks, document.get("queues"), entriesPerFile);
        JsonNode queuesEnd = document.get("queues_end");
        if (queuesEnd == null || queuesEnd.isNull()) {
            if (anyQueueFile) {
                throw checks.bad("queues_end is null while queue files are listed");
            }
        } else {
            long end = bases.length == 0 ? 0 : bases[bases.length - 1] + segmentSize;
            checks.number(queuesEnd, "queues_end", 0, end);
        }
        index(checks, document.get("index"));
        return new TierManifest(generation, segmentSize, bases, recordCrcFrom);
    }

    private static long[] segments(Checks checks, JsonNode rows, long segmentSize) {
        List<Long> bases = new ArrayList<>();
        for (JsonNode row : checks.array(rows, "segments", -1)) {
            checks.array(row, "a segment", 2);
            long base = checks.number(row.get(0), "a segment's base offset", 0, Long.MAX_VALUE);
            if (base % segmentSize != 0) {
                throw checks.bad("segment base " + base + " is not a multiple of the segment size " + segmentSize);
            }
            if (!bases.isEmpty() && base != bases.get(bases.size() - 1) + segmentSize) {
                throw checks.bad("segments are not contiguous: " + bases.get(bases.size() - 1) + " is followed by "
                        + base);
            }
            if (base > Long.MAX_VALUE - segmentSize) {
                throw checks.bad("segment base " + base + " ends past the largest offset");
            }
            checks.number(row.get(1), "a CRC-32", 0, CRC_MAX);
            bases.add(base);
        }
        return bases.stream().mapToLong(Long::longValue).toArray();
    }

    /** Checks the queues object; whether it lists any queue file. */
    private static boolean queues(Checks checks, JsonNode queues, long entriesPerFile) {
        boolean any = false;
        if (queues == null || !queues.isObject()) {
            throw checks.bad("queues must be an object");
        }
        for (Iterator<Map.Entry<String, JsonNode>> topics = queues.fields(); topics.hasNext(); ) {
            Map.Entry<String, JsonNode> topic = topics.next();
            if (!TOPIC.matcher(topic.getKey()).matches()) {
                throw checks.bad("topic '" + topic.getKey() + "': not 1 to 127 characters of A-Z a-z 0-9 _ % | -");
            }
            if (!topic.getValue().isObject()) {
                throw checks.bad("queues of '" + topic.getKey() + "' must be an object");
            }
            for (Iterator<Map.Entry<String, JsonNode>> ids = topic.getValue().fields(); ids.hasNext(); ) {
                Map.Entry<String, JsonNode> queue = ids.next();
                String id = queue.getKey();
                if (id.isEmpty() || id.length() > QUEUE_ID_DIGITS_MAX || !id.chars().allMatch(c -> c >= '0' && c <= '9')) {
                    throw checks.bad("queue id '" + id + "' of '" + topic.getKey() + "'");
                }
                String previous = null;
                String what = topic.getKey() + "/" + id;
                for (JsonNode row : checks.array(queue.getValue(), "files of " + what, -1)) {
                    checks.array(row, "a queue file", 3);
                    String name = checks.name(row.get(0), QUEUE_NAME_DIGITS, "queue file name of " + what);
                    if (new java.math.BigInteger(name).mod(java.math.BigInteger.valueOf(entriesPerFile * QUEUE_UNIT_BYTES))
                            .signum() != 0) {
                        throw checks.bad("queue file name " + name + " is not a multiple of the file size");
                    }
                    if (previous != null && name.compareTo(previous) <= 0) {
                        throw checks.bad("queue files of " + what + " are not sorted at " + name);
                    }
                    previous = name;
                    checks.number(row.get(1), "entries of " + name, 0, entriesPerFile);
                    checks.number(row.get(2), "a CRC-32", 0, CRC_MAX);
                    any = true;
                }
            }
        }
        return any;
    }

    private static void index(Checks checks, JsonNode rows) {
        String previous = null;
        for (JsonNode row : checks.array(rows, "index", -1)) {
            checks.array(row, "an index file", 4);
            String name = checks.name(row.get(0), INDEX_NAME_DIGITS, "index file name");
            if (previous != null && name.compareTo(previous) <= 0) {
                throw checks.bad("index files are not sorted at " + name);
            }
            previous = name;
            checks.number(row.get(1), "size of " + name, 0, INDEX_FILE_BYTES_MAX);
            checks.number(row.get(2), "a CRC-32", 0, CRC_MAX);
            checks.number(row.get(3), "end_commitlog_offset of " + name, 0, Long.MAX_VALUE);
        }
    }
}
