/* Engine lifecycle and the public API entry points. Callers validate what they can locally,
 * then hand an op to the progress thread and wait for its completion. */
#include "engine.h"
#include "sigkeep.h"
#include "connex/options.h"
#include "live.h"
#include "advertise.h"

#include "connex/log.h"
#include "gpu_hook.h"
#include "mobility/mobility.h"
#include "cx_sched.h"
#include "staging.h"
#include "tstage.h"
#include "batch.h"
#include "cx_gpu.h"
#include "spin.h"
#include "drive.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* The engine's tick (a quarter of the heartbeat) is kept within these: below, a timer wake-up
 * every few ms costs more than it finds; above, op timeouts and reconnects would lag. */
#define CX_TICK_MIN_MS 5
#define CX_TICK_MAX_MS 100

/* cx_connect against a peer that is not listening yet (still starting): tried again this often
 * until the connect deadline. */
#define CX_CONNECT_RETRY_NS (20 * CX_NS_PER_MS)
/* cx_unregister waiting for a region's pins to drop: a sleep, not a spin, as it may take up to
 * the op timeout; short enough that the usual wait (a send on the wire) costs little more. */
#define CX_UNREG_PIN_POLL_NS (200 * CX_NS_PER_US)

uint64_t cx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return cx_timespec_ns(&ts);
}

static uint64_t coarse_tick_ns(void)
{
    static _Atomic uint64_t tick; /* 0: not read yet */
    uint64_t t = atomic_load_explicit(&tick, memory_order_relaxed);
    if (t) return t;
    struct timespec r;
    /* no coarse clock: the tick stays UINT64_MAX, and deadlines take the precise one */
    t = clock_getres(CLOCK_MONOTONIC_COARSE, &r) ? UINT64_MAX : cx_timespec_ns(&r);
    if (!t || t > cx_ms_to_ns(100)) t = UINT64_MAX; /* a tick over 100 ms is no use for op deadlines */
    atomic_store_explicit(&tick, t, memory_order_relaxed);
    return t;
}

uint64_t cx_deadline_ns(uint32_t ms)
{
    uint64_t tick = coarse_tick_ns(), span = cx_ms_to_ns(ms);
    struct timespec ts;
    if (tick == UINT64_MAX || clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)) return cx_now_ns() + span;
    return cx_timespec_ns(&ts) + tick + span;
}

void cx_op_init(cx_op_t *op, cx_engine_t *e, int kind)
{
    memset(op, 0, sizeof *op);
    op->e = e;
    op->kind = kind;
    op->w.spin_ns = e ? e->spin_ns : 0;
    op->status = CX_ERR;
    if (kind < CX_OPK_COUNT && cx_hist_sample()) op->t0_ns = cx_now_ns(); /* timed (metrics.h) */
    pthread_mutex_init(&op->mu, NULL);
    cx_cond_init_mono(&op->cv);
}

static void op_destroy(cx_op_t *op)
{
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    if (op->kind == CX_OPK_BATCH)
        cx_batch_free(op->msg_copy);
    else
        free(op->msg_copy);
}

void cx_op_destroy(cx_op_t *op)
{
    op_destroy(op);
}

void cx_op_complete(cx_op_t *op, int status)
{
    /* Ending as the engine closes, a local error is the close's doing: a backend tearing its
     * connections down cancels what it had posted (libfabric's rxm: FI_ECANCELED), and a staged
     * put_signal caught in that ended CX_ERR (conformance_gpu, in CI). */
    if (status == CX_ERR && op->e && atomic_load(&op->e->stop)) status = CX_ECLOSED;
    if (op->on_done) {
        op->on_done(op, status);
        return;
    } /* a group step's child */
    /* Completed by the caller that waits for it, while it drives (drive.c): nobody sleeps on the
     * condition variable, and its wait_done reads this without the mutex. Another thread must
     * take the mutex, so that the caller cannot destroy the op under its signal. */
    if (op->w.owned && pthread_equal(op->w.owner, pthread_self())) {
        op->status = status;
        op->w.done_by_owner = 1;
        cx_op_set_done(op);
        return;
    }
    pthread_mutex_lock(&op->mu);
    op->status = status;
    cx_op_set_done(op);
    pthread_cond_signal(&op->cv);
    pthread_mutex_unlock(&op->mu);
}

int cx_submit(cx_engine_t *e, cx_op_t *op)
{
    pthread_mutex_lock(&e->qmu);
    if (e->closing) {
        pthread_mutex_unlock(&e->qmu);
        return CX_ECLOSED;
    }
    int was_empty = e->qhead == NULL;
    op->next = NULL;
    if (e->qtail)
        e->qtail->next = op;
    else
        e->qhead = op;
    e->qtail = op;
    pthread_mutex_unlock(&e->qmu);
    if (was_empty) {
        uint64_t one = 1;
        atomic_store(&e->cmd_kicked, 1);
        /* An eventfd write only fails when the counter would overflow; it is still readable. */
        if (write(e->cmdfd, &one, sizeof one) < 0 && errno != EAGAIN) cx_error("eventfd: %s", strerror(errno));
    }
    return CX_OK;
}

static int wait_done(cx_op_t *op)
{
    if (op->w.done_by_owner) return op->status; /* this thread completed it: see cx_op_complete */
    cx_op_spin(op, op->w.spin_ns);
    pthread_mutex_lock(&op->mu);
    while (!cx_op_is_done(op)) pthread_cond_wait(&op->cv, &op->mu);
    int st = op->status;
    pthread_mutex_unlock(&op->mu);
    return st;
}

static void remember_peer(cx_engine_t *e, const cx_op_t *op);

