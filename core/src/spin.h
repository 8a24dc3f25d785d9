/* Polling before sleeping: how long the progress thread keeps polling after it last did work,
 * and how long a caller drives the transports for its op (drive.h) or polls its op before it
 * sleeps on the op's condition variable.
 *
 * A sleeping thread costs a wake-up (about 13 us on the 2-vCPU VM this was measured on) each
 * time it is needed, and a small read needs four: the caller's submit, the reply at the
 * initiator, the request at the target, the caller's completion. Polling for a short window after
 * activity keeps a busy pair of engines hot and costs nothing on an idle one. */
#ifndef CX_SPIN_H
#define CX_SPIN_H

#include <stdint.h>

#include "connex/options.h"
#include "units.h"

struct cx_op;
struct cx_engine;

/* CONNEX_POLL_US: the window, in microseconds (0 = never poll, sleep at once; at most 100000).
 * Default CX_POLL_US_DEFAULT on hosts with at least CX_POLL_MIN_CPUS online CPUs, else 0. Read
 * from the engine's parsed table; a bad value was logged when it was loaded (cx_engine_create
 * refuses it). */
#define CX_POLL_US_DEFAULT 50
#define CX_POLL_MIN_CPUS 8
uint64_t cx_spin_window_ns(const cx_opts_t *o);

/* A transfer's window: the engine's (0 stays 0), plus the time its `len` bytes take at
 * CX_POLL_BYTES_PER_US, at most CX_POLL_MAX_NS in all. A caller whose op outlasts its window
 * hands it to the progress thread and sleeps: two wake-ups (that thread's, then its own) on an
 * op that a raw loop ends by polling. With a flat 50 us window, measured on the 2-vCPU VM:
 * 1 MiB ucx_shm reads 100-130 us against 48 with a window that covered them, libfabric_shm
 * writes 3.9 ms against 95 us. 1 GB/s is slower than every transport measured here but UCX over
 * TCP (1.1 GB/s): a window covers the op, and one that ends sooner costs nothing. */
#define CX_POLL_BYTES_PER_US 1000
#define CX_POLL_MAX_NS (100 * CX_NS_PER_MS)
uint64_t cx_spin_for_len(uint64_t window_ns, uint64_t len);

/* The op's done flag, read and written atomically: a caller polls it without the op's mutex. */
int cx_op_is_done(const struct cx_op *op);
void cx_op_set_done(struct cx_op *op);

/* Caller side: poll the op's done flag for up to the engine's window. Returns 1 when done. */
int cx_op_spin(const struct cx_op *op, uint64_t window_ns);

/* Progress thread: the epoll timeout to use (0 while within the window after the last work and
 * no caller drives, else `sleep_ms`), and a yield while polling so that a thread that needs this
 * CPU gets it. */
int cx_spin_timeout_ms(const struct cx_engine *e, uint64_t now_ns, int sleep_ms);

#endif
