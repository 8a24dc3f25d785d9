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
    b->epfd = epoll_create1(EPOLL_CLOEXEC);
    b->sigfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    b->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (b->epfd < 0 || b->sigfd < 0 || b->tfd < 0) {
        cx_error("ucx: epoll/eventfd/timerfd: %s", strerror(errno));
        return CX_ERR;
    }
    int fds[2] = { b->sigfd, b->tfd };
    for (int i = 0; i < 2; i++) {
        struct epoll_event ev = { .events = EPOLLIN, .data.fd = fds[i] };
        if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
            cx_error("ucx: epoll_ctl: %s", strerror(errno));
            return CX_ERR;
        }
    }
    return CX_OK;
}

/* A worker with its AM handlers, its event fd in our epoll set and its address blob. Every
 * worker of the backend has the same parameters (rotation makes more of them). */
cx_ucx_wk_t *cx_ucx_wk_new(cx_ucx_t *b, uint32_t gen)
{
    cx_ucx_wk_t *wk = calloc(1, sizeof *wk);
    if (!wk) return NULL;
    wk->b = b;
    wk->gen = gen;
    wk->efd = -1;
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    /* SERIALIZED rather than SINGLE: open and close may run on the creating thread, everything
     * else on the progress thread, never two at once */
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t st = cx_ucx_lib.ucp_worker_create(b->ctx, &wp, &wk->w);
    if (st != UCS_OK) {
        cx_warn("ucx: ucp_worker_create failed: %s", cx_ucx_lib.ucs_status_string(st));
        free(wk);
        return NULL;
    }
    if (cx_ucx_am_init(wk) != CX_OK) goto fail;
    st = cx_ucx_lib.ucp_worker_get_efd(wk->w, &wk->efd);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_get_efd failed: %s", cx_ucx_lib.ucs_status_string(st));
        goto fail;
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = wk->efd };
    if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, wk->efd, &ev) != 0) {
        cx_error("ucx: epoll_ctl: %s", strerror(errno));
        wk->efd = -1;
        goto fail;
    }
    ucp_address_t *wa;
    size_t wal;
    st = cx_ucx_lib.ucp_worker_get_address(wk->w, &wa, &wal);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_worker_get_address failed: %s", cx_ucx_lib.ucs_status_string(st));
        goto fail;
    }
    cx_wr_t w;
    cx_wr_init(&w, wk->addr, sizeof wk->addr);
    cx_ucx_blob_put(&w, CX_UCX_ADDR_MAGIC, wa, wal);
    cx_ucx_lib.ucp_worker_release_address(wk->w, wa);
    if (!w.ok) {
        cx_error("ucx: worker address of %zu bytes is too long", wal);
        goto fail;
    }
    wk->addr_len = w.len;
    return wk;
fail:
    cx_ucx_wk_destroy(b, wk);
    return NULL;
}

/* The worker and everything UCX kept on it (zombie endpoints, requests that never completed);
 * then what of ours only those requests still named. */
void cx_ucx_wk_destroy(cx_ucx_t *b, cx_ucx_wk_t *wk)
{
    if (!wk) return;
    if (wk->efd >= 0 && epoll_ctl(b->epfd, EPOLL_CTL_DEL, wk->efd, NULL) != 0)
        cx_warn("ucx: epoll_ctl(DEL): %s", strerror(errno));
    if (wk->w) cx_ucx_lib.ucp_worker_destroy(wk->w);
    for (cx_ucx_op_t *op = b->zombies.next, *nx; op && op != &b->zombies; op = nx) {
        nx = op->next;
        if (op->ue && op->ue->wk == wk) {
            cx_ucx_list_del(op);
            op->pending = 0;
            cx_ucx_op_release(b, op); /* frees it (finished, delivered) */
        }
    }
    /* finished ops not handed back yet (a rescue's, ucx_rot.c): no request of theirs is left */
    for (cx_ucx_op_t *op = b->done.next; op && op != &b->done; op = op->next)
        if (op->ue && op->ue->wk == wk) op->pending = 0;
    for (cx_ucx_ctl_t *c = b->ctl.next, *nx; c && c != &b->ctl; c = nx) {
        nx = c->next;
        if (c->wk == wk) cx_ucx_ctl_free(c);
    }
    for (cx_ucx_in_t *in = b->in_head; in; in = in->next) {
        if (in->pending && in->wk == wk) {
            in->pending = 0;
            in->failed = 1;
        }
    }
    free(wk);
}