/* Runs on a stack op; returns its status. */
static int run_sync(cx_engine_t *e, cx_op_t *op)
{
    /* While a caller drives, the progress thread does not poll (spin.c): it would only keep
     * the transports' lock from the caller. */
    int driving = e->drive && op->w.spin_ns && op->kind != CX_OPK_EXEC;
    int rc = CX_OK;
    op->w.owned = 1;
    op->w.owner = pthread_self();
    if (driving) atomic_fetch_add(&e->drivers, 1);
    if (driving ? cx_drive_soon(e, op) : cx_drive(e, op, 1))
        op->w.spin_ns = 0; /* it polled for its window already */
    else if ((rc = cx_submit(e, op)) == CX_OK && driving) {
        cx_drive_wait(e, op, op->w.spin_ns);
        op->w.spin_ns = 0;
    }
    if (driving) atomic_fetch_sub(&e->drivers, 1); /* the progress thread may poll for it now */
    if (rc == CX_OK) rc = wait_done(op);
    remember_peer(e, op);
    op_destroy(op);
    return rc;
}

int cx_op_run_sync(cx_engine_t *e, cx_op_t *op)
{
    return run_sync(e, op);
}

int cx_exec(cx_engine_t *e, void (*fn)(cx_engine_t *, void *), void *arg)
{
    cx_op_t op;
    cx_op_init(&op, e, CX_OPK_EXEC);
    op.fn = fn;
    op.arg = arg;
    return run_sync(e, &op);
}

/* ---------------------------------------------------------------- create / destroy */

static int config_check(const cx_config_t *cfg, cx_engine_t *e)
{
    if (!cfg || !cfg->model) {
        cx_error("engine: config.model is required");
        return CX_EINVAL;
    }
    char lid[CX_MODEL_MAX + 40], err[200];
    snprintf(lid, sizeof lid, "%.*s|%u|%u|%u", CX_MODEL_MAX, cfg->model, cfg->stage, cfg->shard, cfg->replica);
    if (strlen(cfg->model) >= CX_MODEL_MAX || cx_lid_parse(lid, &e->lid, err, sizeof err)) {
        cx_error("engine: bad identity: %s", strlen(cfg->model) >= CX_MODEL_MAX ? "model name too long" : err);
        return CX_EINVAL;
    }
    e->cfg = *cfg;
    snprintf(e->listen_ip, sizeof e->listen_ip, "%s", cfg->listen_ip ? cfg->listen_ip : "127.0.0.1");
    if (!e->cfg.heartbeat_ms) e->cfg.heartbeat_ms = 1000;
    if (!e->cfg.heartbeat_timeout_ms) e->cfg.heartbeat_timeout_ms = 3000;
    if (!e->cfg.op_timeout_ms) e->cfg.op_timeout_ms = 30000;
    if (!e->cfg.connect_timeout_ms) e->cfg.connect_timeout_ms = 5000;
    if (!e->cfg.recv_queue_max) e->cfg.recv_queue_max = 4096;
    if (!e->cfg.recv_queue_bytes) e->cfg.recv_queue_bytes = 256ull << 20;
    cx_sched_config(&e->cfg, &e->opts);
    if (e->cfg.heartbeat_timeout_ms <= e->cfg.heartbeat_ms) {
        cx_error("engine: heartbeat_timeout_ms (%u) must exceed heartbeat_ms (%u)", e->cfg.heartbeat_timeout_ms,
                 e->cfg.heartbeat_ms);
        return CX_EINVAL;
    }
    e->cfg.model = e->model;
    snprintf(e->model, sizeof e->model, "%s", cfg->model);
    e->cfg.listen_ip = e->listen_ip;
    if (cx_advertise_resolve(&e->opts, e->listen_ip, cfg->advertise_ip, e->adv_ip, sizeof e->adv_ip)) return CX_EINVAL;
    e->cfg.advertise_ip = e->adv_ip;
    const char *m = cx_opts_str(&e->opts, "CONNEX_METRICS");
    char mip[48];
    uint16_t mport;
    if (m && *m && cx_metrics_check(m, mip, sizeof mip, &mport)) return CX_EINVAL;
    return CX_OK;
}

/* Which backends to open: CONNEX_BACKEND wins over the config; "auto" opens every one built. */
static int open_backends(cx_engine_t *e)
{
    const char *want = cx_opts_str(&e->opts, "CONNEX_BACKEND");
    if (!want || !*want) want = e->cfg.backend;
    if (!want || !*want) want = "auto";
    int is_auto = !strcmp(want, "auto");
    int known = is_auto;
    for (int i = 0; cx_backends_builtin[i]; i++)
        if (cx_backends_builtin[i]->version == CX_BACKEND_API_VERSION && cx_backends_builtin[i]->prepare &&
            (is_auto || !strcmp(cx_backends_builtin[i]->name, want)))
            cx_backends_builtin[i]->prepare();
    const struct cx_backend_ops *order[CX_MAX_BACKENDS];
    char choice[CX_MAX_BACKENDS][CX_CHOICE_MAX];
    cx_open_plan_t plan[CX_MAX_BACKENDS];
    int n = cx_select_order(&e->opts, want, order, choice, plan, CX_MAX_BACKENDS, e->host_id, sizeof e->host_id);
    if (n < 0) return n;
    for (int i = 0; i < n; i++) {
        const struct cx_backend_ops *ops = order[i];
        if (!is_auto && strcmp(ops->name, want)) continue;
        known = 1;
        if (cx_backend_check(ops)) { /* built against another backend interface: logged */
            if (is_auto) continue;
            return CX_EUNSUPPORTED;
        }
        /* The backend opens what the selection planned (provider, NICs, GPUDirect): what HELLO
         * advertises for it (choice[i]) is then what runs. */
        cx_backend_params_t p = {
            .core = cx_core_of(e),
            .listen_ip = e->listen_ip,
            .advertise_ip = e->adv_ip,
            .incarnation = e->incarnation,
            .opts = &e->opts,
        };
        cx_open_plan_params(&plan[i], &p);
        cx_bslot_t *s = &e->be[e->nb];
        int rc = ops->open(&p, &s->b);
        if (rc) {
            if (is_auto) {
                cx_info("backend %s not usable here (%s): skipped", ops->name, cx_strerror(rc));
                continue;
            }
            cx_error("CONNEX_BACKEND=%s: the backend cannot run here (%s); see the log above", want, cx_strerror(rc));
            return rc;
        }
        s->ops = ops;
        s->addr_len = sizeof s->addr;
        if (ops->address(s->b, s->addr, &s->addr_len)) {
            cx_error("backend %s: no address", ops->name);
            ops->close(s->b);
            continue;
        }
        e->bnames[e->nb] = ops->name;
        snprintf(e->bchoice[e->nb], sizeof e->bchoice[e->nb], "%s", choice[i]);
        e->bchoice_p[e->nb] = e->bchoice[e->nb];
        e->nb++;
    }
    if (!known) {
        char built[64] = "";
        for (int i = 0; cx_backends_builtin[i]; i++)
            snprintf(built + strlen(built), sizeof built - strlen(built), "%s%s", i ? "," : "",
                     cx_backends_builtin[i]->name);
        cx_error("backend '%s' is not built into this library (built: %s)", want, built[0] ? built : "none");
        return CX_EUNSUPPORTED;
    }
    if (e->nb == 0) {
        cx_error("no usable backend (wanted '%s')", want);
        return CX_EUNSUPPORTED;
    }
    e->backends_str[0] = 0;
    for (int i = 0; i < e->nb; i++)
        snprintf(e->backends_str + strlen(e->backends_str), sizeof e->backends_str - strlen(e->backends_str), "%s%s",
                 i ? "," : "", e->bnames[i]);
    return CX_OK;
}

