/* The SYNC flush path (flushwait.c): where a put blocks until its bytes are durable, without the GIL, and where
 * the leader flushes the CommitLog.
 *
 * Python (flush/services.py, GroupCommitService) decides who flushes, how often and with what timeout; the C
 * side keeps the durable position, wakes the threads whose position it covers, and runs the common flush.
 */
#ifndef MQ_FLUSHWAIT_H
#define MQ_FLUSHWAIT_H

#include "mq_native.h"

extern PyMethodDef mq_flush_methods[];  /* flushwait.c: FlushGate(), the SYNC producers' wait */

/* Whether `object` is a FlushGate. */
int mq_is_flush_gate(PyObject *object);

/* The SYNC wait of a put whose record ends at `position`, as flush/services.py's `_wait_gate`, while it can stay
 * in C (a bound gate, a caller that may lead): 1 durable; 0 for the Python path, with the time left of
 * `timeout_s` in *left_s (0 after a timeout or a closed gate: Python tells durable from not); -1 with an error. */
int mq_gate_sync_wait(PyObject *gate, long long position, double timeout_s, double *left_s);

#endif
