/* Engine internals shared by the core's files. Only the progress thread touches peers, conns,
 * ops in flight and backends; caller threads touch the command queue, the message and event
 * queues and the registry (under their locks). */
#ifndef CX_ENGINE_H
#define CX_ENGINE_H

#include "connex/backend.h"
#include "connex/options.h"
#include "auth.h"
#include "connex/connex.h"
#include "ctl_wire.h"
#include "metrics.h"
#include "proc.h"
#include "queue.h"
#include "region.h"
#include "units.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cx_peer cx_peer_t;
typedef struct cx_conn cx_conn_t;

enum {
    CX_W_LISTEN = 1,
    CX_W_CONN,
    CX_W_CMD,
    CX_W_TIMER,
    CX_W_BACKEND,
    CX_W_STAGE,
    CX_W_LIVE,
    CX_W_DRIVE,
    CX_W_METRICS
};
typedef struct cx_watch {
    int kind;
    void *obj;
    int idx;
} cx_watch_t;

struct cx_conn {
    cx_watch_t w;
    int fd;
    int outgoing;    /* we initiated it */
    int tcp_up;      /* non-blocking connect finished */
    int want_out;    /* EPOLLOUT registered */
    cx_peer_t *peer; /* outgoing: the peer dialled; inbound: set once HELLO is accepted */
    int bound;       /* the peer's active connection */
    uint8_t *rx;
    size_t rx_len, rx_cap;
    uint8_t *tx;
    size_t tx_off, tx_len, tx_cap;
    uint64_t t_start_ns; /* for the HELLO timeout */
    cx_auth_conn_t au;   /* the AUTH exchange (auth.h), when a token is set */
    int watch;           /* an operator's tool following the events (peer/status.c) */
    cx_conn_t *next;
};

typedef struct cx_rregion { /* a region registered at a peer, as its HELLO/REG_ADD said */
    uint64_t id, addr, len;
    int mem_kind;
    uint16_t key_len[CX_MAX_BACKENDS]; /* indexed by *local* backend index */
    uint8_t *key[CX_MAX_BACKENDS];
    struct cx_rregion *next;
} cx_rregion_t;

typedef struct cx_rgone { /* a peer's region gone from its table while ops of ours are in it */
    uint64_t id;
    cx_rregion_t *rr; /* its keys (NULL: none were known) */
    int ack;          /* a REG_DEL_ACK is owed once the ops ended */
} cx_rgone_t;