static void engine_free(cx_engine_t *e)
{
    cx_dir_stop(e); /* after the progress thread: a clean close deletes our entry */
    for (int i = 0; i < e->nb; i++) {
        if (e->be[i].w.kind) cx_watch_del(e, e->be[i].ops->wait_fd(e->be[i].b));
        e->be[i].ops->close(e->be[i].b);
    }
    cx_live_close(e);
    cx_metrics_close(e);
    if (e->lfd >= 0) close(e->lfd);
    if (e->cmdfd >= 0) close(e->cmdfd);
    if (e->timerfd >= 0) close(e->timerfd);
    if (e->dtimerfd >= 0) close(e->dtimerfd);
    if (e->letgofd >= 0) close(e->letgofd);
    if (e->epfd >= 0) close(e->epfd);
    cx_registry_fini(&e->reg);
    cx_msgq_fini(&e->msgq);
    cx_evq_fini(&e->evq);
    pthread_mutex_destroy(&e->qmu);
    pthread_mutex_destroy(&e->plock);
    cx_auth_free(e->auth);
    explicit_bzero(&e->opts, sizeof e->opts); /* it holds CONNEX_AUTH_TOKEN's copy */
    free(e);
}

static int engine_create(const cx_config_t *cfg, cx_engine_t **out)
{
    cx_log_init();
    if (!out) {
        cx_error("engine: NULL out pointer");
        return CX_EINVAL;
    }
    *out = NULL;
    cx_engine_t *e = calloc(1, sizeof *e);
    if (!e) return CX_ENOMEM;
    /* Every CONNEX_* variable, checked before anything starts (connex/options.h). */
    if (cx_opts_load(&e->opts)) {
        cx_error("engine: %u CONNEX_* variable(s) with a bad value (see above); not created", e->opts.bad);
        free(e);
        return CX_EINVAL;
    }
    e->epfd = e->lfd = e->cmdfd = e->timerfd = e->dtimerfd = e->letgofd = -1;
    pthread_mutex_init(&e->qmu, NULL);
    pthread_mutex_init(&e->plock, NULL);
    /* CONNEX_DRIVE=0 turns caller-driven progress off (every op goes through the progress thread). */
    e->drive = cx_opts_num(&e->opts, "CONNEX_DRIVE", NULL) != 0;
    e->drive_sleep = cx_opts_num(&e->opts, "CONNEX_DRIVE_SLEEP", NULL) != 0;
    cx_registry_init(&e->reg);
    int rc = config_check(cfg, e);
    if (!rc) rc = cx_auth_load(&e->opts, cfg->auth_token, &e->auth);
    if (!rc)
        rc = cx_msgq_init(&e->msgq, e->cfg.recv_queue_max, e->cfg.recv_queue_bytes);
    else
        cx_msgq_init(&e->msgq, 1, 1);
    cx_msgq_defer_wake(&e->msgq); /* woken at the end of each progress turn (progress.c) */
    if (cx_evq_init(&e->evq) && !rc) rc = CX_ENOMEM;
    if (rc) {
        engine_free(e);
        return rc;
    }
    while (!e->incarnation)
        if (getrandom(&e->incarnation, sizeof e->incarnation, 0) != sizeof e->incarnation)
            e->incarnation = cx_now_ns() ^ ((uint64_t)getpid() << 32);
    e->next_query_id = 1;
    e->spin_ns = e->pwin_ns = cx_spin_window_ns(&e->opts);

    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    e->cmdfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    e->dtimerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    e->letgofd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->epfd < 0 || e->cmdfd < 0 || e->timerfd < 0 || e->dtimerfd < 0 || e->letgofd < 0) {
        cx_error("engine: epoll/eventfd/timerfd: %s", strerror(errno));
        engine_free(e);
        return CX_ERR;
    }
    uint16_t port = 0;
    int fd = cx_sock_listen(e->listen_ip, e->cfg.port, &port);
    if (fd < 0) {
        engine_free(e);
        return fd;
    }
    e->lfd = fd;
    cx_url_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.host, sizeof u.host, "%s", e->adv_ip); /* what peers connect to */
    u.is_ipv6 = strchr(e->adv_ip, ':') != NULL;
    u.port = port;
    u.lid = e->lid;
    cx_url_format(&u, e->url, sizeof e->url);

    rc = open_backends(e);
    if (!rc) rc = cx_dir_start(e); /* registers e->url: the control port is bound */
    if (rc) {
        engine_free(e);
        return rc;
    }

    /* Timers: a tick a quarter of the heartbeat, so SUSPECT/FAILED land within 25% of their
     * thresholds; bounded so that op timeouts and reconnects stay responsive. */
    uint64_t tick_ms = e->cfg.heartbeat_ms / 4;
    if (tick_ms < CX_TICK_MIN_MS) tick_ms = CX_TICK_MIN_MS;
    if (tick_ms > CX_TICK_MAX_MS) tick_ms = CX_TICK_MAX_MS;
    e->tick_ns = cx_ms_to_ns(tick_ms);
    struct itimerspec its = { .it_interval = cx_ns_timespec(e->tick_ns), .it_value = cx_ns_timespec(e->tick_ns) };
    timerfd_settime(e->timerfd, 0, &its, NULL);

    e->lw = (cx_watch_t){ CX_W_LISTEN, e, 0 };
    e->cw = (cx_watch_t){ CX_W_CMD, e, 0 };
    e->tw = (cx_watch_t){ CX_W_TIMER, e, 0 };
    e->dw = (cx_watch_t){ CX_W_DRIVE, e, 0 };
    rc = cx_watch_add(e, e->lfd, EPOLLIN, &e->lw) | cx_watch_add(e, e->cmdfd, EPOLLIN, &e->cw) |
        cx_watch_add(e, e->timerfd, EPOLLIN, &e->tw) | cx_watch_add(e, e->dtimerfd, EPOLLIN, &e->dw);
    int drivable = 0;
    for (int i = 0; i < e->nb; i++) drivable |= !e->be[i].ops->thread_bound;
    if (!drivable) e->drive = 0; /* nothing a caller could drive (drive.h) */
    for (int i = 0; i < e->nb && !rc; i++) {
        int bfd = e->be[i].ops->wait_fd(e->be[i].b);
        if (bfd < 0) continue;
        e->be[i].w = (cx_watch_t){ CX_W_BACKEND, e, i };
        rc = cx_watch_add(e, bfd, EPOLLIN, &e->be[i].w);
    }
    if (rc) {
        engine_free(e);
        return CX_ERR;
    }
    cx_live_open(e);
    cx_metrics_open(e);
    if (pthread_create(&e->thread, NULL, cx_progress_main, e)) {
        cx_error("engine: cannot start the progress thread");
        engine_free(e);
        return CX_ERR;
    }
    e->thread_started = 1;
    cx_info("engine %s up, incarnation %016llx, backends %s", e->url, (unsigned long long)e->incarnation,
            e->backends_str);
    *out = e;
    return CX_OK;
}

