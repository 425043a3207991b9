/* Encoding records into a mapped segment and decoding them for get. */
#include "mq_native.h"

PyMethodDef mq_codec_methods[] = {
    {NULL, NULL, 0, NULL},
};
