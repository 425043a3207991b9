/* Bulk scans of the log: dispatch, the recovery walk, Arrow columns. */
#include "mq_native.h"

PyMethodDef mq_scan_methods[] = {
    {NULL, NULL, 0, NULL},
};