/* The probe and the backends' opens load and start libraries (libfabric's shm provider installs
 * handlers for SIGINT, SIGTERM, SIGSEGV and more): the process's own dispositions are put back. */
int cx_engine_create(const cx_config_t *cfg, cx_engine_t **out)
{
    cx_sigkeep_t *k = malloc(sizeof *k);
    if (k) cx_sigkeep_save(k);
    int rc = engine_create(cfg, out);
    if (k) cx_sigkeep_restore(k, "the engine's libraries");
    free(k);
    return rc;
}

static void shutdown_on_thread(cx_engine_t *e, void *arg)
{
    (void)arg;
    cx_peer_send_bye_all(e);
    atomic_store(&e->stop, 1);
}

void cx_engine_destroy(cx_engine_t *e)
{
    if (!e) return;
    cx_exec(e, shutdown_on_thread, NULL);
    pthread_mutex_lock(&e->qmu);
    e->closing = 1;
    pthread_mutex_unlock(&e->qmu);
    pthread_join(e->thread, NULL);
    /* The thread failed everything it held; ops queued after it stopped looking fail here. */
    cx_op_t *op = e->qhead;
    e->qhead = e->qtail = NULL;
    while (op) {
        cx_op_t *n = op->next;
        cx_op_complete(op, CX_ECLOSED);
        op = n;
    }
    while (e->conns) cx_conn_close(e, e->conns);
    cx_live_stop_all(e); /* before the peers its watchers point at go */
    /* The staging ring completes the ops it still holds: while their peers (op lists, credits)
     * still exist. */
    cx_tstage_fini(e);
    cx_staging_fini(e);
    cx_tstage_free(e);
    cx_peer_free_all(e);
    cx_batches_close(e); /* their children all came back: batches complete */
    cx_msgq_close(&e->msgq);
    cx_evq_close(&e->evq);
    cx_groups_free_all(e); /* after everything that could still complete a step's child */
    /* Regions still registered: deregister from the backends before closing them. */
    for (size_t i = 0; i < e->reg.n; i++)
        for (int b = 0; b < e->nb; b++)
            if (e->reg.v[i]->mh[b]) e->be[b].ops->mem_dereg(e->be[b].b, e->reg.v[i]->mh[b]);
    engine_free(e);
}

const char *cx_engine_local_url(const cx_engine_t *e)
{
    return e ? e->url : NULL;
}
const char *cx_engine_backends(const cx_engine_t *e)
{
    return e ? e->backends_str : NULL;
}
uint64_t cx_engine_incarnation(const cx_engine_t *e)
{
    return e ? e->incarnation : 0;
}

/* ---------------------------------------------------------------- peers named by callers */

/* A URL (has '#') or a bare LID. */
/* The peer of this thread's last op that parsed, kept as parsed: a caller that names one peer op
 * after op parses it once (cx_url_parse was 0.1 us of a 3.3 us libfabric shm read). With it, the
 * peer that name resolved to in engine `inc` (the hint: a peer lives as long as its engine, and
 * an engine's incarnation is never another's), so that cx_op_start need not look it up again:
 * hashing and comparing the LID was about 260 of a 4 KiB ucx_shm read's instructions
 * (callgrind). */
static _Thread_local struct {
    char s[CX_URL_MAX];
    int by_url;
    cx_url_t url;
    cx_lid_t lid;
    uint64_t gen, inc; /* gen: which parse filled it */
    cx_peer_t *peer;
} last_peer;