/* Can an endpoint have peer error handling here? Asked once, at open, of an endpoint from our
 * new worker to a throwaway one, closed and the throwaway destroyed at once (so nothing of the
 * probe outlives it: no socket, no endpoint; the far side, where wireup may create an endpoint,
 * is the throwaway; a worker costs 3-25 ms here, the shm ones the most), rather than per connect: a peer that connected first has already made UCX create
 * its side of the endpoint (wireup) in its mode, and UCX 1.13 then refuses an endpoint in the
 * other mode ("asymmetric endpoint configuration", and an assertion later). With UCX_TLS limited
 * to shm transports none can (ucx_ep.c). */
static void cx_ucx_probe_peer_mode(cx_ucx_t *b)
{
    cx_ucx_wk_t *w1 = b->cur, *w2 = cx_ucx_wk_new(b, 0);
    const uint8_t *wa;
    size_t n;
    void *copy = NULL;
    if (!w2 || cx_ucx_blob_get(w2->addr, w2->addr_len, CX_UCX_ADDR_MAGIC, &wa, &n) || !(copy = malloc(n))) {
        cx_warn("ucx: could not probe for peer error handling; trying it per endpoint");
        goto out;
    }
    memcpy(copy, wa, n);
    ucp_ep_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = (const ucp_address_t *)copy;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep;
    ucs_status_t st = cx_ucx_lib.ucp_ep_create(w1->w, &p, &ep);
    if (st != UCS_OK) {
        if (st != UCS_ERR_UNREACHABLE)
            cx_warn("ucx: probing for peer error handling: %s", cx_ucx_lib.ucs_status_string(st));
        b->no_peer_mode = 1;
        cx_info("ucx: no transport with peer error handling (UCX_TLS=%s); endpoints go without it",
                getenv("UCX_TLS") ? getenv("UCX_TLS") : "");
        goto out;
    }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = cx_ucx_lib.ucp_ep_close_nbx(ep, &rp);
    if (r && !UCS_PTR_IS_ERR(r)) {
        uint64_t deadline = cx_ucx_now_ns() + (uint64_t)CX_UCX_CLOSE_MS * 1000000ull;
        while (cx_ucx_lib.ucp_request_check_status(r) == UCS_INPROGRESS && cx_ucx_now_ns() < deadline) {
            cx_ucx_lib.ucp_worker_progress(w1->w);
            cx_ucx_lib.ucp_worker_progress(w2->w);
        }
        cx_ucx_lib.ucp_request_free(r);
    }
out:
    free(copy);
    cx_ucx_wk_destroy(b, w2);
}

