/* Internals of the libfabric backend, shared by its files only. */
#ifndef CX_FI_INT_H
#define CX_FI_INT_H

#include "connex/backend.h"
#include "util/acktab.h"
#include "util/objcache.h"
#include "util/cma.h"
#include "util/rread.h"
#include "fi_wire.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

/* 1.17 is what Debian 12 ships; every call used here exists since 1.5, so asking for 1.17 only
 * makes libfabric reject older libraries explicitly instead of failing in odd places. */
#define CX_FI_API_VERSION FI_VERSION(1, 17)

/* fi_dl.c: libfabric is dlopen'ed at the backend's first open, not linked (its PSM
 * dependencies cost every process 200 ms at load). The five functions it exports that the backend
 * calls; every other fi_* call is inline through the fid's ops table. cx_fi_lib_load: CX_OK, or
 * CX_EUNSUPPORTED (logged once) where the library cannot be loaded. */
int cx_fi_lib_load(void);
int cx_fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
                  struct fi_info **info);
void cx_fi_freeinfo(struct fi_info *info);
struct fi_info *cx_fi_dupinfo(const struct fi_info *info);
int cx_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
const char *cx_fi_strerror(int errnum);

#define CX_FI_BUF 65536u  /* eager buffer: messages up to this (with header) go inline */
#define CX_FI_NRX 32      /* receive buffers kept posted */
#define CX_FI_NTX 64      /* send buffers (messages, acks, rendezvous headers) */
#define CX_FI_OP_CACHE 64 /* freed ops kept for reuse */
/* Per peer: what one peer may hold of the shared resources, so that a peer that stops reading
 * (SIGSTOP, a hung host) cannot take them all from the others until its op timeout. */
#define CX_FI_EP_POSTED_MAX 256         /* ops posted to the provider (rxm's tx queue is 2048) */
#define CX_FI_EP_TX_MAX (CX_FI_NTX / 2) /* send buffers of our pool */
/* CX_FI_ADDR_VERSION, CX_FI_KEY_*, the message header (CX_FM_*): fi_wire.h */

enum { CX_FI_CTX_OP = 1, CX_FI_CTX_RX = 2, CX_FI_CTX_WARM = 3, CX_FI_CTX_VENT = 4 };
#define CX_FI_VEC_MAX 64 /* xfers of one vector op (fi_vec.c) */

/* What each posted fi_* call carries as its context: providers may need FI_CONTEXT2 space. */
typedef struct cx_fi_ctx {
    struct fi_context2 fc; /* must stay first: the provider owns it while posted */
    int type;              /* CX_FI_CTX_* */
} cx_fi_ctx_t;

typedef struct cx_fi_rx {
    cx_fi_ctx_t c;
    uint8_t *buf;
    int posted;   /* the provider owns it (until its CQ entry) */
    uint32_t gen; /* posted on the endpoint of this rotation (fi_rot.c) */
} cx_fi_rx_t;

enum { CX_FI_RREQ_WB = 1, CX_FI_RREQ_IN = 2 }; /* cx_fi_op.rreq */

enum {
    CX_FOP_READ = 1, /* fi_read for the core */
    CX_FOP_WRITE,    /* fi_write for the core */
    CX_FOP_PSWRITE,  /* put_signal, phase 1: the write, delivery-complete */
    CX_FOP_SEND,     /* MSG, or put_signal phase 2: header (+ payload or rendezvous) */
    CX_FOP_ACK,      /* target: the ack of a message (no xfer) */
    CX_FOP_PULL,     /* target: fi_read of a large message from its sender (no xfer) */
    CX_FOP_WBACK,    /* target of a write-back read: the write into the reader's buffer */
    CX_FOP_VEC,      /* a batch's reads and writes to one endpoint, each posted alone (fi_vec.c) */
    CX_FOP_RLIST     /* the one request of a batch's small reads to one endpoint (fi_list.c) */
};

struct cx_fi_op;
/* One xfer of a vector op, posted with this as its context. */
typedef struct cx_fi_vent {
    cx_fi_ctx_t c; /* first: the provider owns it while posted */
    struct cx_fi_op *op;
    cx_xfer_t *x; /* NULL once completed to the core */
    int posted;
} cx_fi_vent_t;

