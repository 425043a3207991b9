package io.mqstore.spark;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.Set;

/**
 * What a row must satisfy: the AND of the options and the filters Spark pushed (mqstore/store/scan_options.py's
 * RowFilter). null means no condition; offsets and times are half-open ranges [lo, hi), times in microseconds
 * since the epoch. Immutable: `narrowed*` return a new filter.
 */
final class RowFilter implements Serializable {
    private static final long serialVersionUID = 1L;

    final Set<String> topics;
    final Set<Integer> queueIds;
    final Long offsetLo;
    final Long offsetHi;
    final Long timeLoUs;
    final Long timeHiUs;

    RowFilter(Set<String> topics, Set<Integer> queueIds, Long offsetLo, Long offsetHi, Long timeLoUs, Long timeHiUs) {
        this.topics = topics;
        this.queueIds = queueIds;
        this.offsetLo = offsetLo;
        this.offsetHi = offsetHi;
        this.timeLoUs = timeLoUs;
        this.timeHiUs = timeHiUs;
    }

    RowFilter withTopics(Set<String> values) {
        return new RowFilter(intersect(topics, values), queueIds, offsetLo, offsetHi, timeLoUs, timeHiUs);
    }

    RowFilter withQueueIds(Set<Integer> values) {
        return new RowFilter(topics, intersect(queueIds, values), offsetLo, offsetHi, timeLoUs, timeHiUs);
    }

    RowFilter withOffsets(Long lo, Long hi) {
        return new RowFilter(topics, queueIds, max(offsetLo, lo), min(offsetHi, hi), timeLoUs, timeHiUs);
    }

    RowFilter withTimes(Long lo, Long hi) {
        return new RowFilter(topics, queueIds, offsetLo, offsetHi, max(timeLoUs, lo), min(timeHiUs, hi));
    }

    /** True when no row can pass. */
    boolean isEmpty() {
        return (topics != null && topics.isEmpty()) || (queueIds != null && queueIds.isEmpty())
                || (offsetLo != null && offsetHi != null && offsetLo >= offsetHi)
                || (timeLoUs != null && timeHiUs != null && timeLoUs >= timeHiUs);
    }

    private static <T> Set<T> intersect(Set<T> current, Set<T> values) {
        Set<T> result = new HashSet<>(values);
        if (current != null) {
            result.retainAll(current);
        }
        return result;
    }

    private static Long max(Long a, Long b) {
        return a == null ? b : b == null ? a : Long.valueOf(Math.max(a, b));
    }

    private static Long min(Long a, Long b) {
        return a == null ? b : b == null ? a : Long.valueOf(Math.min(a, b));
    }

    /** The filter in the form the reader tests record after record (no boxing on the hot path). */
    Compiled compile() {
        return new Compiled(this);
    }

    static final class Compiled {
        final byte[][] topics;  // null: any
        final int[] queueIds;  // null: any
        final long offsetLo;
        final long offsetHi;
        final long timeLoUs;
        final long timeHiUs;
        final boolean anyNumeric;

        Compiled(RowFilter f) {
            if (f.topics != null) {
                topics = new byte[f.topics.size()][];
                int i = 0;
                for (String t : f.topics) {
                    topics[i++] = t.getBytes(StandardCharsets.UTF_8);
                }
            } else {
                topics = null;
            }
            queueIds = f.queueIds == null ? null : f.queueIds.stream().mapToInt(Integer::intValue).sorted().toArray();
            offsetLo = f.offsetLo == null ? Long.MIN_VALUE : f.offsetLo;
            offsetHi = f.offsetHi == null ? Long.MAX_VALUE : f.offsetHi;
            timeLoUs = f.timeLoUs == null ? Long.MIN_VALUE : f.timeLoUs;
            timeHiUs = f.timeHiUs == null ? Long.MAX_VALUE : f.timeHiUs;
            anyNumeric = queueIds != null || f.offsetLo != null || f.offsetHi != null || f.timeLoUs != null
                    || f.timeHiUs != null;
        }

        boolean numeric(int queueId, long offset, long storedUs) {
            if (queueIds != null && java.util.Arrays.binarySearch(queueIds, queueId) < 0) {
                return false;
            }
            return offset >= offsetLo && offset < offsetHi && storedUs >= timeLoUs && storedUs < timeHiUs;
        }

        boolean topic(byte[] buf, int start, int length) {
            if (topics == null) {
                return true;
            }
            for (byte[] t : topics) {
                if (t.length == length && java.util.Arrays.equals(t, 0, length, buf, start, start + length)) {
                    return true;
                }
            }
            return false;
        }
    }

    @Override
    public String toString() {
        return "topics=" + ReadOptions.describe(topics) + ", queue_ids=" + ReadOptions.describe(queueIds)
                + ", offsets=[" + offsetLo + ", " + offsetHi + "), store_timestamp_us=[" + timeLoUs + ", " + timeHiUs
                + ")";
    }
}
