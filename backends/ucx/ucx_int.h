/* Internals of the UCX backend, shared by its files only.
 *
 * Everything here runs on the engine's progress thread. UCX callbacks fire inside
 * ucp_worker_progress (or inside a ucp_ep_close_nbx), where calling back into the core could
 * re-enter it while it is in the middle of something: so callbacks only record what happened
 * (an op finished, an endpoint failed, a message is ready) and cx_ucx_drain() tells the core
 * afterwards. The only exceptions are the message fast path (cx_core_deliver_msg, which only
 * queues a copy) and cx_core_peer_by_incarnation (a lookup).
 */
#ifndef CX_UCX_INT_H
#define CX_UCX_INT_H

#include "connex/backend.h"
#include "util/acktab.h"
#include "util/objcache.h"
#include "util/rread.h"
#include "util/cma.h"
#include "connex/log.h"
#include "connex/wire.h"
#include "ucx_dl.h"
#include "ucx_wire.h"

#include <stdint.h>
#include <ucp/api/ucp.h>

/* wire formats (magics, AM ids, header encoders and decoders): ucx_wire.h */

#define CX_UCX_RK_BUCKETS 32
#define CX_UCX_FREE_OPS_MAX 256 /* freed ops kept for reuse */
#define CX_UCX_INBOX_MAX 1024   /* messages held back at the target */
#define CX_UCX_INBOX_BYTES (256ull << 20)
#define CX_UCX_PARK_MS 2000  /* how long a message from an unknown sender waits */
#define CX_UCX_CLOSE_MS 2000 /* bound on waiting for a forced close */

typedef struct cx_ucx cx_ucx_t;
typedef struct cx_ucx_op cx_ucx_op_t;
typedef struct cx_ucx_in cx_ucx_in_t;
typedef struct cx_ucx_wk cx_ucx_wk_t;
typedef struct cx_ucx_ue cx_ucx_ue_t;
typedef struct cx_ucx_upd cx_ucx_upd_t;
typedef struct cx_ucx_ctl cx_ucx_ctl_t;

typedef struct cx_ucx_rk { /* a peer region's unpacked rkey, per endpoint */
    uint64_t region_id;
    ucp_rkey_h rk;
    int host;           /* the peer said the region is host memory (CX_UCX_HOST_MAGIC) ... */
    uint64_t base, len; /* ... and registered this range of it (ucx_cma.c checks against it) */
    struct cx_ucx_rk *next;
} cx_ucx_rk_t;

/* MOVED: taken off a retired worker whose FIFO is in doubt, posted again once it is destroyed
 * (ucx_rot.c, cx_ucx_rescue) */
/* WRITE: a write applied by the target (ucx_write.c), before its signal if a put_signal */
enum { CX_UCX_OPS_RMA = 0, CX_UCX_OPS_FLUSH, CX_UCX_OPS_AM, CX_UCX_OPS_HELD, CX_UCX_OPS_MOVED, CX_UCX_OPS_WRITE };

/* CONNEX_UCX_ROTATE_ZOMBIES (16), CONNEX_UCX_ROTATE_GRACE_MS (5000) and
 * CONNEX_UCX_READ_ANSWER_MIN (1 MiB): defaults and ranges in the options table (core/src/options.c). */
#define CX_UCX_DOUBT_GAP_MS 50 /* rotations for a dead writer's FIFO: at most one per */
/* Retired workers alive at once, at most: as many as dead writers' rotations (one per
 * CX_UCX_DOUBT_GAP_MS) can leave within their grace (CX_UCX_DOUBT_GRACE_MS), so that the cap
 * never holds such a rotation back. At 4, the fifth same-host peer to die within a second kept
 * the in-doubt worker current, and its restarted process's first read waited behind the dead
 * writer's slot until the op timeout (conformance_failure_ucx_shm, test_killed_mid_send, once
 * peer processes started in tens of ms: ucx_rot.c). */
#define CX_UCX_MAX_OLD_WORKERS 20
enum { CX_UCX_DOUBT_GONE = 1 };
#define CX_UCX_HUNG_MAX 16 /* timed-out shared-memory peers remembered (ucx_rot.c) */