typedef struct cx_fi_op {
    cx_fi_ctx_t c;
    int kind;     /* CX_FOP_* */
    int posted;   /* the provider owns c.fc until its CQ entry */
    uint32_t gen; /* posted on the endpoint of this rotation (fi_rot.c) */
    int in_backlog;
    int send_done, ack_got, ack_status;
    cx_xfer_t *x;      /* NULL once completed to the core (or for ACK/PULL) */
    struct cx_bep *ep; /* NULL once the endpoint was disconnected */
    uint64_t seq;      /* SEND: matched by the target's ack */
    int txi;           /* send buffer index, -1 none */
    size_t txlen;
    struct fid_mr *tmp_mr; /* rendezvous: the message (sender) or landing buffer (target) */
    uint8_t *tmp_buf;      /* PULL: landing buffer */
    /* PULL / ACK: what the target answers */
    void *peer;
    uint8_t mtype; /* PULL: MSG or SIG; ACK: ACK, or RDATA with wb_src's r_len bytes
                                   at offset r_addr of the read */
    uint8_t raw;   /* RDATA: headerless, its header in the send's CQ data (CX_FI_CQD_RDATA) */
    uint64_t ack_seq;
    int32_t ack_val;
    uint64_t r_addr, r_key;
    size_t r_len;
    int rreq;                       /* SEND: a read request on tcp (fi_wb.c), x is the read:
                                   CX_FI_RREQ_WB or CX_FI_RREQ_IN */
    cx_rread_t rr;                  /* RREQ_IN: the answer, one window of the whole read */
    const void *wb_src;             /* WBACK, RDATA: the bytes sent (in a pinned region, or tmp_buf) */
    void *wb_pin;                   /* WBACK, RDATA: the core's pin on the source region */
    struct cx_fi_op *enext, *eprev; /* ep's list */
    struct cx_fi_op *qnext;         /* backlog */
    cx_ack_link_t ack;              /* in the ack table while it waits (seq) */
    struct cx_fi_op *anext, *aprev; /* every op alive */
    /* VEC: its xfers' contexts (nvent of them); `posted` counts those the provider owns, vleft
     * those not completed to the core. Freed once both are 0. */
    cx_fi_vent_t *vent;
    uint32_t nvent, vleft;
    /* RLIST: the small reads its one send asks for (nmem slots, NULL once one was freed); a read
     * of it points back through `carrier` until the list's send completes. */
    struct cx_fi_op **mem;
    uint32_t nmem;
    struct cx_fi_op *carrier;
    uint16_t hflags; /* ACK: header flags besides those every message carries (CX_FM_F_ECHO) */
} cx_fi_op_t;

struct cx_bep {
    struct cx_backend *b;
    void *peer;
    fi_addr_t fa;
    int used;                /* an op was posted: rxm has (or is making) a connection */
    int tried;               /* a post was tried (shm: the provider may have sent our name: fi_shm.c) */
    int exit_fd;             /* shm: the core's fd for the peer's exit (cx_fi_peer_dead), or -1 */
    int dead;                /* shm: seen dead at a post; reported at the next progress */
    unsigned pid_posts;      /* shm: posts, its exit fd looked at every CX_FI_PID_POSTS */
    char shm_name[64];       /* shm: the peer's region, unlinked once it is dead (fi_shm.c) */
    uint32_t pid;            /* shm: the process its region names carry (fi_rot.c), 0 unknown */
    uint32_t peer_gen;       /* shm: the rotation of the peer's endpoint we post to (fi_rot.c) */
    const int *lockw;        /* shm: its region's spinlock, in the guard's mapping, or NULL */
    struct sockaddr_un bell; /* shm: the peer's doorbell (fi_bell.c) */
    socklen_t bell_len;      /* 0: none to ring */
    unsigned bell_posts;     /* direct RMA posts since its bell was last rung */
    int nq;                  /* its ops waiting in the backlog: later ops queue behind them */
    int lists;               /* the peer serves RLIST: it said so (CX_FM_F_LISTS, fi_list.c) */
    cx_cma_peer_t cma;       /* shm: the peer's same-host copies (fi_cma.c): cma.ok once probed */
    int cma_heard;           /* its offer came (probed, whatever the outcome): not asked again */
    int cma_asked;           /* we asked for it (at our first read or write to it) */
    int nops;                /* ops linked in ops (cheap bound before counting them) */
    uint64_t q_blocked;      /* backlog pass in which its head op got -FI_EAGAIN */
    cx_fi_op_t *ops;         /* ops of this endpoint not yet completed */
    struct cx_bep *next, *prev;
    /* A hub's endpoint (fi_rail.c): one endpoint per rail both sides have. */
    int nrails;
    struct cx_bep *rail[CX_FI_RAILS_MAX];
    struct cx_fi_grp *fault; /* a stripe failed by CONNEX_FI_FAULT_RAIL, reported at progress */
    int fault_i;
};

