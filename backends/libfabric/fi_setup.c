/* Opening the libfabric backend: provider choice, domain, RDM endpoint, CQ wait object. */
#include "fi_int.h"
#include "connex/options.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* Without a user choice: RDMA first, then TCP. shm only when asked for (one provider per open
 * backend; same-host selection is the selection layer's matter). */
static const char *const cx_fi_default_order[] = { "efa", "verbs;ofi_rxm", "tcp;ofi_rxm", NULL };

static int cx_fi_is_wildcard(const char *ip)
{
    return !ip || !*ip || !strcmp(ip, "0.0.0.0") || !strcmp(ip, "::");
}

/* The address the tcp provider binds: the listen address, or where that is a wildcard the
 * advertised one, which peers are told and reach (without a node it would take an address of
 * its own choice, maybe one peers cannot reach). */
static const char *cx_fi_bind_ip(const cx_backend_params_t *p)
{
    if (cx_fi_is_wildcard(p->listen_ip) && p->advertise_ip && !cx_fi_is_wildcard(p->advertise_ip))
        return p->advertise_ip;
    return p->listen_ip;
}

static struct fi_info *cx_fi_hints(const char *prov, const char *domain, int gpu)
{
    struct fi_info *h = cx_fi_dupinfo(NULL);
    if (!h) return NULL;
    h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
    if (gpu) h->caps |= FI_HMEM;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    /* Every mode we can honour; the provider keeps the ones it needs (read back from fi_info). */
    h->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (gpu ? FI_MR_HMEM : 0);
    /* One thread at a time touches the backend: the core's transport lock (core/src/drive.h). */
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->addr_format = FI_FORMAT_UNSPEC;
    if (prov) {
        h->fabric_attr->prov_name = strdup(prov);
        if (!h->fabric_attr->prov_name) {
            cx_fi_freeinfo(h);
            return NULL;
        }
    }
    if (domain && *domain) {
        h->domain_attr->name = strdup(domain);
        if (!h->domain_attr->name) {
            cx_fi_freeinfo(h);
            return NULL;
        }
    }
    return h;
}

static int cx_fi_query(const char *prov, const char *domain, const char *ip, int gpu, struct fi_info **out)
{
    struct fi_info *h = cx_fi_hints(prov, domain, gpu);
    if (!h) return -FI_ENOMEM;
    /* tcp binds to the engine's address (its advertised one when it listens on every
     * interface: cx_fi_bind_ip); RDMA providers pick their device themselves (the engine's
     * address is the control network, often not the RDMA one). */
    const char *node = NULL;
    if (prov && !strncmp(prov, "tcp", 3) && !cx_fi_is_wildcard(ip)) node = ip;
    int r = cx_fi_getinfo(CX_FI_API_VERSION, node, NULL, node ? FI_SOURCE : 0, h, out);
    cx_fi_freeinfo(h);
    return r;
}

static void cx_fi_free(cx_backend_t *b)
{
    cx_fi_guard_stop(b);
    if (b->ep) fi_close(&b->ep->fid);
    if (b->rxmr) fi_close(&b->rxmr->fid);
    if (b->txmr) fi_close(&b->txmr->fid);
    if (b->av) fi_close(&b->av->fid);
    if (b->cq) fi_close(&b->cq->fid);
    if (b->domain) fi_close(&b->domain->fid);
    if (b->fabric) fi_close(&b->fabric->fid);
    if (b->info) cx_fi_freeinfo(b->info);
    cx_fi_bell_close(b);
    if (b->efd >= 0) close(b->efd);
    if (b->evfd >= 0) close(b->evfd);
    if (b->tfd >= 0) close(b->tfd);
    if (b->qfd >= 0) close(b->qfd);
    cx_objcache_drain(&b->op_cache);
    free(b->rxmem);
    free(b->txmem);
    free(b);
}

static int cx_fi_open_cq(cx_backend_t *b)
{
    struct fi_cq_attr ca;
    memset(&ca, 0, sizeof ca);
    ca.format = FI_CQ_FORMAT_DATA; /* remote CQ data: headerless read answers (fi_wb.c) */
    ca.size = 4096;
    ca.wait_obj = FI_WAIT_FD;
    int r = fi_cq_open(b->domain, &ca, &b->cq, NULL);
    if (r == 0) {
        r = fi_control(&b->cq->fid, FI_GETWAIT, &b->cq_fd);
        if (r == 0) return 0;
        cx_warn("libfabric: %s: CQ has no wait fd (%s); polling", b->prov, cx_fi_strerror(-r));
        fi_close(&b->cq->fid);
        b->cq = NULL;
    } else {
        cx_info("libfabric: %s: no FI_WAIT_FD CQ (%s); polling", b->prov, cx_fi_strerror(-r));
    }
    b->cq_fd = -1;
    ca.wait_obj = FI_WAIT_NONE;
    return fi_cq_open(b->domain, &ca, &b->cq, NULL);
}