static int parse_peer(cx_engine_t *e, const char *peer, cx_op_t *op)
{
    char err[256];
    op->hint = NULL;
    if (!peer) {
        cx_warn("peer is NULL");
        return CX_EINVAL;
    }
    size_t n = strnlen(peer, CX_URL_MAX);
    /* Callers may pass an op they did not clear (cx_peer_state): by_url and url are set here. */
    if (n < CX_URL_MAX && last_peer.s[0] && !strcmp(peer, last_peer.s)) {
        op->by_url = last_peer.by_url;
        if (op->by_url) op->url = last_peer.url;
        op->lid = last_peer.lid;
        op->name_gen = last_peer.gen;
        if (last_peer.peer && last_peer.inc == e->incarnation) op->hint = last_peer.peer;
        return CX_OK;
    }
    op->by_url = 0;
    if (strchr(peer, '#')) {
        if (cx_url_parse(peer, &op->url, err, sizeof err)) {
            cx_warn("%s", err);
            return CX_EINVAL;
        }
        op->by_url = 1;
        op->lid = op->url.lid;
    } else if (cx_lid_parse(peer, &op->lid, err, sizeof err)) {
        cx_warn("peer '%.100s' is neither a URL (ip:port#model|stage|shard|replica) nor a LID: %s", peer, err);
        return CX_EINVAL;
    }
    op->name_gen = 0;
    if (n < CX_URL_MAX) {
        memcpy(last_peer.s, peer, n + 1);
        last_peer.by_url = op->by_url;
        if (op->by_url) last_peer.url = op->url;
        last_peer.lid = op->lid;
        last_peer.peer = NULL;
        op->name_gen = last_peer.gen = last_peer.gen + 1;
    }
    return CX_OK;
}

int cx_op_name_peer(cx_engine_t *e, const char *peer, cx_op_t *op)
{
    return parse_peer(e, peer, op);
}

/* After an op completed on its caller's thread: its peer becomes the hint for the next op that
 * names the peer so, if this thread's last parse was this op's (async ops interleave). */
static void remember_peer(cx_engine_t *e, const cx_op_t *op)
{
    if (op->resolved && !op->hint && op->name_gen && op->name_gen == last_peer.gen) {
        last_peer.peer = op->resolved;
        last_peer.inc = e->incarnation;
    }
}

int cx_connect(cx_engine_t *e, const char *peer_url, int timeout_ms)
{
    if (!e) return CX_EINVAL;
    uint64_t deadline = cx_now_ns() + cx_ms_to_ns(timeout_ms < 0 ? e->cfg.connect_timeout_ms : (uint32_t)timeout_ms);
    for (int attempt = 0;; attempt++) {
        cx_op_t op;
        cx_op_init(&op, e, CX_OPK_CONNECT);
        int rc = parse_peer(e, peer_url, &op);
        if (rc) {
            op_destroy(&op);
            return rc;
        }
        /* A bare LID can be "connected" only if known: the op resolves it. */
        op.deadline_ns = deadline;
        rc = run_sync(e, &op);
        /* Nobody listening yet: try again until the deadline (a peer may still be starting). */
        if (rc != CX_EPEER || cx_now_ns() + CX_CONNECT_RETRY_NS > deadline) return rc;
        struct timespec ts = cx_ns_timespec(CX_CONNECT_RETRY_NS);
        nanosleep(&ts, NULL);
    }
}

struct peer_q {
    cx_lid_t lid;
    const char *backend;
    cx_peer_state_t state;
};
static void peer_q_fn(cx_engine_t *e, void *arg)
{
    struct peer_q *q = arg;
    cx_peer_t *p = cx_peer_find(e, &q->lid);
    if (!p) return;
    q->state = p->state;
    if (p->bidx >= 0 && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) q->backend = e->bnames[p->bidx];
}

static int peer_query(cx_engine_t *e, const char *peer, struct peer_q *q)
{
    cx_op_t tmp;
    memset(q, 0, sizeof *q);
    if (!e || parse_peer(e, peer, &tmp)) return CX_EINVAL;
    q->lid = tmp.lid;
    return cx_exec(e, peer_q_fn, q);
}

const char *cx_peer_backend(cx_engine_t *e, const char *peer)
{
    struct peer_q q;
    return peer_query(e, peer, &q) ? NULL : q.backend;
}

cx_peer_state_t cx_peer_state(cx_engine_t *e, const char *peer)
{
    struct peer_q q;
    return peer_query(e, peer, &q) ? CX_PEER_UNKNOWN : q.state;
}

struct first_q {
    cx_lid_t lid;
    int rc;
    uint64_t addr, len;
};
static void first_region_fn(cx_engine_t *e, void *arg)
{
    struct first_q *q = arg;
    cx_peer_t *p = cx_peer_find(e, &q->lid);
    if (!p || (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT)) {
        q->rc = CX_EPEER;
        return;
    }
    const cx_rregion_t *best = NULL;
    for (const cx_rregion_t *r = p->rregions; r; r = r->next) /* ids grow with registration */
        if (!best || r->id < best->id) best = r;
    if (best) {
        q->addr = best->addr;
        q->len = best->len;
    }
}

int cx_peer_first_region(cx_engine_t *e, const char *peer, uint64_t *addr, uint64_t *len)
{
    cx_op_t tmp;
    if (!e || !peer || !addr || !len) {
        cx_warn("cx_peer_first_region: %s is NULL", !e ? "the engine" : !peer ? "peer" : "an output");
        return CX_EINVAL;
    }
    *addr = *len = 0;
    int rc = parse_peer(e, peer, &tmp);
    if (rc) return rc;
    struct first_q q = { .lid = tmp.lid };
    rc = cx_exec(e, first_region_fn, &q);
    if (rc) return rc;
    if (q.rc) return q.rc;
    *addr = q.addr;
    *len = q.len;
    return CX_OK;
}