typedef struct cx_fi_mh {
    struct fid_mr *mr;
    void *desc;
    uint64_t base;
} cx_fi_mh_t;

/* fi_rot.c: the newest endpoint a same-host peer told us of (by the process and engine
 * incarnation its region's name carries), for a connect that still has its older HELLO. */
#define CX_FI_MOVED 32
typedef struct cx_fi_moved {
    uint32_t pid;
    uint64_t inc;
    uint32_t gen;
    uint64_t at_ns; /* when it came: the oldest is replaced first */
    char name[64];
} cx_fi_moved_t;

/* fi_shm.c: a closed endpoint's peer whose region is unlinked once the process is gone. */
#define CX_FI_SHM_WAITS 32
#define CX_FI_AV_LATER 64               /* shm peers' addresses waiting for their removal */
#define CX_FI_AV_LATER_NS 1000000000ull /* how long a dropped shm peer stays in the AV */
#define CX_FI_AV_HELD 32                /* shm slots kept out of reuse (fi_shm.c, cx_fi_av_hold) */
#define CX_FI_PARKED 64                 /* requests held for an endpoint (fi_cq.c, cx_fi_park) */
#define CX_FI_PARKED_NS 1000000000ull   /* how long one waits for it */

typedef struct cx_fi_parked {
    void *peer; /* the core's cookie when it came: compared, never followed */
    uint64_t until_ns;
    size_t len;
    uint8_t *buf; /* the message as received */
} cx_fi_parked_t;
typedef struct cx_fi_shm_wait {
    int exit_fd; /* the core's (cx_core_peer_exit_fd) */
    uint64_t until_ns;
    char name[64];
} cx_fi_shm_wait_t;

struct cx_fi_hub;
struct cx_backend {
    cx_core_t *core;
    const struct cx_opts *opts; /* the engine's CONNEX_* table (cx_backend_params_t.opts) */
    struct cx_fi_hub *hub;      /* set: this instance is a hub of rails, nothing below is open */
    struct cx_backend *owner;   /* a rail: its hub (every xfer it is given is a stripe) */
    int rail_idx;
    uint64_t inc;
    char prov[64];
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_av *av;
    struct fid_cq *cq;
    int cq_fd;             /* the CQ's wait fd, -1 when the provider has none */
    int efd;               /* epoll fd handed to the core: cq_fd + evfd */
    int evfd;              /* "call progress again" (backlog, failed trywait) */
    int tfd;               /* polling tick, only without a CQ wait fd */
    int qfd;               /* one-shot retry tick while the backlog is stuck (fi_cq.c) */
    int kicked, q_armed;   /* evfd written, qfd set, since progress() last read them: a read
                              of each at every progress() was two syscalls per call */
    uint64_t q_due_ns;     /* when the set qfd fires: no read of it before (a syscall a call
                              for the whole sweep window after a connect) */
    cx_fi_ctx_t warm_ctx;  /* the send to ourselves at open (fi_warm.c) */
    int warm_txi;          /* its send buffer until its completion, -1 none */
    int busy_poll;         /* CONNEX_FI_POLL_US=0 */
    uint64_t hot_until_ns; /* poll continuously until then (recent traffic) */
    int bell_fd;           /* shm: our doorbell, in efd, or -1 (fi_bell.c) */
    int unrung;            /* shm: a message came from a sender that does not ring */
    long poll_us;          /* shm: CONNEX_FI_POLL_US, the tick while a peer cannot ring */
    int tick_slow;         /* shm: every peer rings: the tick is CX_FI_BELL_TICK_US */
    unsigned bell_every;   /* shm: direct RMA posts to a peer between rings (fi_bell.c) */
    uint64_t mr_mode;
    int hmem;
    uint64_t next_key; /* requested keys must be unique when the provider picks none */
    size_t max_msg;
    uint8_t addr[512];
    size_t addr_len;

    uint8_t *rxmem;
    struct fid_mr *rxmr;
    cx_fi_rx_t rx[CX_FI_NRX];

