/* The SYNC flush path's wait (flushwait.c): where a put blocks until its bytes are durable, without the GIL.
 *
 * Mechanism only: Python (flush/services.py, GroupCommitService) decides who flushes, how often and with what
 * timeout; the C side keeps the durable position and wakes the threads whose position it covers.
 */
#ifndef MQ_FLUSHWAIT_H
#define MQ_FLUSHWAIT_H

#include "mq_native.h"

extern PyMethodDef mq_flush_methods[];  /* flushwait.c: FlushGate(), the SYNC producers' wait */

#endif