struct cx_op {
    cx_xfer_t x; /* what the backend sees; first member */
    cx_engine_t *e;
    int kind;            /* CX_OPK_* or CX_OPK_EXEC */
    int by_url;          /* peer named by URL (connects if needed); the name: `url`, `lid` below */
    cx_peer_t *hint;     /* the peer an earlier op of this thread named so resolved to in this
                                 engine (parse_peer): peers live as long as their engine */
    cx_peer_t *resolved; /* the peer cx_op_start resolved, for the next op's hint */
    uint64_t name_gen;   /* which of this thread's parses named the peer */
    cx_peer_t *peer;
    int stage; /* OPS_* */
    uint64_t deadline_ns;
    uint64_t query_id;
    int status;
    int forced_status;                 /* set before a disconnect: the status the xfer completes with */
    uint64_t settle_ns;                /* OPS_WAIT_VERDICT after a local error: ends CX_ERR at this time (ops.c) */
    void (*fn)(cx_engine_t *, void *); /* CX_OPK_EXEC */
    void *arg;
    void *msg_copy; /* put_signal's message, copied so the caller may reuse its buffer */
    int async;      /* put_signal: freed by cx_op_wait */
    int done;       /* atomic: cx_op_is_done / cx_op_set_done (spin.h) */
    cx_op_t *next, *prev;
    /* Set: cx_op_complete calls it instead of waking a caller (a group step's child, group.c). */
    void (*on_done)(cx_op_t *op, int status);
    cx_op_t *hnext;        /* OPS_HANDOFF: the engine's handoff list (drive.h) */
    struct cx_op_wait {    /* the caller that waits for it (engine.c run_sync, cx_op_wait) */
        uint64_t spin_ns;  /* the engine's poll window, copied: an async op outlives its engine */
        int waiters_gone;  /* async op whose caller waits no more (engine destroyed) */
        int owned;         /* a synchronous call's op: `owner` waits for it (run_sync) */
        int done_by_owner; /* completed on `owner`'s own thread, which drove it: no wake-up */
        pthread_t owner;
    } w;
    struct cx_op_sched {         /* traffic classes (cx_sched.h) */
        int cls;                 /* CX_CLASS_* the caller asked for */
        int credit;              /* 1 + the class whose credit the op holds; 0 none */
        uint32_t weight;         /* credits it takes (0: one); a batch's run: its entries */
        cx_op_t *cnext, *cprev;  /* the peer's wait-for-credit FIFO, or (a background transfer)
                                     the peer's list of background transfers */
        cx_op_t *parent;         /* CX_OPK_CHUNK: the background transfer it is a piece of */
        size_t bg_off;           /* background transfer: bytes handed to chunks so far */
        uint32_t bg_out;         /* background transfer: chunks not yet completed */
        int bg_status;           /* background transfer: first error of a chunk */
        uint64_t bg_deadline_ns; /* background transfer: fails if no chunk starts before it */
    } sc;
    void *ts; /* OPS_TSTAGE: its staged range; CX_OPK_TSUB: the chunk (tstage.h) */
    /* The local region the op's bytes move in, pinned from its start to its end, so that
     * cx_unregister_memory returns (and the backends drop the registration) only after. */
    cx_region_t *lpin;
    uint64_t t0_ns; /* a timed op (metrics.h): when the caller started it; 0: not timed */
    /* A batch's run (batch.h): its entries, their bytes, and the length of the remote range
     * that holds them all (x.local and x.len span the local one, x.remote starts the remote
     * one); the backend gets the entries, never x. 0 for any other op. */
    uint32_t nent;
    size_t vbytes, rspan;
    /* Last, so that a batch's entries, which are named by their resolved peer and woken through
     * on_done, set up only what comes before (CX_OP_ENTRY_SIZE): zeroing all of it cost more
     * instructions per entry than posting the entry (batch.c). */
    cx_url_t url;
    cx_lid_t lid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};
#define CX_OP_ENTRY_SIZE offsetof(cx_op_t, url)
#define CX_OPK_EXEC 100
#define CX_OPK_CONNECT 101
#define CX_OPK_SUB 102    /* one chunk of a staged op (staging.h); op->arg -> the chunk */
#define CX_OPK_GROUP 110  /* a group step (mobility/group.c); op->msg_copy -> its state and payload */
#define CX_OPK_CHUNK 103  /* one chunk of a background-class transfer (cx_sched.h); op->sc.parent */
#define CX_OPK_TSUB 104   /* one chunk of a range staged by the target (tstage.h); op->ts */
#define CX_OPK_BATCH 111  /* a batch of transfers (batch.h); op->msg_copy -> its state */
#define CX_OPK_BQUERY 112 /* a batch's region query for one entry (batch.h) */
/* What `op`, linked to its peer, adds to cx_stats' ops_in_flight: a batch's run its entries (as
 * the entries that go alone count one each), a piece of another op (a background chunk, a
 * sub-op) nothing. */
static inline uint64_t cx_op_inflight_n(const cx_op_t *op)
{
    return op->kind == CX_OPK_SUB || op->kind == CX_OPK_CHUNK ? 0 : op->nent ? op->nent : 1;
}
/* OPS_STAGING: the op's chunks go through the GPU staging ring (staging.h), op->arg -> job */
enum {
    OPS_QUEUED = 0,
    OPS_WAIT_PEER,
    OPS_WAIT_REGION,
    OPS_IN_BACKEND,
    OPS_DONE,
    OPS_STAGING,
    OPS_WAIT_CREDIT,  /* in the peer's FIFO of its class, waiting for a credit (cx_sched.h) */
    OPS_CHUNKED,      /* a background transfer moving in chunks, not linked to the peer */
    OPS_HANDOFF,      /* started by a driving caller, left for the progress thread (drive.h) */
    OPS_WAIT_VERDICT, /* its connection failed under it while the peer is probed, or it ended with
                       * a local error (settle_ns): ends CX_EPEER if the peer fails, CX_ERR if the
                       * probe is answered or the settle time passes with the peer still up
                       * (cause.h, ops.c) */
    OPS_TSTAGE        /* the target stages its device memory through its ring (tstage.h) */
};                    /* the target stages its device memory through its ring (tstage.h) */