int cx_fi_ep_open(cx_backend_t *b, uint32_t gen, cx_fi_epn_t *n)
{
    memset(n, 0, sizeof *n);
    int r;
    if ((r = fi_endpoint(b->domain, b->info, &n->ep, NULL)) || (r = cx_fi_shm_name(b, n->ep, gen, n->shm)) ||
        (r = fi_ep_bind(n->ep, &b->cq->fid, FI_TRANSMIT | FI_RECV)) || (r = fi_ep_bind(n->ep, &b->av->fid, 0)) ||
        (r = fi_enable(n->ep))) {
        cx_warn("libfabric: %s: endpoint setup: %s", b->prov, cx_fi_strerror(-r));
        goto fail;
    }
    n->name_len = sizeof n->name;
    if ((r = fi_getname(&n->ep->fid, n->name, &n->name_len))) {
        cx_warn("libfabric: %s: fi_getname: %s", b->prov, cx_fi_strerror(-r));
        goto fail;
    }
    /* The blob names the provider so that a peer on another fabric refuses it at connect. */
    cx_wr_t w;
    cx_wr_init(&w, n->addr, sizeof n->addr);
    cx_fi_addr_t a = {
        .fmt = b->info->addr_format, .name = n->name, .name_len = n->name_len, .pid = (uint32_t)getpid()
    };
    snprintf(a.prov, sizeof a.prov, "%s", b->prov);
    cx_fi_addr_put(&w, &a);
    if (!w.ok) {
        r = -FI_ETOOSMALL;
        goto fail;
    }
    n->addr_len = w.len;
    return 0;
fail:
    if (n->ep) fi_close(&n->ep->fid);
    n->ep = NULL;
    return r ? r : -FI_EOTHER;
}

