package io.mqstore.spark;

import java.io.IOException;

/**
 * The objects of one tier, read whole (the manifest) or by byte range (segments). Keys are relative to the tier's
 * root, with '/' (commitlog/00000000000000000000). An implementation serves one reader thread at a time.
 *
 * A range that the object does not hold is damage, not an I/O error, and is reported as Python's TierLocation
 * reports it: CorruptLogException naming the object ({@link TierLocation#display}), the offset and the rule
 * `tier.object-missing` (no such object, though the manifest lists it) or `tier.object-size` (the object ends
 * before the range does). Anything else (a refused request, a network error after the retries) is an
 * IOException naming the object.
 */
interface TierObjects extends AutoCloseable {
    String RULE_MISSING = "tier.object-missing";
    String RULE_SIZE = "tier.object-size";

    /** The whole object, or null when there is none; an object longer than `bytesMax` is an IOException. */
    byte[] readAll(String key, int bytesMax) throws IOException;

    /** Bytes [offset, offset + count) of the object into into[at, at + count). */
    void readRange(String key, long offset, byte[] into, int at, int count) throws IOException;

    @Override
    default void close() throws IOException {
    }

    static CorruptLogException missing(TierLocation location, String key, long offset) {
        return new CorruptLogException("the tier object " + location.display(key) + " listed in the manifest is "
                + "missing", location.display(key), offset, RULE_MISSING);
    }

    static CorruptLogException shorter(TierLocation location, String key, long offset, long end) {
        return new CorruptLogException("the tier object " + location.display(key) + " ends before byte " + end
                + ": it is shorter than its manifest says", location.display(key), offset, RULE_SIZE);
    }
}