/* A shared-memory peer whose op timed out on the current worker (ucx_rot.c, cx_ucx_rx_doubt) */
typedef struct cx_ucx_hung {
    void *peer;    /* the core's cookie: compared, never followed */
    uint32_t gen;  /* the worker it could write into */
    uint8_t *addr; /* its worker address then */
    size_t len;
} cx_ucx_hung_t;
#define CX_UCX_DOUBT_GRACE_MS 1000 /* grace of a retired worker whose FIFO is in doubt */
_Static_assert(CX_UCX_MAX_OLD_WORKERS >= CX_UCX_DOUBT_GRACE_MS / CX_UCX_DOUBT_GAP_MS,
               "the retired-worker cap must not hold back a dead writer's rotation");
#define CX_UCX_UPD_KEEP_MS 10000 /* how long an address update waits for its endpoint */

/* One UCP worker. The current one takes new endpoints and is the address in HELLO; retired ones
 * (rotation, ucx_rot.c) are still progressed until their endpoints are closed and the grace
 * period passed, then destroyed, which frees the endpoints UCX could not (zombies). */
struct cx_ucx_wk {
    cx_ucx_t *b;
    ucp_worker_h w;
    int efd;
    uint32_t gen;       /* 0 for the worker of open, +1 per rotation */
    uint8_t addr[4096]; /* "CUX1" blob: what HELLO advertises */
    size_t addr_len;
    int open_ues;        /* our endpoints on it, not closed yet */
    int zombies;         /* endpoints closed that UCX keeps until the worker goes */
    int retired;         /* of them: ucp_eps of live peers retired by a rotation */
    int rx_doubt;        /* a peer that wrote into its shared-memory receive FIFO was
                                    dropped dead: a slot it reserved may never be filled
                                    (ucx_rot.c) */
    int wedged;          /* CONNEX_UCX_FAULT_WEDGE: no longer progressed (ucx_rot.c) */
    uint64_t retired_ns; /* 0 while current */
    cx_ucx_wk_t *next;   /* b->old list */
};

/* One ucp_ep of a backend endpoint. A bep has its current one (new xfers) and, after a rotation
 * on either side, retiring ones: closed once the xfers posted on them are done. Freed when
 * closed and no op names it any more. */
struct cx_ucx_ue {
    cx_ucx_wk_t *wk;
    struct cx_bep *bep; /* NULL once closed */
    ucp_ep_h ep;
    int peer_mode; /* UCP_ERR_HANDLING_MODE_PEER (else NONE: see ucx_ep.c) */
    char tl[64];   /* its lanes' transports as UCX reports them ("tcp/lo") */
    int sw_rma;    /* UCX would emulate puts and gets there with active messages (cx_ucx_tl_sw_rma) */
    int inflight;  /* ops posted on it and not freed */
    int msgs;      /* message / put_signal ops on it not finished (order) */
    int closed;
    uint64_t retired_ns;                /* when it stopped being the current one */
    cx_ucx_rk_t *rk[CX_UCX_RK_BUCKETS]; /* rkeys are unpacked per ucp_ep */
    cx_ucx_ue_t *next;                  /* the bep's retiring list */
};

/* An address update from a peer (AM id 13), waiting for its endpoint. */
struct cx_ucx_upd {
    uint64_t inc;
    uint32_t gen;
    uint8_t *addr; /* raw ucp address */
    size_t len;
    uint64_t deadline_ns;
    cx_ucx_upd_t *next;
};

/* A small control send (ack, address update) whose buffer UCX holds until it completes; freed
 * by its callback or with its worker (a request to a dead peer never completes). */
struct cx_ucx_ctl {
    cx_ucx_wk_t *wk;
    cx_ucx_ctl_t *next, *prev;
    uint8_t *buf; /* right behind the struct (b->ctl, the sentinel, has none) */
    void *pin;    /* a read answer's region (ucx_read.c): unpinned when freed */
    int refs;     /* sends not completed (1 for one send), freed at 0 */
};