static int cx_fi_setup(cx_backend_t *b, const cx_backend_params_t *p)
{
    struct fi_info *in = b->info;
    int r;
    snprintf(b->prov, sizeof b->prov, "%s", in->fabric_attr->prov_name);
    b->mr_mode = in->domain_attr->mr_mode;
    b->hmem = (in->caps & FI_HMEM) != 0;
    b->max_msg = in->ep_attr->max_msg_size;
    b->prov_version = in->fabric_attr->prov_version;
    b->wb = cx_fi_wb_choose(b);
    cx_fi_cma_open(b);
    /* Headerless read answers carry their header in 8 bytes of remote CQ data (fi_wb.c). */
    b->rd_raw = b->rd_inline && in->domain_attr->cq_data_size >= 8 ? b->rd_part + CX_FM_HDR + CX_FM_RDATA_HDR : 0;
    b->eager_max = CX_FI_BUF;
    if ((b->shm_direct = cx_fi_shm_direct(b)) && in->tx_attr->inject_size >= 256 &&
        in->tx_attr->inject_size < CX_FI_BUF)
        b->eager_max = in->tx_attr->inject_size;
    if ((r = cx_fi_fabric(in->fabric_attr, &b->fabric, NULL)) || (r = fi_domain(b->fabric, in, &b->domain, NULL))) {
        cx_warn("libfabric: %s: fabric/domain: %s", b->prov, cx_fi_strerror(-r));
        return r;
    }
    if ((r = cx_fi_open_cq(b))) {
        cx_warn("libfabric: %s: fi_cq_open: %s", b->prov, cx_fi_strerror(-r));
        return r;
    }
    struct fi_av_attr aa;
    memset(&aa, 0, sizeof aa);
    aa.type = FI_AV_TABLE;
    if ((r = fi_av_open(b->domain, &aa, &b->av, NULL))) {
        cx_warn("libfabric: %s: fi_av_open: %s", b->prov, cx_fi_strerror(-r));
        return r;
    }
    cx_fi_epn_t n;
    if ((r = cx_fi_ep_open(b, 0, &n))) return r;
    b->ep = n.ep;
    memcpy(b->shm_self, n.shm, sizeof b->shm_self);
    memcpy(b->addr, n.addr, n.addr_len);
    b->addr_len = n.addr_len;
    if (b->shm_self[0]) cx_fi_guard_start(b, b->shm_self); /* the region exists once enabled */

    b->rxmem = aligned_alloc(4096, (size_t)CX_FI_NRX * CX_FI_BUF);
    b->txmem = aligned_alloc(4096, (size_t)CX_FI_NTX * CX_FI_BUF);
    if (!b->rxmem || !b->txmem) return -FI_ENOMEM;
    if ((r = cx_fi_mr_reg(b, b->rxmem, (size_t)CX_FI_NRX * CX_FI_BUF, FI_RECV, CX_MEM_HOST, &b->rxmr)) ||
        (r = cx_fi_mr_reg(b, b->txmem, (size_t)CX_FI_NTX * CX_FI_BUF, FI_SEND, CX_MEM_HOST, &b->txmr)))
        return r;
    for (int i = 0; i < CX_FI_NTX; i++) b->txfree[i] = CX_FI_NTX - 1 - i;
    b->ntxfree = CX_FI_NTX;
    for (int i = 0; i < CX_FI_NRX; i++) {
        b->rx[i].c.type = CX_FI_CTX_RX;
        b->rx[i].buf = b->rxmem + (size_t)i * CX_FI_BUF;
        if ((r = cx_fi_rx_post(b, &b->rx[i]))) return r;
    }
    cx_fi_warm_self(b, n.name);

    b->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    b->efd = epoll_create1(EPOLL_CLOEXEC);
    if (b->evfd < 0 || b->efd < 0) return -FI_EOTHER;
    struct epoll_event ev = { .events = EPOLLIN };
    if (epoll_ctl(b->efd, EPOLL_CTL_ADD, b->evfd, &ev)) return -FI_EOTHER;
    if (b->cq_fd >= 0 && epoll_ctl(b->efd, EPOLL_CTL_ADD, b->cq_fd, &ev)) return -FI_EOTHER;
    /* Retries of a backlog that could post nothing (e.g. rxm still connecting to a peer, which
     * for a stopped peer lasts until the op timeout) come from this tick, not from a busy loop. */
    b->qfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (b->qfd < 0 || epoll_ctl(b->efd, EPOLL_CTL_ADD, b->qfd, &ev)) return -FI_EOTHER;
    if (b->cq_fd < 0) cx_fi_bell_open(b);
    if (b->cq_fd < 0) {
        /* No wait object (shm in 1.17): requests that need this side (small writes and reads,
         * delivery-complete acks, messages) are only seen when we look. Look every
         * CONNEX_FI_POLL_US (default 100; 0: busy-poll, a core, the raw baseline's way), and
         * continuously while an op of ours is in flight or for 100 ms after visible traffic. */
        long us = (long)cx_opts_num(b->opts, "CONNEX_FI_POLL_US", NULL); /* default 100 */
        b->busy_poll = us == 0;
        if (us == 0) us = 1000; /* the timer still runs: the kick chain restarts from it */
        b->poll_us = us;
        b->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        struct itimerspec it = { .it_interval = { us / 1000000, (us % 1000000) * 1000 },
                                 .it_value = { us / 1000000, (us % 1000000) * 1000 } };
        if (b->tfd < 0 || timerfd_settime(b->tfd, 0, &it, NULL) || epoll_ctl(b->efd, EPOLL_CTL_ADD, b->tfd, &ev))
            return -FI_EOTHER;
    }
    cx_fi_bell_tick(b);
    cx_fi_rot_init(b);
    cx_fi_progress(b); /* arms the wait object (fi_trywait) before the core first waits */
    cx_info("libfabric: opened %s domain %s (mr_mode 0x%lx, hmem %d, data_progress %d, "
            "gpu_direct %d, reads %s, writes %s, messages inline up to %zu bytes)",
            b->prov, in->domain_attr->name ? in->domain_attr->name : "?", (unsigned long)b->mr_mode, b->hmem,
            (int)in->domain_attr->data_progress, p->gpu_direct, b->wb ? "by write-back" : "fi_read",
            b->shm_direct ? "direct" : "delivery-complete", b->eager_max - CX_FM_HDR);
    return 0;
}