struct cx_peer {
    cx_lid_t lid;
    char lid_str[96];
    cx_url_t u;
    char url[CX_URL_MAX];
    cx_peer_state_t state;
    int ever_up;
    int bye;              /* BYE received on the active connection */
    uint64_t incarnation; /* of the current (or last) HELLO; 0 before any */
    int ts_logged;        /* tstage.h: said once that it stages its device memory for us */
    cx_conn_t *conn;      /* active control connection */
    cx_conn_t *pending;   /* outgoing connection before HELLO_ACK */
    /* what the peer advertised, indexed by our backend index */
    uint16_t adv_len[CX_MAX_BACKENDS];
    uint8_t *adv[CX_MAX_BACKENDS];
    char their_choice[CX_MAX_BACKENDS][64]; /* their backends, in their order */
    int n_their;
    int same_host;
    /* Its process, when same_host and its HELLO named a pid (proc.h): what backends ask of it
     * (cx_core_peer_process, cx_core_peer_exit_fd). Follows the pid of the latest HELLO until the
     * peer fails or leaves. */
    cx_proc_t proc;
    char why[192]; /* why this pair uses its backend */
    int bidx;      /* backend in use, -1 none */
    cx_bep_t *ep;
    cx_rregion_t *rregions;
    /* The same regions by start address: every op looks its remote range up, and a serving
     * process registers a region per layer's K and V (a hundred or more) */
    cx_rregion_t **rr_by_addr;
    size_t rr_n, rr_cap;
    /* Our unregistered regions whose REG_DEL this peer has not acked yet: each holds a pin, so
     * cx_unregister_memory returns only once the peer can no longer reach the memory. */
    cx_region_t **owed;
    size_t n_owed, cap_owed;
    /* Regions of the peer it unregistered (REG_DEL) while ops of ours still moved bytes in them:
     * its REG_DEL_ACK waits until they ended (cx_peer_delack_check), so that an unregister at
     * the peer returns only once nothing of ours reads or writes that memory. A transport whose
     * target does not check every request (UCX over tcp serves a get from the memory directly)
     * otherwise went on reading it after the unregister returned. The region's keys stay until
     * then too: an op in a backend's queue still points at its key blob, and a posted UCX
     * request at the rkey unpacked from it (forget_region). */
    cx_rgone_t *gone;
    size_t n_gone, cap_gone;
    cx_op_t ops; /* sentinel: every op bound to this peer */
    uint64_t last_rx_ns, last_tx_ns;
    uint64_t connect_deadline_ns; /* first connect: waiting ops fail after it */
    uint64_t next_reconnect_ns;
    uint32_t backoff_ms;
    int reconnect; /* reconnect in the background (after FAILED) */
    int suspect_reported;
    /* A backend reported a transport error (CX_CAUSE_TRANSPORT): a probe went out over the
     * control connection; its answer ends it, silence for the heartbeat timeout fails the peer. */
    int probing;
    uint64_t probe_id, probe_sent_ns;
    int want_ep; /* a backend holds a request of it and no endpoint (cx_core_peer_want_ep) */
    cx_peer_t *next;
    cx_peer_t *lid_hnext; /* the engine's by-LID bucket (peer/table.c) */
    cx_peer_t *inc_hnext; /* the engine's by-incarnation bucket, once a HELLO gave one */
    int inc_hashed;
    cx_peer_t *active_next; /* the engine's peers that may hold ops (cx_peer_activate) */
    int active;
    cx_peer_t *dirty_next; /* the engine's peers with sched_dirty set (cx_sched.h) */
    /* traffic classes (cx_sched.h): per class, ops holding a credit and the FIFO of ops waiting */
    uint32_t cls_inflight[2];
    cx_op_t *cls_wait[2], *cls_wait_tail[2];
    cx_op_t *bg_head, *bg_tail; /* background transfers not yet completed, oldest first */
    int sched_dirty;            /* a credit came free or work arrived: cx_sched_pump looks */
    int bg_deferred;            /* a chunk is being held back for critical ops (counted once) */
    uint64_t crit_last_ns;      /* a critical op completed then (background keeps waiting) */
    uint64_t bg_last_ns;        /* the last background chunk started then */
    /* Under evq.mu (cx_event_gate): the same-host watcher thread reports a death itself. Tags are
     * incarnation + 1 (0: none). */
    uint64_t ev_inc;     /* the incarnation of the last UP/JOINED that went out */
    int ev_ended;        /* its FAILED or LEFT went out */
    uint64_t ev_dead;    /* the incarnation the watcher reported dead */
    cx_peer_metrics_t m; /* its counters (metrics.h) */
};