struct peer_list {
    cx_peer_info_t *out;
    int max, n;
};
static void peer_list_fn(cx_engine_t *e, void *arg)
{
    struct peer_list *l = arg;
    for (cx_peer_t *p = e->peers; p; p = p->next, l->n++) {
        if (l->n >= l->max) continue;
        cx_peer_info_t *i = &l->out[l->n];
        memset(i, 0, sizeof *i);
        i->lid = p->lid;
        snprintf(i->url, sizeof i->url, "%s", p->url);
        i->state = p->state;
        if (p->bidx >= 0 && p->ep && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) {
            snprintf(i->backend, sizeof i->backend, "%s", e->bnames[p->bidx]);
            snprintf(i->why, sizeof i->why, "%s", p->why);
            cx_peer_transport(e, p, i->transport, sizeof i->transport);
        }
        i->incarnation = p->incarnation;
        for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next)
            i->ops_in_flight += cx_op_inflight_n(op); /* as cx_stats */
        i->same_host = p->same_host;
        i->death_watch = cx_live_watching(e, p);
    }
}

int cx_peer_list(cx_engine_t *e, cx_peer_info_t *out, int max)
{
    if (!e || max < 0 || (max > 0 && !out)) {
        cx_warn("cx_peer_list: %s", !e ? "no engine" : "out is NULL or max < 0");
        return CX_EINVAL;
    }
    struct peer_list l = { out, max, 0 };
    int rc = cx_exec(e, peer_list_fn, &l);
    return rc ? rc : l.n;
}

/* ---------------------------------------------------------------- memory */

struct reg_arg {
    void *addr;
    size_t len;
    int rc;
    cx_region_t *reg;
};

static void reg_fn(cx_engine_t *e, void *arg)
{
    struct reg_arg *a = arg;
    int kind = cx_gpu_hook_mem_kind(a->addr, a->len);
    if (kind < 0) {
        a->rc = kind;
        return;
    }
    cx_region_t *r;
    a->rc = cx_registry_add(&e->reg, a->addr, a->len, kind, &r);
    if (a->rc) return;
    int staged = 0;
    for (int i = 0; i < e->nb; i++) {
        uint8_t key[CX_KEY_MAX];
        size_t klen = sizeof key;
        /* Device memory a backend cannot reach itself is staged by this side (tstage.h): no
         * registration, so no key for that backend goes to peers. */
        if (!cx_tstage_register_with(e, i, kind)) {
            staged = 1;
            continue;
        }
        int rc = e->be[i].ops->mem_reg(e->be[i].b, a->addr, a->len, kind, &r->mh[i], key, &klen);
        if (rc == CX_OK && klen > CX_KEY_MAX) rc = CX_ERR;
        if (rc == CX_OK) {
            r->key[i] = malloc(klen ? klen : 1);
            if (!r->key[i])
                rc = CX_ENOMEM;
            else {
                memcpy(r->key[i], key, klen);
                r->key_len[i] = (uint16_t)klen;
            }
        }
        if (rc) {
            cx_error("register %p+%zu: backend %s refused it (%s)", a->addr, a->len, e->bnames[i], cx_strerror(rc));
            for (int j = 0; j <= i; j++)
                if (r->mh[j]) e->be[j].ops->mem_dereg(e->be[j].b, r->mh[j]);
            cx_registry_remove(&e->reg, a->addr, NULL);
            a->rc = rc;
            return;
        }
    }
    /* Its ring now, not at a peer's first op: allocating and registering it takes a while (tens
     * to hundreds of ms for the default 32 MiB on a loaded host), which that op's timeout would
     * pay. A failure here is logged; the first staged op tries again and reports it. */
    cx_gpu_mem_t gm;
    if (staged && cx_gpu_mem_query(a->addr, a->len, &gm) == CX_OK) {
        cx_staging_ring_t ring;
        (void)cx_staging_ring(e, gm.kind, gm.kind == CX_MEM_SIM ? 0 : gm.device, &ring);
    }
    uint8_t *buf = malloc(64 + (size_t)e->nb * (CX_KEY_MAX + 24));
    if (buf) {
        cx_wr_t w;
        cx_wr_init(&w, buf, 64 + (size_t)e->nb * (CX_KEY_MAX + 24));
        cx_wire_put_region(&w, r, e->bnames, e->nb);
        if (w.ok) cx_peer_broadcast(e, CX_CTL_REG_ADD, buf, w.len);
        free(buf);
    }
    a->reg = r;
}

int cx_register_memory(cx_engine_t *e, void *addr, size_t len)
{
    if (!e) return CX_EINVAL;
    struct reg_arg a = { addr, len, CX_ERR, NULL };
    int rc = cx_exec(e, reg_fn, &a);
    return rc ? rc : a.rc;
}

static void unreg_fn(cx_engine_t *e, void *arg)
{
    struct reg_arg *a = arg;
    cx_region_t *r;
    a->rc = cx_registry_remove(&e->reg, a->addr, &r);
    if (a->rc) return;
    cx_peer_region_gone(e, r); /* REG_DEL; a pin per peer until it acks or goes */
    a->reg = r;
}

/* The backends' registrations go last, once nothing pins the region: an op of ours in it may
 * still be queued in a backend with its memory handle, and a peer's op that started before our
 * REG_DEL reached it ends as it would have (its REG_DEL_ACK waits for it) instead of meeting a
 * closed key (libfabric's tcp provider then cancels every op on the connection). */
static void dereg_fn(cx_engine_t *e, void *arg)
{
    cx_region_t *r = arg;
    for (int i = 0; i < e->nb; i++) {
        if (r->mh[i]) e->be[i].ops->mem_dereg(e->be[i].b, r->mh[i]);
        r->mh[i] = NULL;
    }
}

