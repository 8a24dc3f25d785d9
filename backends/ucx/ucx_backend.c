/* The UCX backend: context and worker, the wait fd, progress, and the ops table.
 *
 * The wait fd is an epoll set of our own holding the worker's event fd (ucp_worker_get_efd), an
 * eventfd (work is pending that no UCX event will announce, e.g. ops finished inside a
 * disconnect) and a timerfd (retry a message whose sender is not known yet). The core's epoll
 * sees it readable whenever one of them is.
 */
#include "ucx_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* Then yield to the control sockets (and come back): a large transfer keeps UCX busy for as
 * long as it lasts, and the heartbeat must not wait for it. Measured: without a time bound a
 * 64 MiB message on a loaded 2-core host starved the heartbeat for over 3 s. */
#define CX_UCX_PROGRESS_ROUNDS 64
#define CX_UCX_PROGRESS_BUDGET_NS 2000000ull

uint64_t cx_ucx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void cx_ucx_signal(cx_ucx_t *b)
{
    uint64_t one = 1;
    if (b->sig_pending) return;
    b->sig_pending = 1;
    if (write(b->sigfd, &one, sizeof one) < 0 && errno != EAGAIN)
        cx_warn("ucx: eventfd write failed: %s", strerror(errno));
}

static void cx_ucx_close(cx_backend_t *bb);

static int cx_ucx_fds(cx_ucx_t *b)
{
    ucs_status_t st = ucp_worker_get_efd(b->w, &b->efd);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_get_efd failed: %s", ucs_status_string(st));
        return CX_ERR;
    }
    b->epfd = epoll_create1(EPOLL_CLOEXEC);
    b->sigfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    b->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (b->epfd < 0 || b->sigfd < 0 || b->tfd < 0) {
        cx_error("ucx: epoll/eventfd/timerfd: %s", strerror(errno));
        return CX_ERR;
    }
    int fds[3] = { b->efd, b->sigfd, b->tfd };
    for (int i = 0; i < 3; i++) {
        struct epoll_event ev = { .events = EPOLLIN, .data.fd = fds[i] };
        if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
            cx_error("ucx: epoll_ctl: %s", strerror(errno));
            return CX_ERR;
        }
    }
    return CX_OK;
}

static int cx_ucx_open(const cx_backend_params_t *prm, cx_backend_t **out)
{
    if (!prm || !out) return CX_EINVAL;
    cx_ucx_t *b = calloc(1, sizeof *b);
    if (!b) return CX_ENOMEM;
    b->core = prm->core;
    b->inc = prm->incarnation;
    b->efd = b->epfd = b->sigfd = b->tfd = -1;
    b->eps.next = b->eps.prev = &b->eps;
    b->done.next = b->done.prev = &b->done;
    b->zombies.next = b->zombies.prev = &b->zombies;

    cx_ucx_log_route();
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_config_read failed (check the UCX_* variables): %s",
                 ucs_status_string(st));
        free(b);
        return CX_EUNSUPPORTED;
    }
    int rc = cx_ucx_config(cfg);
    if (rc != CX_OK) {
        ucp_config_release(cfg);
        free(b);
        return rc;
    }
    ucp_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.name = "connex";
    st = ucp_init(&p, cfg, &b->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        cx_warn("ucx: ucp_init failed: %s", ucs_status_string(st));
        free(b);
        return CX_EUNSUPPORTED;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    /* SERIALIZED rather than SINGLE: open and close may run on the creating thread, everything
     * else on the progress thread, never two at once */
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(b->ctx, &wp, &b->w);
    if (st != UCS_OK) {
        cx_warn("ucx: ucp_worker_create failed: %s", ucs_status_string(st));
        ucp_cleanup(b->ctx);
        free(b);
        return CX_EUNSUPPORTED;
    }
    if (cx_ucx_am_init(b) != CX_OK || cx_ucx_fds(b) != CX_OK) {
        cx_ucx_close((cx_backend_t *)b);
        return CX_ERR;
    }
    ucp_address_t *wa;
    size_t wal;
    st = ucp_worker_get_address(b->w, &wa, &wal);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_get_address failed: %s", ucs_status_string(st));
        cx_ucx_close((cx_backend_t *)b);
        return CX_ERR;
    }
    cx_wr_t w;
    cx_wr_init(&w, b->addr, sizeof b->addr);
    cx_ucx_blob_put(&w, CX_UCX_ADDR_MAGIC, wa, wal);
    ucp_worker_release_address(b->w, wa);
    if (!w.ok) {
        cx_error("ucx: worker address of %zu bytes is too long", wal);
        cx_ucx_close((cx_backend_t *)b);
        return CX_EUNSUPPORTED;
    }
    b->addr_len = w.len;
    cx_info("ucx: opened UCX %s, worker address %zu bytes", ucp_get_version_string(), wal);
    *out = (cx_backend_t *)b;
    return CX_OK;
}

