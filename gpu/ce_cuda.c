/* The CUDA copy engine: one non-blocking stream per direction in the device's primary context,
 * so H2D and D2H copies run on separate copy engines and overlap each other and the network.
 * Completion comes from cuLaunchHostFunc: the driver calls back on its own thread after the copy,
 * and the callback only queues the request and writes the eventfd (it must not call CUDA).
 * A copy of at most CONNEX_STAGE_SYNC_MAX bytes onto an idle stream is waited for in submit
 * instead: the host callback's wake-up costs more than such a copy takes (docs/gpu.md). */
#include "ce_impl.h"
#include "cuda_drv.h"
#include "connex/log.h"

#include "connex/options.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct cuda_ce {
    CUstream s[2];
    pthread_mutex_t mu;    /* one submitter at a time per stream pair keeps copy+callback adjacent */
    atomic_uint queued[2]; /* copies per stream whose host callback has not run yet */
    size_t sync_max;       /* CONNEX_STAGE_SYNC_MAX */
};

static void host_fn(void *arg)
{
    struct ce_req *r = arg;
    struct cuda_ce *c = r->ce->impl;
    int dir = r->dir;
    /* Completed first, counted after: a copy waited for in place sees the stream idle only
     * once this one is queued ahead of it (r may be gone after cx_ce_complete). */
    cx_ce_complete(r, CX_OK);
    atomic_fetch_sub(&c->queued[dir], 1);
}

static void cuda_stop(cx_ce_t *ce)
{
    struct cuda_ce *c = ce->impl;
    const struct cx_cuda *cu = cx_cuda();
    if (!c) return;
    if (cu && cx_cuda_ctx(ce->device) == CX_OK) {
        for (int d = 0; d < 2; d++) {
            if (!c->s[d]) continue;
            CUresult r = cu->cuStreamSynchronize(c->s[d]);
            if (r != CUDA_SUCCESS) cx_error("cuda copy engine: stream sync: %s", cx_cuda_errname(r));
            cu->cuStreamDestroy(c->s[d]);
        }
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
    ce->impl = NULL;
}

static int cuda_start(cx_ce_t *ce)
{
    const struct cx_cuda *cu = cx_cuda();
    if (!cu) return CX_EUNSUPPORTED;
    int rc = cx_cuda_ctx(ce->device);
    if (rc) return rc;
    struct cuda_ce *c = calloc(1, sizeof *c);
    if (!c) return CX_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->queued[0], 0);
    atomic_init(&c->queued[1], 0);
    unsigned long long v = 0;
    (void)cx_opt_get_num("CONNEX_STAGE_SYNC_MAX", &v); /* a bad value is logged; v is the default */
    c->sync_max = (size_t)v;
    ce->impl = c;
    for (int d = 0; d < 2; d++) {
        CUresult r = cu->cuStreamCreate(&c->s[d], CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            cx_error("cuda copy engine: cuStreamCreate: %s", cx_cuda_errname(r));
            c->s[d] = NULL;
            cuda_stop(ce);
            return CX_ERR;
        }
    }
    return CX_OK;
}

static int cuda_submit(cx_ce_t *ce, struct ce_req *r)
{
    const struct cx_cuda *cu = cx_cuda();
    struct cuda_ce *c = ce->impl;
    int rc = cx_cuda_ctx(ce->device);
    if (rc) return rc;
    CUstream s = c->s[r->dir];
    CUdeviceptr dev = (CUdeviceptr)(uintptr_t)r->dev;
    pthread_mutex_lock(&c->mu);
    CUresult e = r->dir == CX_CE_H2D ? cu->cuMemcpyHtoDAsync(dev, r->host, r->len, s)
                                     : cu->cuMemcpyDtoHAsync(r->host, dev, r->len, s);
    if (e != CUDA_SUCCESS) {
        pthread_mutex_unlock(&c->mu);
        cx_error("cuda copy engine: %s of %zu bytes (dev %p, host %p): %s",
                 r->dir == CX_CE_H2D ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", r->len, r->dev, r->host,
                 cx_cuda_errname(e));
        return CX_ERR;
    }
    /* Only onto an idle stream: behind queued copies the wait would be theirs too, and their
     * callbacks would then complete after this one. */
    if (r->len <= c->sync_max && atomic_load(&c->queued[r->dir]) == 0) {
        e = cu->cuStreamSynchronize(s);
        pthread_mutex_unlock(&c->mu);
        if (e != CUDA_SUCCESS) cx_error("cuda copy engine: stream sync: %s", cx_cuda_errname(e));
        cx_ce_complete(r, e == CUDA_SUCCESS ? CX_OK : CX_ERR);
        return CX_OK;
    }
    atomic_fetch_add(&c->queued[r->dir], 1);
    e = cu->cuLaunchHostFunc(s, host_fn, r);
    if (e != CUDA_SUCCESS) {
        /* The copy is queued but nothing will report it: wait for it here, then report it. */
        atomic_fetch_sub(&c->queued[r->dir], 1);
        cu->cuStreamSynchronize(s);
        pthread_mutex_unlock(&c->mu);
        cx_error("cuda copy engine: cuLaunchHostFunc: %s", cx_cuda_errname(e));
        cx_ce_complete(r, CX_ERR);
        return CX_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return CX_OK;
}

const struct ce_ops cx_ce_cuda_ops = { cuda_start, cuda_submit, cuda_stop };
