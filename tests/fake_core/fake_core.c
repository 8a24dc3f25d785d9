#include "fake_core.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void fc_reset(cx_core_t *c)
{
    for (int i = 0; i < c->nmsg; i++) free(c->msg[i]);
    c->nmsg = 0;
    c->refuse = 0;
    c->check_at = NULL;
    c->check_failed = 0;
    c->reg_lo = c->reg_hi = 0;
}

void cx_core_xfer_done(cx_core_t *c, cx_xfer_t *x, int status)
{
    (void)c;
    fc_xfer_t *f = (fc_xfer_t *)x;
    f->done++;
    f->status = status;
}

void cx_core_peer_error(cx_core_t *c, void *peer, cx_cause_t cause, const char *reason)
{
    (void)peer;
    (void)reason;
    c->peer_errors++;
    c->last_cause = (int)cause;
    if ((int)cause >= 0 && (int)cause < 4) c->causes[cause]++;
}

/* The fake core holds no endpoints: backends look in their own lists. */
cx_bep_t *cx_core_peer_ep(cx_core_t *c, cx_backend_t *b, void *peer)
{
    (void)c;
    (void)b;
    (void)peer;
    return NULL;
}

/* The peer's process, through the core's own look-ups (core/src/proc.c), following peer_pid. */
static cx_proc_t *fc_proc(cx_core_t *c, void *peer)
{
    if (peer != c->peer_cookie || !c->peer_pid) return NULL;
    cx_proc_follow(&c->proc, c->peer_pid);
    return &c->proc;
}

int cx_core_peer_process(cx_core_t *c, void *peer)
{
    cx_proc_t *pr = fc_proc(c, peer);
    return pr ? cx_proc_state(pr) : CX_PROC_UNKNOWN;
}

int cx_core_peer_exit_fd(cx_core_t *c, void *peer)
{
    cx_proc_t *pr = fc_proc(c, peer);
    return pr ? cx_proc_exit_fd(pr) : -1;
}

void *cx_core_peer_by_incarnation(cx_core_t *c, uint64_t incarnation)
{
    return incarnation == c->peer_inc ? c->peer_cookie : NULL;
}

void cx_core_peer_want_ep(cx_core_t *c, void *peer)
{
    (void)peer;
    c->want_ep++;
}

int cx_core_region_check(cx_core_t *c, uint64_t addr, size_t len, void **pin)
{
    if (pin) *pin = NULL;
    c->region_checks++;
    if (c->reg_hi && (addr < c->reg_lo || addr + len > c->reg_hi || addr + len < addr)) return CX_EINVAL;
    return CX_OK;
}

void cx_core_region_unpin(void *pin)
{
    (void)pin;
}

int cx_core_region_kind(cx_core_t *c, uint64_t addr, size_t len)
{
    (void)c;
    (void)addr;
    (void)len;
    return CX_MEM_HOST;
}

int cx_core_mem_device(cx_core_t *c, const void *addr, size_t len)
{
    (void)c;
    (void)addr;
    (void)len;
    return -1;
}

int cx_core_mem_copy(cx_core_t *c, void *dst, const void *src, size_t len)
{
    (void)c;
    memcpy(dst, src, len);
    return CX_OK;
}

int cx_core_deliver_msg(cx_core_t *c, void *peer, const void *data, size_t len)
{
    if (peer != c->peer_cookie) return CX_EINVAL;
    if (c->refuse || c->nmsg == FC_MAXMSG) return CX_EAGAIN;
    if (c->check_at)
        for (size_t i = 0; i < c->check_len; i++)
            if (c->check_at[i] != c->check_val) c->check_failed = 1;
    c->msg[c->nmsg] = malloc(len ? len : 1);
    if (!c->msg[c->nmsg]) return CX_EAGAIN;
    memcpy(c->msg[c->nmsg], data, len);
    c->msg_len[c->nmsg++] = len;
    return CX_OK;
}

void cx_core_count_served(cx_core_t *c, int kind, size_t bytes, int ok)
{
    (void)kind;
    (void)bytes;
    if (ok)
        c->served_ok++;
    else
        c->served_bad++;
}

uint64_t fc_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

int fc_drive(const struct cx_backend_ops *ops, cx_backend_t *a, cx_backend_t *b, fc_xfer_t **xs, int n, int timeout_ms)
{
    uint64_t end = fc_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++)
            if (!xs[i]->done) all = 0;
        if (all) return 0;
        if (fc_now_ms() > end) return -1;
        struct pollfd p[2] = { { ops->wait_fd(a), POLLIN, 0 }, { ops->wait_fd(b), POLLIN, 0 } };
        int r = poll(p, 2, 20);
        if (r > 0 && (p[0].revents & POLLIN)) ops->progress(a);
        if (r > 0 && (p[1].revents & POLLIN)) ops->progress(b);
    }
}

void fc_xfer_init(fc_xfer_t *f, int kind, void *local, size_t len, uint64_t remote, const void *msg, size_t msg_len)
{
    memset(f, 0, sizeof *f);
    f->status = 12345;
    f->x.kind = kind;
    f->x.local = local;
    f->x.len = len;
    f->x.remote = remote;
    f->x.msg = msg;
    f->x.msg_len = msg_len;
}

int fc_open_pair(const struct cx_backend_ops *ops, cx_core_t *ca, cx_core_t *cb, void *cookie_a, void *cookie_b,
                 cx_backend_t **ba, cx_backend_t **bb)
{
    ca->inc = 0x1111;
    cb->inc = 0x2222;
    ca->peer_inc = cb->inc;
    cb->peer_inc = ca->inc;
    ca->peer_cookie = cookie_b;
    cb->peer_cookie = cookie_a;
    ca->peer_pid = cb->peer_pid = (uint32_t)getpid(); /* both sides live in this process */
    /* as an engine does at create: the environment's CONNEX_* values, parsed once */
    if (cx_opts_load(&ca->opts) || cx_opts_load(&cb->opts)) return -1;
    cx_backend_params_t pa = { .core = ca, .listen_ip = "127.0.0.1", .incarnation = ca->inc, .opts = &ca->opts };
    cx_backend_params_t pb = { .core = cb, .listen_ip = "127.0.0.1", .incarnation = cb->inc, .opts = &cb->opts };
    return ops->open(&pa, ba) || ops->open(&pb, bb) ? -1 : 0;
}