static void cx_ucx_close(cx_backend_t *bb)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b) return;
    while (b->eps.next != &b->eps) cx_ucx_disconnect(bb, b->eps.next);
    /* finished ops of no endpoint any more (cannot happen, but never leave an xfer behind) */
    while (b->done.next != &b->done) cx_ucx_op_deliver(b, b->done.next);
    if (b->w) ucp_worker_destroy(b->w);
    if (b->ctx) ucp_cleanup(b->ctx);
    cx_ucx_inbox_free(b);
    cx_ucx_ops_free_cache(b);
    if (b->epfd >= 0) close(b->epfd);
    if (b->sigfd >= 0) close(b->sigfd);
    if (b->tfd >= 0) close(b->tfd);
    free(b);
}

static int cx_ucx_address(cx_backend_t *bb, void *buf, size_t *len)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b || !buf || !len) return CX_EINVAL;
    if (*len < b->addr_len) {
        cx_error("ucx: address buffer of %zu bytes, need %zu", *len, b->addr_len);
        return CX_EINVAL;
    }
    memcpy(buf, b->addr, b->addr_len);
    *len = b->addr_len;
    return CX_OK;
}

static int cx_ucx_wait_fd(cx_backend_t *bb)
{
    return bb ? ((cx_ucx_t *)bb)->epfd : -1;
}

/* Everything callbacks recorded, told to the core now that UCX is not on the stack. */
void cx_ucx_drain(cx_ucx_t *b)
{
    while (b->errq) {
        cx_bep_t *ep = b->errq;
        b->errq = ep->err_next;
        ep->err_queued = 0;
        cx_warn("ucx: endpoint error: %s", ep->reason);
        cx_core_peer_error(b->core, ep->peer, ep->reason);   /* may disconnect ep */
    }
    while (b->done.next != &b->done) cx_ucx_op_deliver(b, b->done.next);
    cx_ucx_inbox_drain(b);
}

static int cx_ucx_pending_work(cx_ucx_t *b)
{
    return b->errq || b->done.next != &b->done || (b->in_head && b->in_head->ready);
}

static int cx_ucx_progress(cx_backend_t *bb)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    uint64_t v;
    if (b->sig_pending) {
        b->sig_pending = 0;
        if (read(b->sigfd, &v, sizeof v) < 0 && errno != EAGAIN)
            cx_warn("ucx: eventfd read: %s", strerror(errno));
    }
    if (b->timer_armed && read(b->tfd, &v, sizeof v) == (ssize_t)sizeof v) b->timer_armed = 0;
    uint64_t until = cx_ucx_now_ns() + CX_UCX_PROGRESS_BUDGET_NS;
    for (int round = 0; round < CX_UCX_PROGRESS_ROUNDS; round++) {
        for (int i = 0; i < 1024 && ucp_worker_progress(b->w); i++) {
            if ((i & 15) == 15 && cx_ucx_now_ns() > until) break;
        }
        cx_ucx_drain(b);
        if (cx_ucx_now_ns() > until) break;
        if (cx_ucx_pending_work(b)) continue;
        ucs_status_t st = ucp_worker_arm(b->w);
        if (st == UCS_OK) return CX_OK;
        if (st != UCS_ERR_BUSY) {
            cx_error("ucx: ucp_worker_arm failed: %s", ucs_status_string(st));
            break;
        }
    }
    cx_ucx_signal(b);   /* still busy: come back after the control sockets had their turn */
    return CX_OK;
}

const struct cx_backend_ops cx_ucx_ops = {
    .name = "ucx",
    .open = cx_ucx_open,
    .close = cx_ucx_close,
    .address = cx_ucx_address,
    .wait_fd = cx_ucx_wait_fd,
    .progress = cx_ucx_progress,
    .mem_reg = cx_ucx_mem_reg,
    .mem_dereg = cx_ucx_mem_dereg,
    .connect = cx_ucx_connect,
    .disconnect = cx_ucx_disconnect,
    .submit = cx_ucx_submit,
    .forget_region = cx_ucx_forget_region,
    .gpu_caps = cx_ucx_gpu_caps,
};
