/* CRC-32 with zlib's polynomial, through the zlib the build links. */
#include <limits.h>
#include <zlib.h>

#include "mq_format.h"

uint32_t mq_crc32(uint32_t crc, const uint8_t *data, size_t length) {
    uLong value = crc;
    while (length > 0) {  /* zlib takes a uInt length */
        uInt step = length > UINT_MAX ? UINT_MAX : (uInt)length;
        value = crc32(value, data, step);
        data += step;
        length -= step;
    }
    return (uint32_t)value;
}
