/* Internal to gpu/: what the copy-engine front (ce.c) shares with its CUDA and sim halves. */
#ifndef CX_CE_IMPL_H
#define CX_CE_IMPL_H

#include "cx_gpu.h"

#include <pthread.h>
#include <stdatomic.h>

struct ce_req {
    struct ce_req *next;
    cx_ce_t *ce;
    int dir;
    void *dev, *host;
    size_t len;
    void *cookie;
    int status;
};

struct ce_ops {
    int (*start)(cx_ce_t *ce);
    /* Queue r; on success r reaches cx_ce_complete exactly once (on any thread). */
    int (*submit)(cx_ce_t *ce, struct ce_req *r);
    /* Wait for every queued copy to complete, then release the streams or threads. */
    void (*stop)(cx_ce_t *ce);
};

struct cx_ce {
    int kind, device;
    int efd;
    pthread_mutex_t mu;
    struct ce_req *done_head, *done_tail;
    atomic_uint inflight;
    const struct ce_ops *ops;
    void *impl;
};

/* From any thread: r finished with status; queue it for cx_ce_poll and wake the fd. */
void cx_ce_complete(struct ce_req *r, int status);

extern const struct ce_ops cx_ce_sim_ops;
extern const struct ce_ops cx_ce_cuda_ops;

#endif