    uint8_t *txmem;
    struct fid_mr *txmr;
    int txfree[CX_FI_NTX];
    int ntxfree;

    uint64_t next_seq;
    cx_acktab_t acks;
    cx_fi_op_t *qhead, *qtail; /* backlog: not yet posted; in order per endpoint only */
    uint64_t q_pass;           /* backlog passes, for cx_bep.q_blocked */
    int q_stuck;               /* the last pass posted nothing: every queued endpoint waits */
    int q_lockwait;            /* shm: a post of that pass found its peer's region locked */
    cx_fi_op_t *all;           /* every op alive (provider may still own some) */
    cx_objcache_t op_cache;    /* freed ops for reuse */
    struct cx_bep *eps;
    int wb;                /* reads by write-back (fi_wb.c): tcp, no FI_MR_LOCAL */
    uint32_t prov_version; /* fabric_attr->prov_version: whether tcp's fi_read is safe */
    int shm_direct;        /* shm: every op ends inside its post (fi_shm.c) */
    uint64_t post_more;    /* FI_MORE while submit_batch posts all but its last xfer */
    int more_owed;         /* a post went with FI_MORE and none without it since */
    /* Inside submit_batch: the last key blob decoded, by address (a batch's run shares its
     * region's blob, which the core keeps unchanged during the call), and what it said. */
    const void *kc_blob;
    size_t kc_len;
    cx_fi_key_t kc;
    size_t eager_max;       /* a message with its header up to this goes inline */
    size_t rd_inline;       /* with wb: reads up to this many bytes answered inline */
    size_t rd_part;         /* bytes per RDATA message: rxm's eager limit, less headers */
    size_t rd_raw;          /* bytes per headerless part: rxm's eager limit (0: no 8-byte CQ data) */
    uint64_t rd_sent[2];    /* answer parts sent with a header, headerless (tests) */
    uint64_t rl_sent[2];    /* request lists sent, reads they asked for (tests) */
    uint64_t rl_served;     /* request lists served (tests) */
    cx_cma_self_t cma_self; /* what peers copy against (fi_cma.c) */
    int cma;                /* CONNEX_FI_CMA: same-host copies offered and used (shm) */
    size_t cma_max;         /* larger xfers keep the provider's path */
    uint64_t cma_ops;       /* xfers done by same-host copies (tests) */
    int closing;
    int sweep_now; /* a connection may have been made: sweep descriptors */
    uint64_t next_sweep_ns;
    cx_fi_shm_wait_t shm_wait[CX_FI_SHM_WAITS]; /* fi_shm.c */
    int shm_nwait;
    fi_addr_t av_later[CX_FI_AV_LATER]; /* shm addresses to remove (fi_shm.c) */
    uint64_t av_later_ns[CX_FI_AV_LATER];
    int n_av_later;
    fi_addr_t av_held[CX_FI_AV_HELD];    /* shm addresses never removed: their slot is spoilt (fi_shm.c) */
    cx_fi_parked_t parked[CX_FI_PARKED]; /* requests of peers we hold no endpoint for (fi_cq.c) */
    int n_parked;
    int n_av_held;
    uint64_t shm_next_ns;
    char shm_self[64];         /* our region's name, when fi_setname took it (fi_shm.c) */
    struct cx_fi_guard *guard; /* fi_guard.c, NULL when off */
    const int *self_lockw;     /* shm: our own region's spinlock (the guard's mapping), or NULL */
    int lock_free, lock_held;  /* glibc's values of a free and a held spinlock */
    uint64_t wedged_ns;        /* since when our region's lock stays held, 0 when it does not */
    int wedge_logged;
    uint64_t rot_ns;      /* shm: a new endpoint once our lock is held this long and a peer
                                   process is stopped, 0 never (fi_rot.c) */
    uint64_t rot_any_ns;  /* ... or this long, whoever holds it */
    uint64_t rot_look_ns; /* the next look at the peers' process states */
    uint32_t rot_gen;     /* rotations so far: the endpoint's generation (fi_rot.c) */
    uint64_t rot_next_ns; /* after a failed rotation: not before then */
    int rot_sweep;        /* a rotation's leftovers still to be looked at (fi_cq.c) */
    cx_fi_moved_t moved[CX_FI_MOVED];
    uint64_t sweep_hot_until_ns; /* write-back warm-up: peers dial us right after connect */
    uint64_t last_sweep_ns;
    uint64_t sweep_gap_ns; /* between hot sweeps: doubles from 1 ms after a connect */
};

