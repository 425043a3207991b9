package io.mqstore.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * The CommitLog record layout, as commitlog/format.py documents it (the table, the validity rule and the
 * segment naming rule live there; this class holds the same facts for the JVM reader). All integers are
 * big-endian. {@link Layout#locate} checks rules (1) to (4) of one record and says where its parts are.
 */
final class LogFormat {
    private LogFormat() {
    }

    static final int MESSAGE_MAGIC_CODE = 0xDAA320A7;
    static final int MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB;
    static final int BLANK_MAGIC_CODE = 0xCBD43194;
    static final int END_FILE_MIN_BLANK_LENGTH = 8;

    static final int SYS_FLAG_BORNHOST_V6 = 0x10;
    static final int SYS_FLAG_STOREHOST_V6 = 0x20;

    static final int OFFSET_TOTAL_SIZE = 0;
    static final int OFFSET_MAGIC_CODE = OFFSET_TOTAL_SIZE + 4;
    static final int OFFSET_BODY_CRC = OFFSET_MAGIC_CODE + 4;
    static final int OFFSET_QUEUE_ID = OFFSET_BODY_CRC + 4;
    static final int OFFSET_FLAG = OFFSET_QUEUE_ID + 4;
    static final int OFFSET_QUEUE_OFFSET = OFFSET_FLAG + 4;
    static final int OFFSET_PHYSICAL_OFFSET = OFFSET_QUEUE_OFFSET + 8;
    static final int OFFSET_SYS_FLAG = OFFSET_PHYSICAL_OFFSET + 8;
    static final int OFFSET_BORN_TIMESTAMP = OFFSET_SYS_FLAG + 4;
    static final int OFFSET_BORN_HOST = OFFSET_BORN_TIMESTAMP + 8;
    static final int HOST_V4_LENGTH = 8;
    static final int HOST_V6_LENGTH = 20;
    static final int OFFSET_STORE_TIMESTAMP = OFFSET_BORN_HOST + HOST_V4_LENGTH;  // IPv4 born host
    static final int HEADER_SIZE = 88;  // v1, IPv4 hosts: the bytes before the body
    static final int RECORD_SIZE_MIN = HEADER_SIZE + 1 + 1 + 2;  // empty body, 1-character topic, no properties
    static final int SEGMENT_NAME_DIGITS = 20;

    static final byte[] RECORD_CRC_PREFIX = {'_', '_', 'C', 'R', 'C', '3', '2', '#', 0x01};
    static final int RECORD_CRC_DIGITS = 10;
    static final int RECORD_CRC_LENGTH = RECORD_CRC_PREFIX.length + RECORD_CRC_DIGITS + 1;

    static {
        if (OFFSET_PHYSICAL_OFFSET != 28 || OFFSET_STORE_TIMESTAMP != 56 || RECORD_CRC_LENGTH != 20
                || RECORD_SIZE_MIN != 92) {
            throw new AssertionError("record layout constants disagree with commitlog/format.py");
        }
    }

    private static final VarHandle I32 = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle I64 = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.BIG_ENDIAN);
    private static final VarHandle I16 = MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.BIG_ENDIAN);

    static int i32(byte[] b, int at) {
        return (int) I32.get(b, at);
    }

    static long i64(byte[] b, int at) {
        return (long) I64.get(b, at);
    }

    static int i16(byte[] b, int at) {
        return (short) I16.get(b, at);
    }

    static int u16(byte[] b, int at) {
        return ((short) I16.get(b, at)) & 0xFFFF;
    }

    static boolean isMessageMagic(int magic) {
        return magic == MESSAGE_MAGIC_CODE || magic == MESSAGE_MAGIC_CODE_V2;
    }

    static String segmentName(long base) {
        String digits = Long.toString(base);
        StringBuilder name = new StringBuilder(SEGMENT_NAME_DIGITS);
        for (int i = digits.length(); i < SEGMENT_NAME_DIGITS; i++) {
            name.append('0');
        }
        return name.append(digits).toString();
    }

    /** The base offset a file name encodes (20 ASCII digits), or -1 when it is not a segment name. */
    static long parseSegmentName(String name) {
        if (name.length() != SEGMENT_NAME_DIGITS) {
            return -1;
        }
        for (int i = 0; i < name.length(); i++) {
            char c = name.charAt(i);
            if (c < '0' || c > '9') {
                return -1;
            }
        }
        try {
            return Long.parseLong(name);
        } catch (NumberFormatException e) {
            return -1;  // over Long.MAX_VALUE: not an offset this reader can address
        }
    }

    /** Where the parts of one record lie in a buffer; filled by {@link #locate}, reused record after record. */
    static final class Layout {
        int size;
        int magic;
        int sysFlag;
        int bornAt;
        int bornLength;
        int storeAt;
        int storeLength;
        int bodyStart;
        int bodyLength;
        int topicStart;
        int topicLength;
        int propertiesStart;
        int propertiesLength;  // the record-CRC pair left out
        boolean hasRecordCrc;

        /**
         * Rules (1) to (4) of commitlog/format.py for the record at buf[pos], with `remaining` bytes left in its
         * segment (and at least that many, or TOTALSIZE, in buf). Throws CorruptLogException naming the rule;
         * `filePos` is the record's position in its file, `offset` its commitlog offset.
         */
        void locate(byte[] buf, int pos, long remaining, long offset, String path, long filePos) {
            if (remaining < END_FILE_MIN_BLANK_LENGTH) {
                throw corrupt("1", "only " + remaining + " bytes left in the segment", path, offset, filePos);
            }
            int total = i32(buf, pos);
            int code = i32(buf, pos + OFFSET_MAGIC_CODE);
            if (!isMessageMagic(code)) {
                throw corrupt("1", String.format("magic code 0x%08X", code), path, offset, filePos);
            }
            if (total < RECORD_SIZE_MIN || total > remaining) {
                throw corrupt("2", "TOTALSIZE " + total + " outside " + RECORD_SIZE_MIN + ".." + remaining, path,
                        offset, filePos);
            }
            size = total;
            magic = code;
            sysFlag = i32(buf, pos + OFFSET_SYS_FLAG);
            bornLength = (sysFlag & SYS_FLAG_BORNHOST_V6) != 0 ? HOST_V6_LENGTH : HOST_V4_LENGTH;
            storeLength = (sysFlag & SYS_FLAG_STOREHOST_V6) != 0 ? HOST_V6_LENGTH : HOST_V4_LENGTH;
            bornAt = pos + OFFSET_BORN_HOST;
            storeAt = bornAt + bornLength + 8;
            int bodyLengthAt = storeAt + storeLength + 4 + 8;
            int fixed = bodyLengthAt + 4 - pos;
            int topicLengthBytes = code == MESSAGE_MAGIC_CODE_V2 ? 2 : 1;
            if (fixed + topicLengthBytes + 2 > total) {
                throw corrupt("3", "TOTALSIZE " + total + " smaller than the fixed fields", path, offset, filePos);
            }
            int body = i32(buf, bodyLengthAt);
            bodyStart = bodyLengthAt + 4;
            if (body < 0 || (long) fixed + body + topicLengthBytes + 2 > total) {
                throw corrupt("3", "BODYLENGTH " + body + " does not fit TOTALSIZE " + total, path, offset, filePos);
            }
            bodyLength = body;
            int topicLengthAt = bodyStart + body;
            int topic = topicLengthBytes == 1 ? buf[topicLengthAt] & 0xFF : u16(buf, topicLengthAt);
            topicStart = topicLengthAt + topicLengthBytes;
            int propertiesLengthAt = topicStart + topic;
            if (topic < 1 || propertiesLengthAt + 2 > pos + total) {
                throw corrupt("3", "TOPICLENGTH " + topic + " does not fit TOTALSIZE " + total, path, offset, filePos);
            }
            topicLength = topic;
            int properties = i16(buf, propertiesLengthAt);
            propertiesStart = propertiesLengthAt + 2;
            if (properties < 0 || propertiesStart + properties != pos + total) {
                throw corrupt("3", "fields add up to " + (propertiesStart + properties - pos) + " bytes, TOTALSIZE is "
                        + total, path, offset, filePos);
            }
            for (int i = topicStart; i < propertiesLengthAt; i++) {
                if (buf[i] < 0) {
                    throw corrupt("3", "topic is not ASCII: " + escaped(buf, topicStart, topic), path, offset, filePos);
                }
            }
            long physical = i64(buf, pos + OFFSET_PHYSICAL_OFFSET);
            if (physical != offset) {
                throw corrupt("4", "PHYSICALOFFSET " + physical + " at offset " + offset, path, offset, filePos);
            }
            // rule (6)'s shape: the record-CRC pair is the store's, hidden from the properties
            int end = pos + total;
            int at = end - RECORD_CRC_LENGTH;
            hasRecordCrc = properties >= RECORD_CRC_LENGTH && buf[end - 1] == 2 && startsWith(buf, at, RECORD_CRC_PREFIX)
                    && (at == propertiesStart || buf[at - 1] == 2);
            propertiesLength = hasRecordCrc ? properties - RECORD_CRC_LENGTH : properties;
        }

        /** True for the record kind the Python reader decodes in bulk: version 1 with IPv4 hosts. */
        boolean common() {
            return magic == MESSAGE_MAGIC_CODE && bornLength == HOST_V4_LENGTH && storeLength == HOST_V4_LENGTH;
        }
    }

    static boolean startsWith(byte[] buf, int at, byte[] prefix) {
        for (int i = 0; i < prefix.length; i++) {
            if (buf[at + i] != prefix[i]) {
                return false;
            }
        }
        return true;
    }

    static CorruptLogException corrupt(String rule, String detail, String path, long offset, long filePos) {
        return new CorruptLogException("invalid commitlog record at commitlog offset " + offset + ": " + detail, path,
                filePos, "commitlog." + rule);
    }

    static String escaped(byte[] buf, int start, int length) {
        StringBuilder text = new StringBuilder("b'");
        for (int i = start; i < start + length; i++) {
            int b = buf[i] & 0xFF;
            if (b >= 0x20 && b < 0x7F && b != '\'' && b != '\\') {
                text.append((char) b);
            } else {
                text.append(String.format("\\x%02x", b));
            }
        }
        return text.append('\'').toString();
    }
}
