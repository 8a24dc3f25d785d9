/* Poll-then-sleep for callers and the progress thread (spin.h). */
#include "spin.h"
#include "connex/options.h"
#include "engine.h"
#include "drive.h"

#include "connex/log.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

/* Polling pays only where a core is free for it: a caller, its progress thread and a same-host
 * target's progress thread polling at once on two vCPUs often take turns at the scheduler
 * instead (measured on the 2-vCPU VM: ucx_tcp 4 KiB reads 25% faster, zmq slower, libfabric
 * mixed; docs/semantics.md). */
static uint64_t default_window_ns(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= CX_POLL_MIN_CPUS ? CX_POLL_US_DEFAULT * 1000ull : 0;
}

uint64_t cx_spin_window_ns(const cx_opts_t *o)
{
    int set = 0;
    unsigned long long v = cx_opts_num(o, "CONNEX_POLL_US", &set);
    if (!set) return default_window_ns(); /* unset, or bad (logged when the table was loaded) */
    return (uint64_t)v * 1000ull;
}

uint64_t cx_spin_for_len(uint64_t window_ns, uint64_t len)
{
    if (!window_ns || window_ns >= CX_POLL_MAX_NS) return window_ns;
    uint64_t us = len / CX_POLL_BYTES_PER_US, room = CX_POLL_MAX_NS - window_ns;
    return us >= room / CX_NS_PER_US ? CX_POLL_MAX_NS : window_ns + cx_us_to_ns(us);
}

int cx_op_is_done(const struct cx_op *op)
{
    return __atomic_load_n(&op->done, __ATOMIC_ACQUIRE);
}

void cx_op_set_done(struct cx_op *op)
{
    __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
}

/* Check the clock every CX_SPIN_CLOCK_EVERY polls: the flag is one load, the clock a vDSO call. */
#define CX_SPIN_CLOCK_EVERY 64u

int cx_op_spin(const struct cx_op *op, uint64_t window_ns)
{
    if (!window_ns) return cx_op_is_done(op);
    uint64_t end = cx_now_ns() + window_ns;
    for (unsigned i = 1;; i++) {
        if (cx_op_is_done(op)) return 1;
        if (!(i % CX_SPIN_CLOCK_EVERY)) {
            if (cx_now_ns() >= end) return 0;
            sched_yield(); /* 2 vCPUs and three busy threads: let the one with work run */
        }
    }
}

int cx_spin_timeout_ms(const struct cx_engine *e, uint64_t now_ns, int sleep_ms)
{
    /* While a caller drives the transports itself (drive.h), or between the ops of callers that
     * do, a polling progress thread would only keep them from the lock: on a small host it then
     * wakes for the lock as each caller lets go, on the CPU the peer polls on (measured: 4 KiB
     * shm reads at 21-28 us, against 2). */
    if (e->spin_ns && now_ns - e->last_work_ns < e->pwin_ns && !atomic_load(&((struct cx_engine *)e)->drivers) &&
        !cx_drive_recent(e, now_ns)) {
        sched_yield();
        return 0;
    }
    return sleep_ms;
}