typedef struct cx_bslot { /* an opened backend */
    const struct cx_backend_ops *ops;
    cx_backend_t *b;
    uint8_t addr[CX_BADDR_MAX];
    size_t addr_len;
    cx_watch_t w;
} cx_bslot_t;

struct cx_engine {
    cx_config_t cfg;
    cx_opts_t opts; /* the CONNEX_* variables, parsed at create (connex/options.h) */
    char model[CX_MODEL_MAX];
    char listen_ip[48];
    char adv_ip[48]; /* the address advertised (advertise.h): the URL's host */
    cx_lid_t lid;
    char url[CX_URL_MAX];
    uint64_t incarnation;
    cx_auth_t *auth; /* NULL: no token, connections are not authenticated */

    int epfd, lfd, cmdfd, timerfd;
    int dtimerfd; /* the drive timer (drive.h): callers that drive push it forward */
    int letgofd;  /* eventfd: the progress thread asks a caller asleep on the transports to let go */
    cx_watch_t lw, cw, tw, dw;
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    /* The transports' owner: the progress thread, except while it sleeps, when a caller may
     * drive them (drive.h). Everything under "progress-thread state" is guarded by it. */
    pthread_mutex_t plock;
    int ready;                  /* under plock: the progress thread has started */
    int drive;                  /* CONNEX_DRIVE (drive.h), read once */
    int drive_sleep;            /* CONNEX_DRIVE_SLEEP (drive.h), read once */
    atomic_int sleeping;        /* a driving caller sleeps on the transports' wait fds (drive.c) */
    atomic_int drivers;         /* callers in a synchronous op that drive the transports themselves */
    atomic_int pwant;           /* the progress thread waits for plock: a driving caller lets go */
    atomic_int cmd_kicked;      /* cmdfd was written and not read since (a driving caller reads
                                 it when it drains the queue itself: drive.c) */
    int driving;                /* under plock: its holder is a caller, not the progress thread */
    cx_op_t *handoff;           /* under plock: ops a driving caller left for the progress thread */
    atomic_int handoff_waiting; /* `handoff` is not empty, for the progress thread without plock */
    int unarmed;                /* under plock: callers drive; the backends' wait fds are out of the
                                 progress thread's epoll set and not armed (drive.h) */
    uint64_t drove_ns;          /* under plock: when a driving caller last let go */
    int slow_reads;             /* under plock: the last read a caller slept for did not end at
                                 its start (drive.c, cx_drive) */
    int armed_clean;            /* under plock: the last turn armed every backend and found
                                 nothing more to do; nothing ran since (drive.c, rearm) */
    atomic_int left_polled;     /* `unarmed`, for threads without plock (cx_drive_waiting) */
    atomic_int rearm_asked;     /* a thread waits for what only the transports bring: arm them */
    uint64_t full_turn_ns;      /* progress thread: its last turn that gave every backend progress() */
    uint64_t dtimer_due_ns;     /* under plock: when the drive timer fires (drive.h) */

    cx_bslot_t be[CX_MAX_BACKENDS];
    int nb;
    char backends_str[64];
    const char *bnames[CX_MAX_BACKENDS];
    char bchoice[CX_MAX_BACKENDS][64]; /* what HELLO says about each (select/'s format) */
    const char *bchoice_p[CX_MAX_BACKENDS];
    char host_id[128];

    /* command queue: caller threads -> progress thread */
    pthread_mutex_t qmu;
    cx_op_t *qhead, *qtail;
    int closing; /* no more commands accepted */

    cx_registry_t reg;
    cx_msgq_t msgq;
    cx_evq_t evq;