int cx_unregister_memory(cx_engine_t *e, void *addr)
{
    if (!e) return CX_EINVAL;
    struct reg_arg a = { addr, 0, CX_ERR, NULL };
    int rc = cx_exec(e, unreg_fn, &a);
    if (rc) return rc;
    if (a.rc) return a.rc;
    /* Zero-copy sends out of this region may still be on the wire, and peers may not have
     * dropped it yet (over shared memory through CMA, or any transport whose target does not
     * check keys, a peer with the old view still reaches it): wait for both (bounded by the op
     * timeout; a peer that fails or leaves meanwhile owes nothing) before the caller is told it
     * may free the memory. */
    uint64_t deadline = cx_now_ns() + cx_ms_to_ns(e->cfg.op_timeout_ms);
    while (atomic_load(&a.reg->pins) > 0 && cx_now_ns() < deadline) {
        struct timespec ts = cx_ns_timespec(CX_UNREG_PIN_POLL_NS);
        nanosleep(&ts, NULL);
    }
    int pinned = atomic_load(&a.reg->pins) > 0;
    /* Past the op timeout the registrations go anyway: no NIC or peer reaches the memory
     * through them any more, whatever still holds the record. */
    rc = cx_exec(e, dereg_fn, a.reg);
    if (rc) {
        cx_error("unregister %p: the engine closed meanwhile (%s): its backend registrations are leaked", addr,
                 cx_strerror(rc));
        return rc;
    }
    if (pinned) {
        cx_error("unregister %p: ops in the region, sends from it, or a peer that has not dropped "
                 "it, after %u ms; leaking its record",
                 addr, e->cfg.op_timeout_ms);
        return CX_ETIMEDOUT;
    }
    cx_region_free(a.reg);
    return CX_OK;
}

/* ---------------------------------------------------------------- data ops */

static int local_check(cx_engine_t *e, const void *buf, size_t len, const char *what, int *mem_kind)
{
    if (!buf) {
        cx_warn("%s: NULL local buffer", what);
        return CX_EINVAL;
    }
    if (len == 0) {
        cx_warn("%s: zero length", what);
        return CX_EINVAL;
    }
    if (!cx_registry_contains(&e->reg, (uint64_t)(uintptr_t)buf, len, mem_kind)) {
        cx_warn("%s: local buffer [%p, +%zu) is not inside one registered region", what, buf, len);
        return CX_EINVAL;
    }
    return CX_OK;
}

static int prep(cx_engine_t *e, cx_op_t *op, int kind, int xkind, const char *peer, void *local, uint64_t remote,
                size_t len, const char *what)
{
    cx_op_init(op, e, kind);
    op->x.kind = xkind;
    op->x.local = local;
    op->x.len = len;
    op->x.remote = remote;
    op->w.spin_ns = cx_spin_for_len(op->w.spin_ns, len);
    int rc = parse_peer(e, peer, op);
    if (!rc && xkind != CX_XFER_MSG) rc = local_check(e, local, len, what, &op->x.local_mem);
    if (!rc && remote + len < remote) {
        cx_warn("%s: remote range wraps around", what);
        rc = CX_EINVAL;
    }
    op->deadline_ns = cx_deadline_ns(e->cfg.op_timeout_ms);
    return rc;
}

int cx_read(cx_engine_t *e, const char *peer, void *dst, uint64_t remote_src, size_t len)
{
    if (!e) return CX_EINVAL;
    cx_op_t op;
    int rc = prep(e, &op, CX_OPK_READ, CX_XFER_READ, peer, dst, remote_src, len, "read");
    if (rc) {
        op_destroy(&op);
        return rc;
    }
    return run_sync(e, &op);
}

int cx_write(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len)
{
    if (!e) return CX_EINVAL;
    cx_op_t op;
    int rc = prep(e, &op, CX_OPK_WRITE, CX_XFER_WRITE, peer, (void *)src, remote_dst, len, "write");
    if (rc) {
        op_destroy(&op);
        return rc;
    }
    return run_sync(e, &op);
}

int cx_put_signal(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len, const void *msg,
                  size_t msg_len, cx_op_t **out)
{
    if (out) *out = NULL;
    if (!e || !out) {
        cx_warn("put_signal: NULL engine or op pointer");
        return CX_EINVAL;
    }
    if (msg_len > CX_MSG_MAX || (msg_len && !msg)) {
        cx_warn("put_signal: bad message (%zu bytes)", msg_len);
        return CX_EINVAL;
    }
    cx_op_t *op = malloc(sizeof *op);
    if (!op) return CX_ENOMEM;
    int rc = prep(e, op, CX_OPK_PUT_SIGNAL, CX_XFER_PUT_SIGNAL, peer, (void *)src, remote_dst, len, "put_signal");
    if (!rc && msg_len) {
        op->msg_copy = malloc(msg_len);
        if (!op->msg_copy)
            rc = CX_ENOMEM;
        else
            memcpy(op->msg_copy, msg, msg_len);
    }
    op->x.msg = op->msg_copy;
    op->x.msg_len = msg_len;
    op->async = 1;
    if (!rc) rc = cx_drive(e, op, 0) ? CX_OK : cx_submit(e, op);
    if (rc) {
        op_destroy(op);
        free(op);
        return rc;
    }
    *out = op;
    return CX_OK;
}

/* cx_read_async / cx_write_async: like put_signal's op, freed by cx_op_wait. */
static int class_op(cx_engine_t *e, int kind, int xkind, const char *peer, void *local, uint64_t remote, size_t len,
                    cx_class_t cls, cx_op_t **out, const char *what)
{
    if (out) *out = NULL;
    if (!e || !out) {
        cx_warn("%s: NULL engine or op pointer", what);
        return CX_EINVAL;
    }
    if ((unsigned)cls > CX_CLASS_BACKGROUND) {
        cx_warn("%s: class %d is neither critical (0) nor background (1)", what, (int)cls);
        return CX_EINVAL;
    }
    cx_op_t *op = malloc(sizeof *op);
    if (!op) return CX_ENOMEM;
    int rc = prep(e, op, kind, xkind, peer, local, remote, len, what);
    op->sc.cls = (int)cls;
    op->async = 1;
    if (!rc) rc = cx_drive(e, op, 0) ? CX_OK : cx_submit(e, op);
    if (rc) {
        op_destroy(op);
        free(op);
        return rc;
    }
    *out = op;
    return CX_OK;
}