static int cx_ucx_open(const cx_backend_params_t *prm, cx_backend_t **out)
{
    if (!prm || !out) return CX_EINVAL;
    if (!prm->opts) {
        cx_error("ucx: open without the engine's options table (cx_backend_params_t.opts)");
        return CX_EINVAL;
    }
    if (cx_ucx_lib_load()) return CX_EUNSUPPORTED;
    cx_ucx_t *b = calloc(1, sizeof *b);
    if (!b) return CX_ENOMEM;
    b->core = prm->core;
    b->opts = prm->opts;
    b->inc = prm->incarnation;
    b->gpu_direct = prm->gpu_direct;
    cx_objcache_init(&b->free_ops, sizeof(cx_ucx_op_t), CX_UCX_FREE_OPS_MAX);
    b->epfd = b->sigfd = b->tfd = -1;
    b->eps.next = b->eps.prev = &b->eps;
    b->ctl.next = b->ctl.prev = &b->ctl;
    b->done.next = b->done.prev = &b->done;
    b->zombies.next = b->zombies.prev = &b->zombies;

    cx_ucx_log_route();
    ucp_config_t *cfg;
    ucs_status_t st = cx_ucx_lib.ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        cx_error("ucx: ucp_config_read failed (check the UCX_* variables): %s", cx_ucx_lib.ucs_status_string(st));
        free(b);
        return CX_EUNSUPPORTED;
    }
    /* tcp over the interface peers reach: the listen address's, or where that is a wildcard
     * (0.0.0.0, ::), the advertised address's (ucx_env.c, cx_ucx_net_devices). */
    const char *ip = prm->listen_ip;
    if ((!ip || !*ip || !strcmp(ip, "0.0.0.0") || !strcmp(ip, "::")) && prm->advertise_ip && *prm->advertise_ip)
        ip = prm->advertise_ip;
    int rc = cx_ucx_config(cfg, prm, ip);
    if (rc != CX_OK) {
        cx_ucx_lib.ucp_config_release(cfg);
        free(b);
        return rc;
    }
    ucp_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.name = "connex";
    st = cx_ucx_init(&p, cfg, &b->ctx);
    cx_ucx_lib.ucp_config_release(cfg);
    if (st != UCS_OK) {
        cx_warn("ucx: ucp_init failed: %s", cx_ucx_lib.ucs_status_string(st));
        free(b);
        return CX_EUNSUPPORTED;
    }
    if (cx_ucx_fds(b) != CX_OK) {
        cx_ucx_close((cx_backend_t *)b);
        return CX_EUNSUPPORTED;
    }
    if (!(b->cur = cx_ucx_wk_new(b, 0))) {
        cx_ucx_close((cx_backend_t *)b);
        return CX_EUNSUPPORTED;
    }
    cx_ucx_probe_peer_mode(b);
    cx_ucx_rot_init(b);
    b->bounce_all = cx_ucx_opt(b, "CONNEX_UCX_READ_BOUNCE") == 1; /* auto|1 */
    b->answer_min = (size_t)cx_ucx_opt(b, "CONNEX_UCX_READ_ANSWER_MIN");
    cx_ucx_cma_open(b);
    cx_info("ucx: opened UCX %s, worker address %zu bytes", cx_ucx_lib.ucp_get_version_string(), b->cur->addr_len);
    *out = (cx_backend_t *)b;
    return CX_OK;
}

static void cx_ucx_close(cx_backend_t *bb)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    if (!b) return;
    while (b->eps.next != &b->eps) cx_ucx_disconnect(bb, b->eps.next, CX_ECLOSED);
    /* finished ops of no endpoint any more (cannot happen, but never leave an xfer behind) */
    while (b->done.next != &b->done) cx_ucx_op_deliver(b, b->done.next);
    while (b->old) {
        cx_ucx_wk_t *wk = b->old;
        b->old = wk->next;
        cx_ucx_wk_destroy(b, wk);
    }
    cx_ucx_wk_destroy(b, b->cur);
    if (b->ctx) cx_ucx_lib.ucp_cleanup(b->ctx);
    cx_ucx_inbox_free(b);
    cx_ucx_upd_free(b);
    cx_ucx_hung_free(b);
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
    /* the current worker's: it changes when the worker rotates (ucx_rot.c) */
    if (*len < b->cur->addr_len) {
        cx_error("ucx: address buffer of %zu bytes, need %zu", *len, b->cur->addr_len);
        return CX_EINVAL;
    }
    cx_wr_t w;
    cx_wr_init(&w, buf, *len);
    cx_wr_bytes(&w, b->cur->addr, b->cur->addr_len);
    cx_ucx_cma_advertise(b, &w); /* the same for every worker: not part of theirs */
    if (!w.ok) {
        cx_error("ucx: address buffer of %zu bytes, need %zu", *len, b->cur->addr_len + 4 + CX_CMA_ADV_LEN);
        return CX_EINVAL;
    }
    *len = w.len;
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
        /* Before its ops are delivered (below): they end under the core's verdict. */
        cx_core_peer_error(b->core, ep->peer, (cx_cause_t)ep->cause, ep->reason); /* may disconnect ep */
    }
    while (b->done.next != &b->done) cx_ucx_op_deliver(b, b->done.next);
    cx_ucx_inbox_drain(b);
    cx_ucx_upd_drain(b);
}