    /* progress-thread state */
    cx_peer_t *peers;
    int want_ep; /* some peer's want_ep is set (cx_peers_want_ep) */
    /* Every op resolves its peer, and every message from a peer its incarnation: with a serving
     * cluster's hundreds of peers a list walk cost more than a shared-memory op (peer/table.c). */
#define CX_PEER_BUCKETS 256
    cx_peer_t *peer_by_lid[CX_PEER_BUCKETS];
    cx_peer_t *peer_by_inc[CX_PEER_BUCKETS];
    /* Peers an op was linked to or a background transfer queued on since a driving caller last
     * found them idle: what it looks through for ops of others after each op (drive.c). */
    cx_peer_t *active_peers;
    cx_peer_t *sched_dirty_head; /* peers cx_sched_pump must look at */
    cx_conn_t *conns;            /* every control connection */
    uint64_t next_query_id;
    uint64_t tick_ns;

    /* counters: written by the progress thread, read by cx_stats through an exec */
    cx_stats_t st;
    /* Latency of ok ops initiated here (one in 8 timed), per backend index (the last: ops that reached none) and
     * op kind (metrics.h); progress-thread state, like st. */
    cx_hist_t hist[CX_MAX_BACKENDS + 1][CX_OPK_COUNT];
    struct cx_metrics_srv *msrv; /* the GET /metrics listener (CONNEX_METRICS), NULL: none */

    struct cx_staging *stg; /* staging.c: GPU staging rings and jobs, NULL until first use */
    struct cx_tstage *ts;   /* tstage.c: ranges staged by a target, both roles; NULL until used */

    /* mobility (mobility/mobility.h) */
    struct cx_dir *dir;          /* the identity directory (dir.c) */
    struct cx_group *groups;     /* open groups (group.c), progress-thread list */
    struct cx_step_rx *steps_rx; /* receiver-side duplicate filter per sender (step.c) */
    uint64_t last_step;          /* the last group step id this engine issued (group.c) */

    uint64_t sched_wake_ns; /* traffic classes: background held back is due then (0: never) */

    /* batches (batch.h): those whose children of a phase all came back, for cx_batches_progress;
     * and, while a batch starts its transfers, the batch collecting them for one bulk post */
    struct cx_batch *batch_ready;
    struct cx_batch *bpost;

    struct cx_live *live; /* same-host death watch (live.h), NULL when unavailable */

    uint64_t spin_ns;      /* poll window after work (spin.h, CONNEX_POLL_US); 0: never poll */
    uint64_t pwin_ns;      /* progress thread: its own window, spin_ns grown while a backend
                                 wakes it soon after it stopped polling (spin.h) */
    uint64_t pslept_ns;    /* progress thread: when it stopped polling to sleep (0: it did not) */
    uint64_t last_work_ns; /* progress thread: when an iteration last found something to do */
};

struct cx_core {
    cx_engine_t e;
}; /* backends see the engine as cx_core_t */
static inline cx_core_t *cx_core_of(cx_engine_t *e)
{
    return (cx_core_t *)(void *)e;
}
static inline cx_engine_t *cx_engine_of(cx_core_t *c)
{
    return (cx_engine_t *)(void *)c;
}

uint64_t cx_now_ns(void);
/* now + ms as a deadline, from the coarse clock plus one of its ticks: never earlier than
 * cx_now_ns() + ms, at most a tick (1-10 ms) later, and a third of the cost on the per-op path
 * (6 ns against 23 ns for a vDSO clock read on the 2-vCPU VM). Deadlines are checked against
 * cx_now_ns(). */
uint64_t cx_deadline_ns(uint32_t ms);

/* engine.c */
int cx_submit(cx_engine_t *e, cx_op_t *op); /* queue an op for the progress thread */
void cx_op_init(cx_op_t *op, cx_engine_t *e, int kind);
void cx_op_complete(cx_op_t *op, int status); /* progress thread: wake the caller */
int cx_exec(cx_engine_t *e, void (*fn)(cx_engine_t *, void *), void *arg);
/* For other entry points (batch.c): a peer's name parsed into op (by_url, url, lid, the
 * thread's hint), a synchronous op run to its end, an op's resources freed. */
int cx_op_name_peer(cx_engine_t *e, const char *peer, cx_op_t *op);
int cx_op_run_sync(cx_engine_t *e, cx_op_t *op);
void cx_op_destroy(cx_op_t *op);