/* fi_rail.c: multi-rail (README.md, "Multi-rail"). cx_fi_open_rails: CX_OK with *out a hub,
 * or CX_EUNSUPPORTED when fewer than two rails are asked for or open (the caller opens one). */
int cx_fi_open_rails(const cx_backend_params_t *p, cx_backend_t **out);
void cx_fi_hub_sub_done(cx_backend_t *rail, cx_xfer_t *sx, int status);
extern const struct cx_backend_ops cx_fi_single_ops; /* fi_setup.c: one domain */
void cx_fi_prepare(void);                            /* fi_setup.c: libfabric's env defaults */

/* fi_mr.c */
int cx_fi_mr_reg(struct cx_backend *b, void *addr, size_t len, uint64_t access, int mem_kind, struct fid_mr **mr);
int cx_fi_mem_reg(cx_backend_t *b, void *addr, size_t len, int mem_kind, void **mh, void *key, size_t *key_len);
void cx_fi_mem_dereg(cx_backend_t *b, void *mh);
/* Decodes a key blob into (remote address as the provider wants it, key). */
int cx_fi_key_decode(const void *key, size_t key_len, uint64_t remote, uint64_t *raddr, uint64_t *rkey);
/* The blob's key (a multi-rail blob: its first rail's), unchecked against any address. */
int cx_fi_key_parse(const void *key, size_t key_len, cx_fi_key_t *k);

