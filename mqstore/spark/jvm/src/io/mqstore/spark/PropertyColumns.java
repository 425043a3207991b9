package io.mqstore.spark;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/**
 * The properties, tags and keys columns of a batch, filled record by record from each record's PROPERTIES bytes
 * (commitlog/arrow_decode.py's rules); the byte positions come from {@link LogFormat.Layout#locate}, which
 * checked them against the record.
 */
final class PropertyColumns {
    static final int PROPERTY_PAIRS_MAX = 32768 / 2;  // PROPERTIESLENGTH is an i16: at most this many pairs

    private final WritableColumnVector[] byId;  // the reader's vectors by column id (null: not requested)
    private final int[] pairs = new int[4 * PROPERTY_PAIRS_MAX];  // name start, name end, value start, value end
    private int pairCount;  // elements of the properties map's key and value vectors in this batch
    private int keyCount;  // elements of the keys array's vector in this batch

    PropertyColumns(WritableColumnVector[] byId) {
        this.byId = byId;
    }

    /** A new batch: its vectors were reset. */
    void startBatch() {
        pairCount = 0;
        keyCount = 0;
    }

    /**
     * The properties, tags and keys of one record. Properties that are all 'name\x01value\x02' pairs of UTF-8
     * text give every pair in order (arrow_decode's bulk path); anything else, and the rare record kinds, go
     * through format.decode_properties' rule: UTF-8 with replacement characters, split at 0x02, items without
     * exactly one 0x01 skipped, a later name replacing an earlier one's value in its place.
     */
    void put(byte[] b, int row, int start, int length, boolean common) {
        int count = 0;
        int pairStart = start;
        int nameEnd = -1;
        boolean regular = true;
        int bits = 0;  // the OR of every byte: negative when one is not ASCII
        int end = start + length;
        for (int i = start; i < end; i++) {
            byte c = b[i];
            bits |= c;
            if ((c & 0xFC) != 0) {
                continue;  // text (0x03 and up, and every non-ASCII byte): most bytes
            }
            if (c == 1) {
                if (nameEnd >= 0) {
                    regular = false;
                    break;
                }
                nameEnd = i;
            } else if (c == 2) {
                if (nameEnd < 0) {
                    regular = false;
                    break;
                }
                int k = 4 * count++;
                pairs[k] = pairStart;
                pairs[k + 1] = nameEnd;
                pairs[k + 2] = nameEnd + 1;
                pairs[k + 3] = i;
                nameEnd = -1;
                pairStart = i + 1;
            }
        }
        regular = regular && nameEnd < 0 && pairStart == end;
        if (regular && bits < 0) {
            regular = Utf8.valid(b, start, length);
        }
        if (regular && common) {
            putPairs(b, row, count, start, length);
        } else {
            putDecoded(b, row, start, length);
        }
    }

