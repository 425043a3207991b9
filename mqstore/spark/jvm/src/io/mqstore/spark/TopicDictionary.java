package io.mqstore.spark;

import java.util.Arrays;
import org.apache.spark.sql.execution.vectorized.Dictionary;

/**
 * The topic column as a dictionary: a log's records share few topics, so each row holds the id of its topic
 * and Spark reads the name from here (no copy of the name a row). Found by an open-addressing table of the
 * names' hashes; cleared between batches once it holds ENTRIES_MAX names, so it stays bounded.
 */
final class TopicDictionary implements Dictionary {
    static final int ENTRIES_MAX = 4096;  // names kept from batch to batch
    private static final int SLOTS = Integer.highestOneBit(2 * (ENTRIES_MAX + LogReader.BATCH_ROWS)) << 1;

    private byte[][] names = new byte[64][];
    private final int[] slots = new int[SLOTS];  // id + 1 of the name hashed there, 0 when free
    private int count;
    private int last = -1;

    /** Start afresh when full (call between batches only: the previous batch's ids point here). */
    void trim() {
        if (count >= ENTRIES_MAX) {
            Arrays.fill(slots, 0);
            Arrays.fill(names, 0, count, null);
            count = 0;
            last = -1;
        }
    }

    /** The id of the name b[start, start + length), added when new. */
    int id(byte[] b, int start, int length) {
        if (last >= 0 && same(names[last], b, start, length)) {
            return last;
        }
        int hash = 1;
        for (int i = start; i < start + length; i++) {
            hash = 31 * hash + b[i];
        }
        int mask = SLOTS - 1;
        int slot = (hash ^ (hash >>> 16)) & mask;
        while (slots[slot] != 0) {
            int id = slots[slot] - 1;
            if (same(names[id], b, start, length)) {
                last = id;
                return id;
            }
            slot = (slot + 1) & mask;
        }
        if (count == names.length) {
            names = Arrays.copyOf(names, 2 * count);
        }
        names[count] = Arrays.copyOfRange(b, start, start + length);
        slots[slot] = count + 1;
        last = count++;
        return last;
    }

    private static boolean same(byte[] name, byte[] b, int start, int length) {
        return name.length == length && Arrays.equals(name, 0, length, b, start, start + length);
    }

    @Override
    public byte[] decodeToBinary(int id) {
        return names[id];
    }

    @Override
    public int decodeToInt(int id) {
        throw new UnsupportedOperationException("topic names are strings");
    }

    @Override
    public long decodeToLong(int id) {
        throw new UnsupportedOperationException("topic names are strings");
    }

    @Override
    public float decodeToFloat(int id) {
        throw new UnsupportedOperationException("topic names are strings");
    }

    @Override
    public double decodeToDouble(int id) {
        throw new UnsupportedOperationException("topic names are strings");
    }
}