/* The backend's state of one xfer. It outlives the xfer when its endpoint is closed while UCX
 * still holds a request pointing at it (a "zombie", freed by that request's callback). */
struct cx_ucx_op {
    cx_ucx_t *b;
    cx_xfer_t *x;      /* NULL once handed back to the core */
    struct cx_bep *ep; /* NULL once its endpoint is gone */
    cx_ucx_ue_t *ue;   /* the ucp_ep it was posted on (NULL while held) */
    int counted_msg;   /* counted in ue->msgs */
    int stage;         /* CX_UCX_OPS_* */
    int pending;       /* UCX requests whose callback will still name this op */
    int finished;      /* status decided, on the done list or delivered */
    int status;
    int sent, acked, ack_status;
    uint64_t req_id;
    uint8_t hdr[CX_UCX_RREQ_HDR_LEN]; /* a message's header, or a read or write request */
    void *msg_copy;                   /* endpoints without error handling: UCX may read it late */
    void *bounce;                     /* same, reads: UCX may write it late (see ucx_xfer.c) */
    size_t bounce_cap;                /* its size (cx_ucx_bounce_get) */
    int copied, copied_rc;            /* a batch's same-host copy already done, and how (ucx_cma.c) */
    cx_rread_t rr; /* windows of a read answered or a write applied by the target (ucx_read.c, ucx_write.c) */
    cx_ucx_op_t *next, *prev; /* endpoint's list, or the done list */
    cx_ack_link_t ack;        /* in the ack table while it waits for the target (req_id) */
};

struct cx_bep {
    cx_ucx_t *b;
    cx_ucx_ue_t *ue;  /* current ucp_ep: new xfers go there */
    cx_ucx_ue_t *old; /* retiring ones (rotation) */
    uint8_t *paddr;   /* the peer's current worker address (raw), for re-creating */
    size_t paddr_len;
    uint32_t peer_gen; /* generation of the last address update applied */
    int held;          /* messages held back until the retiring ones' are done */
    void *peer;
    cx_ucx_op_t ops; /* sentinel: ops started and not finished */
    int failed, err_queued;
    int peer_mode;     /* of the current ue */
    cx_cma_peer_t cma; /* the peer's same-host copies (ucx_cma.c): cma.ok once probed */
    char reason[128];
    int cause;                  /* CX_CAUSE_* of the error (ucx_ep.c) */
    struct cx_bep *next, *prev; /* every endpoint */
    struct cx_bep *err_next;
};

/* A message held at the target: it waits for rendezvous data, for an earlier message of the
 * inbox (order), or for its sender to become known. */
struct cx_ucx_in {
    int kind; /* CX_XFER_MSG or CX_XFER_PUT_SIGNAL */
    uint64_t inc, req_id;
    uint8_t *data;
    size_t len;
    int ready, failed, pending;
    cx_ucx_wk_t *wk; /* the worker receiving its rendezvous data */
    uint64_t deadline_ns;
    cx_ucx_in_t *next;
};