/* libfabric reads its parameters only from the environment, once, at its first call in the
 * process, and the selection probe may make that call before any backend opens: the core calls
 * this (the ops table's prepare) at engine create, before the probe. A value the user set
 * always wins (setenv without overwrite); each one set is logged at info. Never at load time:
 * a process that links libconnex and never opens libfabric keeps its environment.
 * - FI_AV_REMOVE_CLEANUP=1: fi_av_remove closes rxm's hidden connection to the peer; without it
 *   the answer to a read completed with an error (disconnect, op timeout) can still land in the
 *   caller's buffer later (measured with a SIGSTOPped peer).
 * - FI_HMEM=system on hosts without an NVIDIA device node: libfabric then never loads CUDA
 *   (1.18+ reads FI_HMEM; Debian's 1.17 is built without CUDA support anyway).
 * - FI_OFI_RXM_MSG_RX_SIZE=256: rxm on tcp receives through a shared receive context of 4096
 *   buffers of 16 KiB by default, 67 MB that it zeroes when the endpoint opens and that are then
 *   taken in turn, so each of the first 4096 messages lands in memory never touched before
 *   (measured: 51 MB more RSS per process, the open 56 ms instead of 24, 16 KiB reads 42.5 us
 *   instead of 31.5 over their first thousand; README "Receive buffers on ofi_rxm"). 256 stays
 *   shared by every connection: the memory does not grow with the number of peers. */
static void cx_fi_env_default(const char *name, const char *val)
{
    if (getenv(name)) return;
    if (setenv(name, val, 0) == 0)
        cx_info("libfabric: %s=%s (libfabric reads it only from the environment)", name, val);
}

static void cx_fi_env_defaults_once(void)
{
    cx_fi_env_default("FI_AV_REMOVE_CLEANUP", "1");
    cx_fi_env_default("FI_OFI_RXM_MSG_RX_SIZE", "256");
    if (access("/dev/nvidiactl", F_OK) != 0) cx_fi_env_default("FI_HMEM", "system");
}

void cx_fi_prepare(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cx_fi_env_defaults_once);
}

static int cx_fi_open_one(const cx_backend_params_t *p, cx_backend_t **out)
{
    if (!p || !out) return CX_EINVAL;
    *out = NULL;
    if (!p->opts) {
        cx_error("libfabric: open without the engine's options table (cx_backend_params_t.opts)");
        return CX_EINVAL;
    }
    /* Without GPU registration, libfabric need not initialise CUDA (a context costs hundreds of
     * MiB). Effective only when nothing in the process initialised libfabric before. */
    cx_fi_prepare();
    if (!p->gpu_direct) cx_fi_env_default("FI_HMEM", "system");
    if (cx_fi_lib_load()) return CX_EUNSUPPORTED; /* logged by the loader */

    /* The selection's plan names the provider (CONNEX_FI_PROVIDER is part of it): exactly that
     * one is opened, so that what HELLO advertised is what runs. Without a plan (a build without
     * select/): CONNEX_FI_PROVIDER, else FI_PROVIDER, else RDMA before TCP. */
    const char *want = p->provider;
    if (!want || !*want) want = cx_opts_str(p->opts, "CONNEX_FI_PROVIDER");
    const char *order1[2] = { want, NULL };
    const char *const *order = cx_fi_default_order;
    const char *const any[2] = { NULL, NULL };
    if (want && *want)
        order = order1;
    else if (getenv("FI_PROVIDER"))
        order = any; /* libfabric filters by FI_PROVIDER itself: take its first match */

    size_t nfd0;
    int *fd0 = cx_fi_fd_list(&nfd0);
    struct fi_info *info = NULL;
    int r = -FI_ENODATA;
    int n = (order == any) ? 1 : 0;
    for (int i = 0; n || order[i]; i++) {
        r = cx_fi_query(order[i], p->domain, cx_fi_bind_ip(p), p->gpu_direct, &info);
        if (r && p->domain && *p->domain) {
            /* The plan's NIC by the name sysfs gives it; a provider that names its domains
             * otherwise still opens, on its first domain, and says so. */
            cx_warn("libfabric: provider %s: no domain %s (%s); opening its first domain",
                    order[i] ? order[i] : "(FI_PROVIDER)", p->domain, cx_fi_strerror(-r));
            r = cx_fi_query(order[i], NULL, cx_fi_bind_ip(p), p->gpu_direct, &info);
        }
        if (r == 0) break;
        cx_info("libfabric: provider %s: %s", order[i] ? order[i] : "(FI_PROVIDER)", cx_fi_strerror(-r));
        if (n) break;
    }
    if (r) {
        cx_warn("libfabric: no usable RDM provider (%s%s): %s", want ? "CONNEX_FI_PROVIDER=" : "",
                want ? want : "tried efa, verbs;ofi_rxm, tcp;ofi_rxm", cx_fi_strerror(-r));
        cx_fi_fd_cloexec_new(fd0, nfd0);
        free(fd0);
        return CX_EUNSUPPORTED;
    }
    cx_backend_t *b = calloc(1, sizeof *b);
    if (!b) {
        cx_fi_freeinfo(info);
        free(fd0);
        return CX_ENOMEM;
    }
    b->core = p->core;
    b->opts = p->opts;
    b->inc = p->incarnation;
    b->info = info;
    b->cq_fd = b->efd = b->evfd = b->tfd = b->qfd = b->bell_fd = -1;
    b->warm_txi = -1;
    b->next_key = 1;
    b->next_seq = 1;
    cx_objcache_init(&b->op_cache, sizeof(cx_fi_op_t), CX_FI_OP_CACHE);
    r = cx_fi_setup(b, p);
    /* Everything libfabric opened meanwhile (listener, socketpairs, epoll sets): close-on-exec. */
    cx_fi_fd_cloexec_new(fd0, nfd0);
    free(fd0);
    if (r) {
        cx_warn("libfabric: %s unusable: %s", b->prov, cx_fi_strerror(-r));
        cx_fi_free(b);
        return CX_EUNSUPPORTED;
    }
    *out = b;
    return CX_OK;
}

