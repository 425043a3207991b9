package io.mqstore.spark;

/** Strict UTF-8 validation (no overlong forms, no surrogates, nothing above U+10FFFF), as Arrow's. */
final class Utf8 {
    private Utf8() {
    }

    static boolean valid(byte[] b, int start, int length) {
        int i = start;
        int end = start + length;
        while (i < end) {
            int c = b[i] & 0xFF;
            if (c < 0x80) {
                i++;
                continue;
            }
            int need;
            int min;
            if (c >= 0xC2 && c <= 0xDF) {
                need = 1;
                min = 0x80;
            } else if (c >= 0xE0 && c <= 0xEF) {
                need = 2;
                min = 0x800;
            } else if (c >= 0xF0 && c <= 0xF4) {
                need = 3;
                min = 0x10000;
            } else {
                return false;
            }
            if (i + need >= end) {
                return false;
            }
            int code = c & (0x3F >> need);
            for (int k = 1; k <= need; k++) {
                int d = b[i + k] & 0xFF;
                if ((d & 0xC0) != 0x80) {
                    return false;
                }
                code = (code << 6) | (d & 0x3F);
            }
            if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
                return false;
            }
            i += need + 1;
        }
        return true;
    }
}