struct cx_ucx {
    cx_core_t *core;
    const struct cx_opts *opts; /* the engine's CONNEX_* table (cx_backend_params_t.opts) */
    uint64_t inc;
    int gpu_direct; /* the plan registers GPU memory with the NIC */
    ucp_context_h ctx;
    cx_ucx_wk_t *cur; /* the current worker */
    cx_ucx_wk_t *old; /* retired workers still alive */
    int n_old;
    int rotate_zombies;     /* CONNEX_UCX_ROTATE_ZOMBIES */
    size_t answer_min;      /* CONNEX_UCX_READ_ANSWER_MIN (ucx_read.c) */
    cx_cma_self_t cma_self; /* what peers copy against (ucx_cma.c) */
    int cma;                /* CONNEX_UCX_CMA: same-host copies offered and used */
    size_t cma_max;         /* CONNEX_UCX_CMA_MAX: larger xfers keep UCX's path */
    uint64_t cma_ops;       /* xfers done by same-host copies */
    int bounce_all;         /* CONNEX_UCX_READ_BOUNCE=1: every host read is a get into a bounce
                                    buffer (else reads without peer error handling: ucx_read.c) */
    uint64_t grace_ns;      /* CONNEX_UCX_ROTATE_GRACE_MS */
    int fault_wedge;        /* CONNEX_UCX_FAULT_WEDGE (tests): a worker in doubt stops being progressed */
    uint64_t rescued;       /* ops moved off retired workers in doubt (cx_ucx_rescue) */
    uint64_t last_rotate_ns;
    uint64_t rotations, zombies_freed;
    int retiring; /* beps with retiring ues or held ops: look at them in progress */
    cx_ucx_hung_t hung[CX_UCX_HUNG_MAX];
    int n_hung;
    cx_ucx_upd_t *upd; /* address updates waiting for their endpoint */
    cx_ucx_ctl_t ctl;  /* sentinel: control sends in flight */
    int epfd, sigfd, tfd;
    int timer_armed, sig_pending;
    uint64_t timer_ns;   /* when the armed timer fires */
    struct cx_bep eps;   /* sentinel */
    struct cx_bep *errq; /* endpoints with a failure to report */
    cx_ucx_op_t done;    /* sentinel: finished ops to hand back */
    cx_ucx_op_t zombies; /* sentinel: delivered ops a UCX request still names */
    cx_acktab_t acks;
    uint64_t next_req_id;
    cx_ucx_in_t *in_head, *in_tail;
    size_t in_n, in_bytes;
    int no_peer_mode;       /* UCX_TLS leaves no transport with peer error handling */
    int depth;              /* inline completions nested in submit */
    int in_batch;           /* inside submit_batch: completions wait for the next turn */
    int closing_ep;         /* inside disconnect: hold messages back */
    cx_objcache_t free_ops; /* ops are allocated per xfer */
    struct {
        void *p;
        size_t cap;
    } bounces[2]; /* read bounce buffers kept for reuse */
};

/* ucx_env.c */
int cx_ucx_config(ucp_config_t *cfg, const cx_backend_params_t *prm, const char *listen_ip);
int cx_ucx_rdma_usable(void);
unsigned long long cx_ucx_opt(const cx_ucx_t *b, const char *name); /* a CONNEX_UCX_* number, parsed at create */

/* ucx_backend.c */
cx_ucx_wk_t *cx_ucx_wk_new(cx_ucx_t *b, uint32_t gen);
void cx_ucx_wk_destroy(cx_ucx_t *b, cx_ucx_wk_t *wk);
void cx_ucx_signal(cx_ucx_t *b); /* make the wait fd readable */
void cx_ucx_drain(cx_ucx_t *b);
uint64_t cx_ucx_now_ns(void);

/* ucx_op.c */
cx_ucx_op_t *cx_ucx_op_new(cx_ucx_t *b, cx_bep_t *ep, cx_xfer_t *x);
void cx_ucx_op_finish(cx_ucx_t *b, cx_ucx_op_t *op, int status);
void cx_ucx_op_release(cx_ucx_t *b, cx_ucx_op_t *op); /* after the core got it back */
/* An op whose xfer the submit hands back (not started, or refused within its post): finished
 * without an xfer, freed now, or kept on the zombie list while a UCX request still names it. */
void cx_ucx_op_drop(cx_ucx_t *b, cx_ucx_op_t *op);
/* In a send callback: frees the request; the op (user) when it still waits for this one, else
 * NULL (it was finished meanwhile, and is freed once no request names it). */
cx_ucx_op_t *cx_ucx_req_done(void *req, void *user);
void cx_ucx_op_deliver(cx_ucx_t *b, cx_ucx_op_t *op);
void cx_ucx_ops_free_cache(cx_ucx_t *b);
/* A bounce buffer of at least len bytes for op (NULL: out of memory), from the two kept for
 * reuse when one is large enough: a fresh malloc of a large one is an mmap, and the read then
 * pays a page fault per 4 KiB on top of the copy (16 MiB ucx_shm read: 1.9 ms against 0.9 raw). */
