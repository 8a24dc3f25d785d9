/* The copy engine's front: requests, the completion list and the eventfd that wakes the core's
 * epoll loop. The copies themselves are done by ce_cuda.c or ce_sim.c. */
#include "ce_impl.h"
#include "connex/log.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static void efd_signal(int efd)
{
    uint64_t one = 1;
    /* EAGAIN means the counter is already huge: the fd is readable anyway. */
    while (write(efd, &one, sizeof one) < 0 && errno == EINTR) {}
}

int cx_ce_create(int kind, int device, cx_ce_t **out)
{
    *out = NULL;
    const struct ce_ops *ops = kind == CX_MEM_CUDA ? &cx_ce_cuda_ops : kind == CX_MEM_SIM ? &cx_ce_sim_ops : NULL;
    if (!ops) {
        cx_error("copy engine: memory kind %d has none", kind);
        return CX_EINVAL;
    }
    if (kind == CX_MEM_CUDA && (device < 0 || device >= cx_gpu_cuda_devices())) {
        cx_error("copy engine: cuda device %d not usable (%s)", device, cx_gpu_status());
        return CX_EUNSUPPORTED;
    }
    cx_ce_t *ce = calloc(1, sizeof *ce);
    if (!ce) return CX_ENOMEM;
    ce->kind = kind;
    ce->device = device;
    ce->ops = ops;
    ce->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ce->efd < 0) {
        cx_error("copy engine: eventfd: %s", strerror(errno));
        free(ce);
        return CX_ERR;
    }
    pthread_mutex_init(&ce->mu, NULL);
    atomic_init(&ce->inflight, 0);
    int rc = ops->start(ce);
    if (rc) {
        close(ce->efd);
        pthread_mutex_destroy(&ce->mu);
        free(ce);
        return rc;
    }
    *out = ce;
    return CX_OK;
}

void cx_ce_destroy(cx_ce_t *ce)
{
    if (!ce) return;
    ce->ops->stop(ce);
    struct ce_req *r = ce->done_head;
    while (r) {
        struct ce_req *n = r->next;
        free(r);
        r = n;
    }
    close(ce->efd);
    pthread_mutex_destroy(&ce->mu);
    free(ce);
}

int cx_ce_fd(const cx_ce_t *ce)
{
    return ce->efd;
}
int cx_ce_kind(const cx_ce_t *ce)
{
    return ce->kind;
}
unsigned cx_ce_inflight(const cx_ce_t *ce)
{
    return atomic_load(&((cx_ce_t *)ce)->inflight);
}
void cx_ce_kick(cx_ce_t *ce)
{
    efd_signal(ce->efd);
}

int cx_ce_copy(cx_ce_t *ce, int dir, void *dev, void *host, size_t len, void *cookie)
{
    if (!ce || (dir != CX_CE_H2D && dir != CX_CE_D2H) || !dev || !host || len == 0) {
        cx_error("copy engine: bad copy (dir %d, dev %p, host %p, len %zu)", dir, dev, host, len);
        return CX_EINVAL;
    }
    struct ce_req *r = calloc(1, sizeof *r);
    if (!r) return CX_ENOMEM;
    *r = (struct ce_req){ NULL, ce, dir, dev, host, len, cookie, CX_OK };
    atomic_fetch_add(&ce->inflight, 1);
    int rc = ce->ops->submit(ce, r);
    if (rc) {
        atomic_fetch_sub(&ce->inflight, 1);
        free(r);
    }
    return rc;
}

void cx_ce_complete(struct ce_req *r, int status)
{
    cx_ce_t *ce = r->ce;
    r->status = status;
    r->next = NULL;
    pthread_mutex_lock(&ce->mu);
    if (ce->done_tail)
        ce->done_tail->next = r;
    else
        ce->done_head = r;
    ce->done_tail = r;
    pthread_mutex_unlock(&ce->mu);
    efd_signal(ce->efd);
}

int cx_ce_poll(cx_ce_t *ce, cx_ce_done_t *out, int max)
{
    uint64_t v;
    /* Clear the fd before taking the list: a completion queued after this read writes the fd
     * again, so none is left without a wake-up. */
    if (read(ce->efd, &v, sizeof v) < 0 && errno != EAGAIN && errno != EINTR)
        cx_warn("copy engine: eventfd read: %s", strerror(errno));
    int n = 0;
    pthread_mutex_lock(&ce->mu);
    while (n < max && ce->done_head) {
        struct ce_req *r = ce->done_head;
        ce->done_head = r->next;
        if (!ce->done_head) ce->done_tail = NULL;
        out[n++] = (cx_ce_done_t){ r->cookie, r->status };
        free(r);
    }
    int more = ce->done_head != NULL;
    pthread_mutex_unlock(&ce->mu);
    if (more) efd_signal(ce->efd); /* the caller stopped at max: keep the fd readable */
    atomic_fetch_sub(&ce->inflight, (unsigned)n);
    return n;
}