/* engine.c: the counters of cx_stats, on the progress thread */
void cx_stats_collect(cx_engine_t *e, cx_stats_t *st);

/* progress.c */
void *cx_progress_main(void *arg);
/* Under plock: start every queued op, after the ops driving callers handed off. A driving caller
 * leaves the same-host watch's reports and execs (from the first one on, in order) to the
 * progress thread, and starts nothing while a reported death waits to be reaped. Returns 1 when
 * the queue is empty now, 0 when something is left for the progress thread. */
int cx_progress_drain(cx_engine_t *e);
/* cx_progress_drain after reading the command eventfd. A driving caller that drains the queue
 * reads it too, when a submit wrote it: else the progress thread wakes for commands the caller
 * has started, takes the lock as the caller lets go, and the caller's next op queues again (and
 * writes it again), a round that repeats for every op after it. */
int cx_progress_drain_commands(cx_engine_t *e);
/* Under plock: every transport's turn, then what their completions unblock; 1: more at once.
 * With `poll`, backends that can poll without arming do so (a driving caller's loop). A driving
 * caller skips thread-bound backends and GPU staging (drive.h). */
int cx_progress_turn(cx_engine_t *e, int poll);
int cx_watch_add(cx_engine_t *e, int fd, uint32_t events, cx_watch_t *w);
int cx_watch_mod(cx_engine_t *e, int fd, uint32_t events, cx_watch_t *w);
void cx_watch_del(cx_engine_t *e, int fd);

/* sock.c */
int cx_sock_listen(const char *ip, uint16_t port, uint16_t *bound_port);
int cx_sock_connect(const cx_url_t *u, int *in_progress);
void cx_conn_send(cx_engine_t *e, cx_conn_t *c, uint8_t type, const void *body, size_t len);
/* A frame of `len` body bytes written in place: fill the returned body (NULL: out of memory,
 * nothing queued), then commit it. Nothing may be queued on `c` in between. */
uint8_t *cx_conn_reserve(cx_conn_t *c, uint8_t type, size_t len);
void cx_conn_commit(cx_engine_t *e, cx_conn_t *c, size_t len);
int cx_conn_flush(cx_engine_t *e, cx_conn_t *c); /* CX_EPEER when the socket failed */
cx_conn_t *cx_conn_new(cx_engine_t *e, int fd, int outgoing, int tcp_up);
void cx_conn_close(cx_engine_t *e, cx_conn_t *c); /* unlinks from the engine and frees */

/* peer/: the table, the handshake, control connections, liveness, events, remote regions */
cx_peer_t *cx_peer_find(cx_engine_t *e, const cx_lid_t *lid);
cx_peer_t *cx_peer_by_inc(cx_engine_t *e, uint64_t inc);       /* UP or SUSPECT only */
cx_peer_t *cx_peer_get_url(cx_engine_t *e, const cx_url_t *u); /* find or create */
void cx_peer_follow_url(cx_peer_t *p, const cx_url_t *u);      /* p named at u: follow a move */
void cx_peer_dial(cx_engine_t *e, cx_peer_t *p);
void cx_peer_fail(cx_engine_t *e, cx_peer_t *p, const char *reason);
/* What the pair's data endpoint really runs over, as its backend reports it ("" when unknown). */
void cx_peer_transport(cx_engine_t *e, const cx_peer_t *p, char *buf, size_t n);
int cx_peer_ensure_ep(cx_engine_t *e, cx_peer_t *p); /* (re)creates the data endpoint */
void cx_peers_want_ep(cx_engine_t *e);               /* the endpoints backends asked for (cx_core_peer_want_ep) */
/* An op of ours to p ended: send the REG_DEL_ACKs that waited for it (peer/rregion.c). */
void cx_peer_delack_check(cx_engine_t *e, cx_peer_t *p);
/* Anything from the peer (a frame, a reply, a request) proves it alive. */
void cx_peer_heard(cx_engine_t *e, cx_peer_t *p);
void cx_conn_readable(cx_engine_t *e, cx_conn_t *c);
void cx_conn_writable(cx_engine_t *e, cx_conn_t *c);
void cx_conn_lost(cx_engine_t *e, cx_conn_t *c, const char *reason);
void cx_accept_all(cx_engine_t *e);
void cx_peers_tick(cx_engine_t *e, uint64_t now);
void cx_peer_broadcast(cx_engine_t *e, uint8_t type, const void *body, size_t len);
/* Progress thread: `r` left the registry. REG_DEL to every connected peer; each one up holds a pin
 * on `r` until it acks (REG_DEL_ACK), fails or leaves. */