static void cx_fi_close(cx_backend_t *b)
{
    if (!b) return;
    b->closing = 1;
    cx_fi_guard_stop(b); /* before the endpoints: it looks at their regions until joined */
    while (b->eps) cx_fi_disconnect(b, b->eps, CX_ECLOSED);
    cx_fi_shm_progress(b, 1); /* last look at dead peers' regions; closes the exit fds */
    cx_fi_av_later_run(b, 1);
    cx_fi_parked_run(b, 1);
    /* Closing the endpoint first: afterwards the provider owns no context of ours. */
    if (b->ep) {
        fi_close(&b->ep->fid);
        b->ep = NULL;
    }
    while (b->all) cx_fi_op_free(b, b->all);
    cx_fi_free(b);
}

static int cx_fi_address(cx_backend_t *b, void *buf, size_t *len)
{
    if (*len < b->addr_len) return CX_EINVAL;
    memcpy(buf, b->addr, b->addr_len);
    *len = b->addr_len;
    return CX_OK;
}

static int cx_fi_wait_fd(cx_backend_t *b)
{
    return b->efd;
}

static void cx_fi_forget_region(cx_backend_t *b, cx_bep_t *ep, uint64_t region_id)
{
    /* Keys are decoded per op, nothing is cached. */
    (void)b;
    (void)ep;
    (void)region_id;
}

/* The provider the endpoint was opened on, as libfabric named it, and its domain. */
static void cx_fi_ep_transport(cx_backend_t *b, cx_bep_t *ep, char *buf, size_t n)
{
    if (!n) return;
    buf[0] = 0;
    if (!b || !ep || !b->info) return;
    const char *prov =
        b->info->fabric_attr && b->info->fabric_attr->prov_name ? b->info->fabric_attr->prov_name : b->prov;
    const char *dom = b->info->domain_attr && b->info->domain_attr->name ? b->info->domain_attr->name : "";
    snprintf(buf, n, "%s%s%s", prov, dom[0] ? "/" : "", dom);
}

/* One domain; the exported table (fi_rail.c) opens one of these or a hub of several. */
const struct cx_backend_ops cx_fi_single_ops = {
    .version = CX_BACKEND_API_VERSION,
    .name = "libfabric",
    .open = cx_fi_open_one,
    .close = cx_fi_close,
    .address = cx_fi_address,
    .wait_fd = cx_fi_wait_fd,
    .progress = cx_fi_progress,
    .poll = cx_fi_poll,
    .mem_reg = cx_fi_mem_reg,
    .mem_dereg = cx_fi_mem_dereg,
    .connect = cx_fi_connect,
    .disconnect = cx_fi_disconnect,
    .submit = cx_fi_submit,
    .submit_batch = cx_fi_submit_batch,
    .forget_region = cx_fi_forget_region,
    .gpu_caps = cx_fi_gpu_caps,
    .ep_transport = cx_fi_ep_transport,
    .prepare = cx_fi_prepare,
};