/* fi_xfer.c */
int cx_fi_connect(cx_backend_t *b, void *peer, const void *addr, size_t addr_len, cx_bep_t **ep);
void cx_fi_disconnect(cx_backend_t *b, cx_bep_t *ep, int why);
int cx_fi_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *x);
void cx_fi_submit_batch(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
cx_fi_op_t *cx_fi_op_new(cx_backend_t *b, int kind, cx_xfer_t *x, cx_bep_t *ep);
void cx_fi_op_free(cx_backend_t *b, cx_fi_op_t *op);
void cx_fi_op_finish(cx_backend_t *b, cx_fi_op_t *op, int status);
void cx_fi_ep_unlink(cx_fi_op_t *op); /* off its endpoint's list (no-op when off already) */
/* A post of op failed (r: the negated fi_errno): report the cause, complete and free the op. */
void cx_fi_post_failed(cx_backend_t *b, cx_fi_op_t *op, int r);
int cx_fi_op_post(cx_backend_t *b, cx_fi_op_t *op);
int cx_fi_start(cx_backend_t *b, cx_fi_op_t *op); /* post, or queue on -FI_EAGAIN */
void cx_fi_backlog_add(cx_backend_t *b, cx_fi_op_t *op);
void cx_fi_backlog_run(cx_backend_t *b);
void cx_fi_kick(cx_backend_t *b);
cx_bep_t *cx_fi_ep_by_peer(cx_backend_t *b, void *peer);
void cx_fi_parked_run(cx_backend_t *b, int closing); /* fi_cq.c */
void cx_fi_ack_add(cx_backend_t *b, cx_fi_op_t *op);
cx_fi_op_t *cx_fi_ack_take(cx_backend_t *b, uint64_t seq);
void cx_fi_ack_del(cx_backend_t *b, cx_fi_op_t *op);
cx_fi_op_t *cx_fi_ack_find(cx_backend_t *b, uint64_t seq);

/* fi_vec.c: a batch's reads and writes to one endpoint as one op of ours */
/* Posts from xs on (each xfer with an entry context of one op) while they qualify and the
 * provider takes them; returns how many it took (rcs CX_OK): the caller submits the next alone. */
size_t cx_fi_vec_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
/* A posted entry's completion (its CQ entry, or an abort): returns 1 when its op was freed. */
int cx_fi_vent_done(cx_backend_t *b, cx_fi_vent_t *v, int status);
/* The op's xfers not completed yet are completed with status (its endpoint closes). */
void cx_fi_vec_finish(cx_backend_t *b, cx_fi_op_t *op, int status);
/* Every posted entry of the op ended with status (its endpoint was replaced, fi_rot.c). */
void cx_fi_vec_abort(cx_backend_t *b, cx_fi_op_t *op, int status);
/* The cached key of a batch's run (fi_xfer.c, submit_batch), parsed again when x has another blob. */
int cx_fi_key_cached(cx_backend_t *b, const cx_xfer_t *x, uint64_t *raddr, uint64_t *rkey);
/* Whether x's key blob is the one submit_batch parsed last (valid only inside submit_batch). */
static inline int cx_fi_key_hit(const cx_backend_t *b, const cx_xfer_t *x)
{
    return b->kc_blob && x->rkey == b->kc_blob && x->rkey_len == b->kc_len;
}

/* fi_list.c: a batch's small reads to one endpoint in one request (tcp, with fi_wb.c) */
/* Takes a run of small reads from xs on (at least two) into request lists, rcs CX_OK each;
 * returns how many it took, 0 when xs[0] does not start such a run. */
size_t cx_fi_list_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
int cx_fi_list_write(cx_backend_t *b, cx_fi_op_t *op, cx_wr_t *w); /* the RLIST body, at its post */
/* The list's send ended with status: its reads now wait for their answers alone, or fail. */
void cx_fi_list_sent(cx_backend_t *b, cx_fi_op_t *op, int status);
void cx_fi_list_finish(cx_backend_t *b, cx_fi_op_t *op, int status); /* its reads end with status */
void cx_fi_list_detach(cx_backend_t *b, cx_fi_op_t *op); /* op (a list or one of its reads) is freed: unlink */
void cx_fi_list_serve(cx_backend_t *b, void *peer, uint16_t flags, const uint8_t *body, size_t len);

/* fi_cma.c: same-host copies (shm), the initiator's alone (backends/util/cma.h) */
void cx_fi_cma_open(cx_backend_t *b);
/* The warm-up an endpoint sends at connect (tcp: write-back reads; shm: same-host copies). */
void cx_fi_warm_send(cx_backend_t *b, cx_bep_t *ep, uint16_t flags);
/* A warm-up (bare ack of sequence 0) from incarnation inc: what it says of the peer, answered as
 * it asks (fi_list.c, fi_cma.c). */
void cx_fi_on_warm(cx_backend_t *b, uint64_t inc, uint16_t flags, const uint8_t *adv);
void cx_fi_cma_adv(const cx_backend_t *b, cx_wr_t *w);                   /* our offer */
void cx_fi_cma_heard(cx_backend_t *b, cx_bep_t *ep, const uint8_t *adv); /* the peer's, probed */
/* Done here when x qualifies: 1 with *rc the submit's outcome (CX_OK: already completed). */
int cx_fi_cma_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *x, int *rc);
/* A run of a batch from xs on: how many it took (rcs set; those CX_OK already completed). */
size_t cx_fi_cma_batch(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
/* Inside submit_batch: whether cx_fi_cma_batch would take x (a vector op's run stops before it). */
int cx_fi_cma_wants(cx_backend_t *b, const cx_bep_t *ep, const cx_xfer_t *x);

/* fi_wb.c: reads served by a write from the target (tcp;ofi_rxm, see README "Reads on tcp") */
int cx_fi_wb_choose(cx_backend_t *b);
int cx_fi_tcp_read_fixed(uint32_t prov_version);
int cx_fi_wb_rreq_write(cx_backend_t *b, cx_fi_op_t *op, cx_wr_t *w);
void cx_fi_wb_on_rreq(cx_backend_t *b, void *peer, uint64_t seq, const cx_fi_wbreq_t *q);
/* raw: the reader takes headerless parts (CX_FM_F_RAW) */
void cx_fi_wb_on_rreq_in(cx_backend_t *b, void *peer, uint64_t seq, const cx_fi_wbreq_t *q, int raw);
/* An RDATA body for the read of sequence seq: the bytes copied in, then the op ends as on an ack. */
void cx_fi_wb_on_rdata(cx_backend_t *b, uint64_t seq, const uint8_t *body, size_t len);
/* A headerless part, its CQ data word `data` (CX_FI_CQD_RDATA). */
void cx_fi_wb_on_raw(cx_backend_t *b, uint64_t data, const uint8_t *buf, size_t len);
int cx_fi_wb_preq_write(cx_backend_t *b, cx_fi_op_t *op, cx_wr_t *w);
void cx_fi_wb_on_preq(cx_backend_t *b, void *peer, uint64_t seq, const cx_fi_wbreq_t *q);
int cx_fi_wb_post(cx_backend_t *b, cx_fi_op_t *op);
int cx_fi_write_dc(cx_backend_t *b, cx_fi_op_t *op, const void *src, void *desc, size_t len, uint64_t raddr,
                   uint64_t key);
void cx_fi_wb_done(cx_backend_t *b, cx_fi_op_t *op, int status);

/* fi_setup.c: one RDM endpoint on the backend's CQ and AV, named after (inc, gen) on shm and
 * enabled, with what names it; closed again when any step fails. */
typedef struct cx_fi_epn {
    struct fid_ep *ep;
    char shm[64];      /* shm: its region, when fi_setname took our name, else "" */
    uint8_t name[400]; /* fi_getname */
    size_t name_len;
    uint8_t addr[512]; /* the address blob for HELLO */
    size_t addr_len;
} cx_fi_epn_t;
int cx_fi_ep_open(cx_backend_t *b, uint32_t gen, cx_fi_epn_t *n);

/* fi_rot.c: shm only, a new endpoint (a new region) when a stopped process keeps our region's
 * spinlock, and the peers told of it (README.md, "A new region when one is held"). */
void cx_fi_rot_init(cx_backend_t *b);
int cx_fi_rot_due(cx_backend_t *b, uint64_t now); /* our lock held since b->wedged_ns */
int cx_fi_rotate(cx_backend_t *b);                /* 0: rotated, our endpoint and region are new */
void cx_fi_rot_leftovers(cx_backend_t *b);        /* after the first full drain of a rotation */
void cx_fi_rot_tell(cx_backend_t *b, cx_bep_t *ep);
void cx_fi_rot_on_addr(cx_backend_t *b, uint64_t inc, uint64_t gen, const uint8_t *body, size_t len);
/* At connect: the newest name for the peer of HELLO name `name` (a connex shm name), or name. */
const char *cx_fi_rot_newest(cx_backend_t *b, const char *name, uint32_t *gen);

/* fi_warm.c: ofi_rxm's first-send allocations made at open (a send to ourselves) */
void cx_fi_warm_self(cx_backend_t *b, const void *name);
void cx_fi_warm_done(cx_backend_t *b);

/* fi_fd.c */
int *cx_fi_fd_list(size_t *n);
void cx_fi_fd_cloexec_new(const int *before, size_t nbefore);
void cx_fi_fd_sweep(cx_backend_t *b);

int cx_fi_peer_dead(struct cx_bep *ep);

/* fi_shm.c: shm region names (connex's own, per incarnation), a dead peer's region unlinked,
 * regions of vanished connex processes swept at open. */
int cx_fi_shm_name(cx_backend_t *b, struct fid_ep *ep, uint32_t gen, char name[64]);
/* A connex region name "cx-fi-<pid>-<inc>[-<gen>]": 0, or -1 for any other name. */
int cx_fi_shm_parse(const char *name, uint32_t *pid, uint64_t *inc, uint32_t *gen);
int cx_fi_shm_direct(cx_backend_t *b);
/* fi_bell.c: shm doorbells. Open after the wait fd's epoll set exists; the peer's from the pid
 * and incarnation its region's name carries; rung after a post the peer must serve; drained by
 * progress(). */
void cx_fi_bell_open(cx_backend_t *b);
void cx_fi_bell_close(cx_backend_t *b);
void cx_fi_bell_peer(struct cx_bep *ep, uint32_t pid, uint64_t inc);
void cx_fi_bell_ring(cx_backend_t *b, struct cx_bep *ep);
/* n direct RMA posts to ep: each leaves a command in the peer's queue (fi_bell.c). */
void cx_fi_bell_posted(cx_backend_t *b, struct cx_bep *ep, unsigned n);
int cx_fi_bell_rings(const struct cx_bep *ep);
void cx_fi_bell_drain(cx_backend_t *b);
/* The polling tick: CONNEX_FI_POLL_US while a peer cannot ring our bell or we cannot ring its,
 * else CX_FI_BELL_TICK_US, a safety net for a ring lost to a lack of memory. */
#define CX_FI_BELL_TICK_US 10000
void cx_fi_bell_tick(cx_backend_t *b);
void cx_fi_shm_remember(struct cx_bep *ep, const void *name, size_t len);
void cx_fi_shm_reap(struct cx_bep *ep);
void cx_fi_shm_progress(cx_backend_t *b, int closing);
/* shm: remove a dropped peer's address from the AV only after a grace (see fi_shm.c); a later
 * insert that gets the same address back cancels it. */
void cx_fi_av_remove_later(cx_backend_t *b, fi_addr_t fa);
void cx_fi_av_later_cancel(cx_backend_t *b, fi_addr_t fa); /* held ones as well */
void cx_fi_av_hold(cx_backend_t *b, fi_addr_t fa);
void cx_fi_av_later_run(cx_backend_t *b, int closing);
/* fi_guard.c: spinlocks of shm regions left held by a killed process, released once it exited. */
void cx_fi_guard_start(cx_backend_t *b, const char *self_name);
/* Our own region is `name` from now on (a rotation): its lock word, or NULL (guard unchanged). */
const int *cx_fi_guard_self(cx_backend_t *b, const char *name);
/* Guards the region `name` of the peer whose endpoint is id, until exit_fd (the core's
 * cx_core_peer_exit_fd, now the guard's: closed here on failure) turns readable. */
const int *cx_fi_guard_add(cx_backend_t *b, const void *id, int exit_fd, const char *name);
void cx_fi_guard_del(cx_backend_t *b, const void *id);
void cx_fi_guard_stop(cx_backend_t *b);
/* Whether a region's spinlock (lockw: NULL without the guard) is held beyond a live holder's
 * critical section. The provider spins on it for as long as its holder keeps it, and a process
 * stopped inside one (SIGSTOP, a debugger, a frozen cgroup) keeps it until it is continued:
 * rather than enter the provider then, the CQ read is put off and a post waits in the backlog,
 * so heartbeats, op timeouts and the other backends go on (README.md, "Spinlocks of stopped
 * processes"). */
int cx_fi_lock_wait(const cx_backend_t *b, const int *lockw);
/* A trylock with glibc's values of a free and a held spinlock: 1 if it was free (and is again). */
static inline int cx_fi_lock_try(int *w, int free_v, int held_v)
{
    int want = free_v;
    if (!__atomic_compare_exchange_n(w, &want, held_v, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return 0;
    __atomic_store_n(w, free_v, __ATOMIC_RELEASE);
    return 1;
}
static inline int cx_fi_lock_held(const cx_backend_t *b, const int *lockw)
{
    if (!lockw) return 0;
    /* Taken and let go at once rather than read: the provider takes it right after, and finds
     * the cache line already ours (a plain read cost 0.05 us per 4 KiB op, this does not). */
    if (cx_fi_lock_try((int *)(uintptr_t)lockw, b->lock_free, b->lock_held)) return 0;
    return cx_fi_lock_wait(b, lockw);
}
uint64_t cx_fi_now_ns(void); /* fi_cq.c: CLOCK_MONOTONIC */
void cx_fi_gpu_caps(
    cx_backend_t *b,
    cx_backend_gpu_caps_t
        *caps); /* fi_rail.c: multi-rail (README.md, "Multi-rail"). cx_fi_open_rails: CX_OK with *out a hub,
 * or CX_EUNSUPPORTED when fewer than two rails are asked for or open (the caller opens one). */
int cx_fi_open_rails(const cx_backend_params_t *p, cx_backend_t **out);
void cx_fi_hub_sub_done(cx_backend_t *rail, cx_xfer_t *sx, int status);
extern const struct cx_backend_ops cx_fi_single_ops; /* fi_setup.c: one domain */
void cx_fi_prepare(void);                            /* fi_setup.c: libfabric's env defaults */

/* fi_mr.c */
void cx_fi_report_dead(cx_backend_t *b);

/* fi_cq.c */
int cx_fi_progress(cx_backend_t *b);
int cx_fi_poll(cx_backend_t *b);
void cx_fi_on_ack(cx_backend_t *b, uint64_t seq, int32_t status); /* the target's answer to seq */
int cx_fi_rx_post(cx_backend_t *b, cx_fi_rx_t *rx);
/* A posted op's end: its CQ entry, an error entry, or (fi_rot.c) its endpoint closed. */
void cx_fi_op_done(cx_backend_t *b, cx_fi_op_t *op, int status);
int cx_fi_tx_get(cx_backend_t *b);
void cx_fi_tx_put(cx_backend_t *b, int i);
static inline uint8_t *cx_fi_tx_buf(cx_backend_t *b, int i)
{
    return b->txmem + (size_t)i * CX_FI_BUF;
}

#endif