    /**
     * Every pair of a regular record: the properties bytes are copied once into each child vector's data, and
     * each name and value points into them (one copy a record, not one a string).
     */
    private void putPairs(byte[] b, int row, int count, int start, int length) {
        int tags = -1;
        int keys = -1;
        for (int p = 0; p < count; p++) {
            int k = 4 * p;
            if (pairs[k + 1] - pairs[k] == 4) {
                int at = pairs[k];
                if (b[at] == 'T' && b[at + 1] == 'A' && b[at + 2] == 'G' && b[at + 3] == 'S') {
                    tags = k;
                } else if (b[at] == 'K' && b[at + 1] == 'E' && b[at + 2] == 'Y' && b[at + 3] == 'S') {
                    keys = k;
                }
            }
        }
        WritableColumnVector v;
        if ((v = byId[Columns.PROPERTIES]) != null) {
            WritableColumnVector names = v.getChild(0);
            WritableColumnVector values = v.getChild(1);
            if (count > 0) {
                names.reserve(pairCount + count);
                values.reserve(pairCount + count);
                int nameBase = names.arrayData().appendBytes(length, b, start) - start;
                int valueBase = values.arrayData().appendBytes(length, b, start) - start;
                for (int p = 0; p < count; p++) {
                    int k = 4 * p;
                    names.putArray(pairCount + p, nameBase + pairs[k], pairs[k + 1] - pairs[k]);
                    values.putArray(pairCount + p, valueBase + pairs[k + 2], pairs[k + 3] - pairs[k + 2]);
                }
            }
            v.putArray(row, pairCount, count);
            pairCount += count;
        }
        if ((v = byId[Columns.TAGS]) != null) {
            if (tags < 0) {
                v.putNull(row);
            } else {
                v.putByteArray(row, b, pairs[tags + 2], pairs[tags + 3] - pairs[tags + 2]);
            }
        }
        if ((v = byId[Columns.KEYS]) != null) {
            WritableColumnVector items = v.getChild(0);
            int first = keyCount;
            if (keys >= 0) {
                int runStart = pairs[keys + 2];
                int keysEnd = pairs[keys + 3];
                int base = items.arrayData().appendBytes(keysEnd - runStart, b, runStart) - runStart;
                items.reserve(keyCount + (keysEnd - runStart + 1) / 2 + 1);  // at most one key every 2 bytes
                for (int i = runStart; i <= keysEnd; i++) {
                    if (i == keysEnd || b[i] == ' ') {
                        if (i > runStart) {
                            items.putArray(keyCount++, base + runStart, i - runStart);
                        }
                        runStart = i + 1;
                    }
                }
            }
            v.putArray(row, first, keyCount - first);
        }
    }

    private void putDecoded(byte[] buf, int row, int start, int length) {
        Map<String, String> decoded = new LinkedHashMap<>();
        String text = new String(buf, start, length, StandardCharsets.UTF_8);
        int at = 0;
        while (at <= text.length()) {
            int stop = text.indexOf('\u0002', at);
            if (stop < 0) {
                stop = text.length();
            }
            int sep = text.indexOf('\u0001', at);
            int second = sep < 0 ? -1 : text.indexOf('\u0001', sep + 1);
            if (sep >= 0 && sep < stop && (second < 0 || second >= stop)) {
                decoded.put(text.substring(at, sep), text.substring(sep + 1, stop));
            }
            at = stop + 1;
        }
        WritableColumnVector v;
        if ((v = byId[Columns.PROPERTIES]) != null) {
            WritableColumnVector names = v.getChild(0);
            WritableColumnVector values = v.getChild(1);
            int first = pairCount;
            for (Map.Entry<String, String> e : decoded.entrySet()) {
                putChild(names, pairCount, e.getKey().getBytes(StandardCharsets.UTF_8));
                putChild(values, pairCount++, e.getValue().getBytes(StandardCharsets.UTF_8));
            }
            v.putArray(row, first, pairCount - first);
        }
        if ((v = byId[Columns.TAGS]) != null) {
            String tags = decoded.get("TAGS");
            if (tags == null) {
                v.putNull(row);
            } else {
                byte[] raw = tags.getBytes(StandardCharsets.UTF_8);
                v.putByteArray(row, raw, 0, raw.length);
            }
        }
        if ((v = byId[Columns.KEYS]) != null) {
            WritableColumnVector items = v.getChild(0);
            int first = keyCount;
            String keys = decoded.get("KEYS");
            if (keys != null && !keys.isEmpty()) {
                for (String key : keys.split(" ", -1)) {
                    if (!key.isEmpty()) {
                        putChild(items, keyCount++, key.getBytes(StandardCharsets.UTF_8));
                    }
                }
            }
            v.putArray(row, first, keyCount - first);
        }
    }

    private static void putChild(WritableColumnVector child, int index, byte[] value) {
        child.reserve(index + 1);
        child.putArray(index, child.arrayData().appendBytes(value.length, value, 0), value.length);
    }
}