static int cx_ucx_pending_work(cx_ucx_t *b)
{
    return b->errq || b->done.next != &b->done || (b->in_head && b->in_head->ready);
}

/* One pass over the workers, no arming: a caller driving the transports polls (backend.h). */
static int cx_ucx_poll(cx_backend_t *bb)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    int n = 0;
    for (cx_ucx_wk_t *wk = b->cur; wk; wk = wk == b->cur ? b->old : wk->next)
        if (!wk->wedged) n += (int)cx_ucx_lib.ucp_worker_progress(wk->w);
    cx_ucx_drain(b);
    return n > 0;
}

static int cx_ucx_progress(cx_backend_t *bb)
{
    cx_ucx_t *b = (cx_ucx_t *)bb;
    uint64_t v;
    if (b->sig_pending) {
        b->sig_pending = 0;
        if (read(b->sigfd, &v, sizeof v) < 0 && errno != EAGAIN) cx_warn("ucx: eventfd read: %s", strerror(errno));
    }
    if (b->timer_armed && read(b->tfd, &v, sizeof v) == (ssize_t)sizeof v) b->timer_armed = 0;
    uint64_t until = cx_ucx_now_ns() + CX_UCX_PROGRESS_BUDGET_NS;
    for (int round = 0; round < CX_UCX_PROGRESS_ROUNDS; round++) {
        /* the current worker, and the retired ones peers may still talk to (ucx_rot.c) */
        for (cx_ucx_wk_t *wk = b->cur; wk; wk = wk == b->cur ? b->old : wk->next) {
            for (int i = 0; i < 1024 && !wk->wedged && cx_ucx_lib.ucp_worker_progress(wk->w); i++) {
                if ((i & 15) == 15 && cx_ucx_now_ns() > until) break;
            }
        }
        cx_ucx_drain(b);
        cx_ucx_rot_tick(b);
        if (cx_ucx_now_ns() > until) break;
        if (cx_ucx_pending_work(b)) continue;
        ucs_status_t st = UCS_OK;
        for (cx_ucx_wk_t *wk = b->cur; wk && st == UCS_OK; wk = wk == b->cur ? b->old : wk->next)
            st = wk->wedged ? UCS_OK : cx_ucx_lib.ucp_worker_arm(wk->w);
        if (st == UCS_OK) return CX_OK;
        if (st != UCS_ERR_BUSY) {
            cx_error("ucx: ucp_worker_arm failed: %s", cx_ucx_lib.ucs_status_string(st));
            break;
        }
    }
    cx_ucx_signal(b); /* still busy: come back after the control sockets had their turn */
    return CX_OK;
}

const struct cx_backend_ops cx_ucx_ops = {
    .version = CX_BACKEND_API_VERSION,
    .name = "ucx",
    .open = cx_ucx_open,
    .close = cx_ucx_close,
    .address = cx_ucx_address,
    .wait_fd = cx_ucx_wait_fd,
    .progress = cx_ucx_progress,
    .poll = cx_ucx_poll,
    .mem_reg = cx_ucx_mem_reg,
    .mem_dereg = cx_ucx_mem_dereg,
    .connect = cx_ucx_connect,
    .disconnect = cx_ucx_disconnect,
    .submit = cx_ucx_submit,
    .submit_batch = cx_ucx_submit_batch,
    .forget_region = cx_ucx_forget_region,
    .gpu_caps = cx_ucx_gpu_caps,
    .ep_transport = cx_ucx_ep_transport,
};
