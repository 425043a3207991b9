package io.mqstore.spark;

/** Host fields and message ids as text, as commitlog/format.py's decode_host and message_id write them. */
final class Hosts {
    private Hosts() {
    }

    private static final byte[] HEX = "0123456789ABCDEF".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    private static final byte[] HEX_PAIRS = new byte[512];  // the two digits of each byte value

    static {
        for (int v = 0; v < 256; v++) {
            HEX_PAIRS[2 * v] = HEX[v >>> 4];
            HEX_PAIRS[2 * v + 1] = HEX[v & 15];
        }
    }

    /** 'a.b.c.d:port' for 8 bytes (IPv4), '[inet_ntop form]:port' for 20 (IPv6); the port is a signed i32. */
    static String format(byte[] b, int at, int length) {
        StringBuilder text = new StringBuilder(48);
        if (length == LogFormat.HOST_V4_LENGTH) {
            dotted(b, at, text);
        } else {
            text.append('[');
            ipv6(b, at, text);
            text.append(']');
        }
        return text.append(':').append(LogFormat.i32(b, at + length - 4)).toString();
    }

    private static void dotted(byte[] b, int at, StringBuilder text) {
        for (int i = 0; i < 4; i++) {
            if (i > 0) {
                text.append('.');
            }
            text.append(b[at + i] & 0xFF);
        }
    }

    /**
     * RFC 5952 text as glibc's inet_ntop writes it (Python's socket.inet_ntop): lower-case groups without
     * leading zeros, the longest run of two or more zero groups (the first of equals) as "::", and the last
     * 32 bits in dotted form for IPv4-compatible and IPv4-mapped addresses.
     */
    static void ipv6(byte[] b, int at, StringBuilder text) {
        int[] words = new int[8];
        for (int i = 0; i < 8; i++) {
            words[i] = ((b[at + 2 * i] & 0xFF) << 8) | (b[at + 2 * i + 1] & 0xFF);
        }
        int bestBase = -1;
        int bestLength = 0;
        for (int i = 0; i < 8; ) {
            if (words[i] != 0) {
                i++;
                continue;
            }
            int j = i;
            while (j < 8 && words[j] == 0) {
                j++;
            }
            if (j - i > bestLength) {
                bestBase = i;
                bestLength = j - i;
            }
            i = j;
        }
        if (bestLength < 2) {
            bestBase = -1;
        }
        for (int i = 0; i < 8; i++) {
            if (bestBase >= 0 && i >= bestBase && i < bestBase + bestLength) {
                if (i == bestBase) {
                    text.append(':');
                }
                continue;
            }
            if (i != 0) {
                text.append(':');
            }
            if (i == 6 && bestBase == 0 && (bestLength == 6
                    || (bestLength == 5 && words[5] == 0xFFFF))) {
                dotted(b, at + 12, text);
                return;
            }
            text.append(Integer.toHexString(words[i]));
        }
        if (bestBase >= 0 && bestBase + bestLength == 8) {
            text.append(':');
        }
    }

    /** Upper-case hex digits of b[at, at + length) into out[from...]; returns the end. */
    static int hex(byte[] b, int at, int length, byte[] out, int from) {
        for (int i = 0; i < length; i++) {
            int v = 2 * (b[at + i] & 0xFF);
            out[from++] = HEX_PAIRS[v];
            out[from++] = HEX_PAIRS[v + 1];
        }
        return from;
    }

    /** The 16 upper-case hex digits of a big-endian i64 into out[from...]; returns the end. */
    static int hexLong(long value, byte[] out, int from) {
        for (int shift = 56; shift >= 0; shift -= 8) {
            int v = 2 * ((int) (value >>> shift) & 0xFF);
            out[from++] = HEX_PAIRS[v];
            out[from++] = HEX_PAIRS[v + 1];
        }
        return from;
    }
}
