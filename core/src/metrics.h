/* Metrics: op latency histograms and per-peer counters, kept by the progress thread (under
 * plock, like the engine's cx_stats_t), their Prometheus text exposition (cx_stats_format), and
 * the optional GET /metrics listener (CONNEX_METRICS=ip:port) that the progress loop serves. */
#ifndef CX_METRICS_H
#define CX_METRICS_H

#include "connex/connex.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cx_engine cx_engine_t;
typedef struct cx_watch cx_watch_t;

/* Fixed upper bounds, 10 us .. 10 s; the last bucket (+Inf) is the count. */
#define CX_HIST_BUCKETS 19
extern const uint64_t cx_hist_bounds_ns[CX_HIST_BUCKETS];

typedef struct cx_hist {
    uint64_t n[CX_HIST_BUCKETS]; /* per bucket, not cumulative (cumulated when written) */
    uint64_t count, sum_ns;
} cx_hist_t;

static inline void cx_hist_add(cx_hist_t *h, uint64_t ns)
{
    int i = 0;
    while (i < CX_HIST_BUCKETS && ns > cx_hist_bounds_ns[i]) i++;
    if (i < CX_HIST_BUCKETS) h->n[i]++;
    h->count++;
    h->sum_ns += ns;
}

/* One op in 8 is timed, picked at random per calling thread (an xorshift), so that no op kind
 * aliases with a caller's pattern (reads and writes alternating). Timing every op took two clock
 * reads per op: 56-60 ns of CPU on the 2-vCPU VM (kvm-clock), where a small shared-memory op
 * takes 1-2 us. */
#define CX_HIST_SAMPLE_MASK 7u
static inline int cx_hist_sample(void)
{
    static _Thread_local uint32_t x;
    if (!x) x = (uint32_t)(uintptr_t)&x | 1u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return (x & CX_HIST_SAMPLE_MASK) == 0;
}

/* Per peer, counted by the progress thread (ops initiated here, bound to that peer). */
typedef struct cx_peer_metrics {
    uint64_t ops[CX_OPK_COUNT], bytes[CX_OPK_COUNT];
    uint64_t errors, timeouts; /* ops that ended with an error; of those, timeouts */
    uint64_t failures, joins;  /* FAILED and JOINED events about it */
    uint64_t since_ns;         /* CLOCK_MONOTONIC of its last event: its state since then */
} cx_peer_metrics_t;

/* Progress thread: the Prometheus text of the engine into a malloc'ed, NUL-terminated buffer;
 * its length in *len. NULL when out of memory. */
char *cx_metrics_render(cx_engine_t *e, size_t *len);

/* The listener. cx_metrics_check: CONNEX_METRICS's value is ip:port (CX_EINVAL otherwise, logged).
 * cx_metrics_open: at engine create, before the progress thread; a port that cannot be bound is
 * logged and the engine runs without the listener. The rest runs on the progress thread. */
int cx_metrics_check(const char *spec, char *ip, size_t iplen, uint16_t *port);
void cx_metrics_open(cx_engine_t *e);
void cx_metrics_close(cx_engine_t *e);
int cx_metrics_is_watch(const cx_engine_t *e, const cx_watch_t *w);
void cx_metrics_event(cx_engine_t *e, cx_watch_t *w, uint32_t events);
void cx_metrics_tick(cx_engine_t *e, uint64_t now);

#endif