int cx_read_async(cx_engine_t *e, const char *peer, void *dst, uint64_t remote_src, size_t len, cx_class_t cls,
                  cx_op_t **op)
{
    return class_op(e, CX_OPK_READ, CX_XFER_READ, peer, dst, remote_src, len, cls, op, "read_async");
}

int cx_write_async(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len, cx_class_t cls,
                   cx_op_t **op)
{
    return class_op(e, CX_OPK_WRITE, CX_XFER_WRITE, peer, (void *)src, remote_dst, len, cls, op, "write_async");
}

int cx_op_wait(cx_op_t *op, int timeout_ms)
{
    if (!op) return CX_EINVAL;
    struct timespec dl;
    if (timeout_ms >= 0) cx_deadline_ms(&dl, timeout_ms);
    /* Async ops (put_signal, read/write_async) are driven by their waiter as sync ops are by
     * their caller (drive.h): left to the progress thread, each took its wake-ups (4 KiB
     * put_signal over shared memory: 48-50 us, against 1-3 us for a write). Not beyond the
     * caller's timeout; a waiter that cannot take the transports spins for the window instead. */
    cx_engine_t *e = op->e;
    uint64_t win = op->w.spin_ns;
    if (timeout_ms > 0 && win > cx_ms_to_ns((uint64_t)timeout_ms)) win = cx_ms_to_ns((uint64_t)timeout_ms);
    if (timeout_ms && win && e && e->drive && op->kind != CX_OPK_EXEC && !cx_op_is_done(op)) {
        atomic_fetch_add(&e->drivers, 1);
        cx_drive_wait(e, op, win);
        atomic_fetch_sub(&e->drivers, 1);
    } else if (timeout_ms && !win && e && op->kind != CX_OPK_EXEC && !cx_op_is_done(op)) {
        /* No window to poll in: sleep on the transports instead, when they are free (drive.h). */
        cx_drive_sleep_wait(e, op, timeout_ms > 0 ? cx_ms_to_ns((uint64_t)timeout_ms) : 0);
    } else if (timeout_ms) {
        cx_op_spin(op, win);
    }
    pthread_mutex_lock(&op->mu);
    while (!cx_op_is_done(op))
        if (cx_cond_wait_ms(&op->cv, &op->mu, timeout_ms >= 0 ? &dl : NULL) == ETIMEDOUT) break;
    int done = cx_op_is_done(op), st = op->status;
    pthread_mutex_unlock(&op->mu);
    /* Neither CX_ETIMEDOUT nor CX_EAGAIN: both are ops' own statuses, after which the op is gone. */
    if (!done) return CX_EINPROGRESS;
    if (e) remember_peer(e, op);
    op_destroy(op);
    free(op);
    return st;
}

int cx_send_msg(cx_engine_t *e, const char *peer, const void *buf, size_t len)
{
    if (!e) return CX_EINVAL;
    if (len > CX_MSG_MAX) {
        cx_warn("send_msg: %zu bytes exceeds CX_MSG_MAX", len);
        return CX_EINVAL;
    }
    if (len && !buf) {
        cx_warn("send_msg: NULL buffer");
        return CX_EINVAL;
    }
    cx_op_t op;
    int rc = prep(e, &op, CX_OPK_MSG, CX_XFER_MSG, peer, NULL, 0, 0, "send_msg");
    op.x.msg = buf;
    op.x.msg_len = len;
    if (rc) {
        op_destroy(&op);
        return rc;
    }
    return run_sync(e, &op);
}

int cx_recv_msg(cx_engine_t *e, cx_msg_t *msg, int timeout_ms)
{
    if (!e || !msg) return CX_EINVAL;
    memset(msg, 0, sizeof *msg);
    if (timeout_ms) cx_drive_waiting(e);
    return cx_msgq_pop(&e->msgq, msg, timeout_ms);
}

void cx_msg_release(cx_msg_t *msg)
{
    if (!msg) return;
    free(msg->data);
    msg->data = NULL;
    msg->len = 0;
}

int cx_wait_event(cx_engine_t *e, cx_event_t *ev, int timeout_ms)
{
    if (!e || !ev) return CX_EINVAL;
    if (timeout_ms) cx_drive_waiting(e);
    return cx_evq_pop(&e->evq, ev, timeout_ms);
}

static void stats_fn(cx_engine_t *e, void *arg)
{
    cx_stats_collect(e, arg);
}

void cx_stats_collect(cx_engine_t *e, cx_stats_t *st)
{
    *st = e->st;
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        switch (p->state) {
        case CX_PEER_CONNECTING: st->peers_connecting++; break;
        case CX_PEER_UP: st->peers_up++; break;
        case CX_PEER_SUSPECT: st->peers_suspect++; break;
        case CX_PEER_FAILED: st->peers_failed++; break;
        case CX_PEER_LEFT: st->peers_left++; break;
        default: break;
        }
        for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next) st->ops_in_flight += cx_op_inflight_n(op);
    }
    pthread_rwlock_rdlock(&e->reg.lock);
    st->regions = e->reg.n;
    st->registered_bytes = e->reg.bytes;
    pthread_rwlock_unlock(&e->reg.lock);
    st->msgs_queued = cx_msgq_len(&e->msgq);
    pthread_mutex_lock(&e->evq.mu);
    st->events_dropped = e->evq.dropped;
    pthread_mutex_unlock(&e->evq.mu);
    cx_staging_stats(e, st);
    cx_sched_stats(e, st);
}

int cx_stats(cx_engine_t *e, cx_stats_t *st)
{
    if (!e || !st) return CX_EINVAL;
    memset(st, 0, sizeof *st);
    return cx_exec(e, stats_fn, st);
}