void cx_peer_region_gone(cx_engine_t *e, cx_region_t *r);
void cx_peer_send_bye_all(cx_engine_t *e);
/* The same-host watch saw dead's process die: tell every other peer that is up (CX_CTL_DEATH). */
void cx_peer_report_death(cx_engine_t *e, cx_peer_t *dead);
void cx_peer_free_all(cx_engine_t *e);
void cx_peer_drop_ep(cx_engine_t *e, cx_peer_t *p, int status);
/* A backend reported a transport error on the peer's connection: SUSPECT, data endpoint closed,
 * probe sent (cause.h). */
void cx_peer_probe(cx_engine_t *e, cx_peer_t *p, const char *reason);
void cx_event_emit(cx_engine_t *e, cx_peer_t *p, cx_event_type_t t, const char *reason);
/* Under e->evq.mu: whether an event of type t about incarnation inc of p goes out, and the
 * bookkeeping if it does. watcher: the same-host watcher thread reporting the process dead. */
int cx_event_gate(cx_peer_t *p, cx_event_type_t t, uint64_t inc, int watcher);
void cx_event_fill(cx_event_t *ev, const cx_lid_t *lid, const char *url, uint64_t inc, cx_event_type_t t,
                   const char *reason);
/* 1 when the same-host watcher has reported p's current incarnation dead: nothing more of it is
 * delivered (the progress thread fails it at its next turn). */
int cx_peer_reported_dead(cx_engine_t *e, cx_peer_t *p);
cx_rregion_t *cx_rregion_find(cx_peer_t *p, uint64_t addr, uint64_t len);

/* ops.c */
void cx_op_start(cx_engine_t *e, cx_op_t *op);
/* Binds an op to its peer: the timeout and failure paths walk the peer's list. */
void cx_op_link(cx_engine_t *e, cx_peer_t *p, cx_op_t *op);
/* Under plock: `p` may hold ops from now on (drive.c's others_in_flight looks at it). */
static inline void cx_peer_activate(cx_engine_t *e, cx_peer_t *p)
{
    if (p->active) return;
    p->active = 1;
    p->active_next = e->active_peers;
    e->active_peers = p;
}
/* The peer an op names (hint, URL, LID or the directory); NULL with *rc (CX_EINVAL: unknown or
 * this engine itself, logged; CX_ENOMEM). */
cx_peer_t *cx_op_resolve(cx_engine_t *e, cx_op_t *op, int *rc);
/* Asks op->peer whether it registered op's remote range (REG_QUERY); op waits in
 * OPS_WAIT_REGION for cx_region_reply. */
void cx_op_query_region(cx_engine_t *e, cx_op_t *op);
void cx_op_issue(cx_engine_t *e, cx_op_t *op);              /* peer is up: go to the backend */
void cx_op_finish(cx_engine_t *e, cx_op_t *op, int status); /* unlink from peer, count, wake */
void cx_peer_ops_fail(cx_engine_t *e, cx_peer_t *p, int status);
void cx_peer_ops_ready(cx_engine_t *e, cx_peer_t *p); /* peer came up: issue waiting ops */
void cx_ops_tick(cx_engine_t *e, uint64_t now);
/* An op a backend refused or completed with `status` (not a core verdict): ended now, or held
 * for the peer's verdict (cx_core_xfer_done). */
void cx_op_backend_status(cx_engine_t *e, cx_op_t *op, int status);
/* Under plock: the backend completed op's xfer (cx_core_xfer_done of an op's own x, or a batch's
 * run once its last entry is back). */
void cx_op_xfer_done(cx_engine_t *e, cx_op_t *op, int status);
void cx_ops_verdict_alive(cx_engine_t *e, cx_peer_t *p); /* probe answered: parked ops CX_ERR */
void cx_region_reply(cx_engine_t *e, cx_peer_t *p, uint64_t qid, int found);

#endif