void *cx_ucx_bounce_get(cx_ucx_t *b, cx_ucx_op_t *op, size_t len);
void cx_ucx_ack_add(cx_ucx_t *b, cx_ucx_op_t *op);
cx_ucx_op_t *cx_ucx_ack_take(cx_ucx_t *b, uint64_t req_id);
cx_ucx_op_t *cx_ucx_ack_find(cx_ucx_t *b, uint64_t req_id); /* leaves it in the table */
int cx_ucx_status(ucs_status_t st);
void cx_ucx_list_del(cx_ucx_op_t *op);
void cx_ucx_list_add(cx_ucx_op_t *head, cx_ucx_op_t *op);

/* ucx_xfer.c */
int cx_ucx_submit(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *x);
void cx_ucx_submit_batch(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
void cx_ucx_am_sent_cb(void *req, ucs_status_t st, void *user); /* a message or request left */
/* Sends the message of a MSG or PUT_SIGNAL op; the ack handler finishes it. */
void cx_ucx_send_am(cx_ucx_t *b, cx_ucx_op_t *op);
/* A message or a write's window is both sent and acked: finish the op or go on. */
void cx_ucx_acked(cx_ucx_t *b, cx_ucx_op_t *op);
/* A send's parameters: with cb, cb(req, status, user) at completion; with x, the local buffer's
 * memory handle and type. */
void cx_ucx_param(ucp_request_param_t *p, void *user, ucp_send_nbx_callback_t cb, const cx_xfer_t *x);

/* ucx_read.c: reads answered by the target, on endpoints without peer error handling */
void cx_ucx_read_send(cx_ucx_t *b, cx_ucx_op_t *op);
int cx_ucx_read_am_init(cx_ucx_wk_t *wk, ucp_am_handler_param_t *p);

/* ucx_write.c: writes applied by the target, on lanes where UCX would emulate the put */
void cx_ucx_write_send(cx_ucx_t *b, cx_ucx_op_t *op);
void cx_ucx_write_acked(cx_ucx_t *b, cx_ucx_op_t *op);
int cx_ucx_write_am_init(cx_ucx_wk_t *wk, ucp_am_handler_param_t *p);

/* ucx_mem.c */
int cx_ucx_mem_reg(cx_backend_t *bb, void *addr, size_t len, int mem_kind, void **mh, void *key, size_t *key_len);
void cx_ucx_mem_dereg(cx_backend_t *bb, void *mh);
/* ucx_gdr.c: GPU registration abilities (the core decides GPUDirect from them) */
void cx_ucx_gpu_caps(cx_backend_t *bb, cx_backend_gpu_caps_t *caps);
/* The unpacked rkey of x's region on `ue`; *rec (may be NULL): its record (host memory, range). */
int cx_ucx_rkey_get(cx_ucx_ue_t *ue, const cx_xfer_t *x, ucp_rkey_h *out, const cx_ucx_rk_t **rec);
void cx_ucx_forget_region(cx_backend_t *bb, cx_bep_t *ep, uint64_t region_id);
void cx_ucx_rkeys_drop(cx_ucx_ue_t *ue);

/* ucx_ep.c */
int cx_ucx_connect(cx_backend_t *bb, void *peer, const void *addr, size_t addr_len, cx_bep_t **out);
void cx_ucx_disconnect(cx_backend_t *bb, cx_bep_t *ep, int why);
cx_bep_t *cx_ucx_ep_of_peer(cx_ucx_t *b, void *peer);
cx_ucx_ue_t *cx_ucx_ue_new(cx_ucx_t *b, cx_bep_t *ep, const void *addr, size_t len, int *rc);
void cx_ucx_ue_close(cx_ucx_t *b, cx_ucx_ue_t *ue, int force);
int cx_ucx_tl_sw_rma(const char *tl);
void cx_ucx_ue_unref(cx_ucx_ue_t *ue); /* an op stopped naming it */
void cx_ucx_ep_transport(cx_backend_t *bb, cx_bep_t *ep, char *buf, size_t n);

/* Same-host copies (ucx_cma.c) */
void cx_ucx_cma_open(cx_ucx_t *b);
void cx_ucx_cma_advertise(cx_ucx_t *b, cx_wr_t *w);
void cx_ucx_cma_connect(cx_ucx_t *b, cx_bep_t *ep, const uint8_t *adv);
int cx_ucx_cma_takes(cx_ucx_t *b, const cx_bep_t *ep, const cx_xfer_t *x, const cx_ucx_rk_t *rec);
int cx_ucx_cma_copy(cx_ucx_t *b, cx_bep_t *ep, const cx_xfer_t *x, const cx_ucx_rk_t *rec);
/* A batch's reads and writes that same-host copies take, copied now, many per system call:
 * rcs[i] is set to the copy's status for those, left alone for the others. */
void cx_ucx_cma_batch(cx_ucx_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
/* cx_ucx_submit for an xfer the batch may have copied already (`copied`: its status, or
 * CX_UCX_NOT_COPIED) */
#define CX_UCX_NOT_COPIED 1
int cx_ucx_submit_copied(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *x, int copied);
/* The transports of a ucp_ep's lanes, from UCX's own description of it ("tcp/lo",
 * "posix/memory,cma/memory"), deduplicated, in lane order. Pure: parses that text. */
void cx_ucx_lanes_parse(const char *info, char *buf, size_t n);

/* ucx_xfer.c */
void cx_ucx_start_held(cx_ucx_t *b, cx_bep_t *ep);
void cx_ucx_start_moved(cx_ucx_t *b, cx_bep_t *ep); /* posts its CX_UCX_OPS_MOVED ops again, in order */

/* ucx_rot.c: worker rotation */
void cx_ucx_rot_init(cx_ucx_t *b);
void cx_ucx_rot_tick(cx_ucx_t *b);                                               /* from progress, after the drain */
void cx_ucx_rx_doubt(cx_ucx_t *b, const cx_bep_t *ep, int why);                  /* from disconnect */
void cx_ucx_hung_connect(cx_ucx_t *b, void *peer, const void *addr, size_t len); /* from connect */
void cx_ucx_hung_free(cx_ucx_t *b);
void cx_ucx_wk_doubt(cx_ucx_t *b, cx_ucx_wk_t *wk); /* its receive FIFO is in doubt */
void cx_ucx_zombie(cx_ucx_t *b, cx_ucx_wk_t *wk, int retired);
int cx_ucx_retarget(cx_ucx_t *b, cx_bep_t *ep); /* new ue on the current worker */
int cx_ucx_send_update(cx_ucx_t *b, cx_ucx_ue_t *ue);
void cx_ucx_upd_take(cx_ucx_t *b, void *peer, cx_bep_t *ep); /* at connect */
void cx_ucx_upd_drain(cx_ucx_t *b);
void cx_ucx_upd_free(cx_ucx_t *b);
cx_ucx_ctl_t *cx_ucx_ctl_new(cx_ucx_t *b, cx_ucx_wk_t *wk, size_t len);
void cx_ucx_ctl_free(cx_ucx_ctl_t *c);
void cx_ucx_ctl_unref(cx_ucx_ctl_t *c); /* a send of it completed: freed at the last */
void cx_ucx_ctl_send_cb(void *req, ucs_status_t st, void *user);

/* ucx_log.c: UCX's log lines into connex's log (once per process) */
void cx_ucx_log_route(void);

/* ucx_am.c */
int cx_ucx_am_init(cx_ucx_wk_t *wk);
ucs_status_t cx_ucx_am_upd(void *arg, const void *hdr, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *prm); /* ucx_rot.c */
void cx_ucx_inbox_drain(cx_ucx_t *b);
void cx_ucx_arm_timer(cx_ucx_t *b, long ms); /* one-shot wakeup of the wait fd */
void cx_ucx_inbox_free(cx_ucx_t *b);
int cx_ucx_send_ack(cx_ucx_t *b, cx_ucx_wk_t *wk, ucp_ep_h ep, uint64_t req_id, int status);
/* The endpoint to answer a request AM on (a read or a write served here); NULL, logged and
 * counted as a refused `kind`, when it came without one. */
ucp_ep_h cx_ucx_reply_ep(cx_ucx_t *b, const ucp_am_recv_param_t *prm, int kind, uint64_t req_id, const char *what);

#endif
