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
#include "connex/log.h"
#include "connex/wire.h"
#include "ucx_wire.h"

#include <stdint.h>
#include <ucp/api/ucp.h>

/* wire formats (magics, AM ids, header encoders and decoders): ucx_wire.h */

#define CX_UCX_RK_BUCKETS 32
#define CX_UCX_ACK_BUCKETS 256
#define CX_UCX_INBOX_MAX 1024            /* messages held back at the target */
#define CX_UCX_INBOX_BYTES (256ull << 20)
#define CX_UCX_PARK_MS 2000              /* how long a message from an unknown sender waits */
#define CX_UCX_CLOSE_MS 2000             /* bound on waiting for a forced close */

typedef struct cx_ucx cx_ucx_t;
typedef struct cx_ucx_op cx_ucx_op_t;
typedef struct cx_ucx_in cx_ucx_in_t;

typedef struct cx_ucx_rk {   /* a peer region's unpacked rkey, per endpoint */
    uint64_t region_id;
    ucp_rkey_h rk;
    struct cx_ucx_rk *next;
} cx_ucx_rk_t;

enum { CX_UCX_OPS_RMA = 0, CX_UCX_OPS_FLUSH, CX_UCX_OPS_AM };

/* The backend's state of one xfer. It outlives the xfer when its endpoint is closed while UCX
 * still holds a request pointing at it (a "zombie", freed by that request's callback). */
struct cx_ucx_op {
    cx_ucx_t *b;
    cx_xfer_t *x;            /* NULL once handed back to the core */
    struct cx_bep *ep;       /* NULL once its endpoint is gone */
    int stage;               /* CX_UCX_OPS_* */
    int pending;             /* UCX requests whose callback will still name this op */
    int finished;            /* status decided, on the done list or delivered */
    int status;
    int sent, acked, ack_status, in_acks;
    uint64_t req_id;
    uint8_t hdr[CX_UCX_MSG_HDR_LEN];
    void *msg_copy;             /* endpoints without error handling: UCX may read it late */
    void *bounce;               /* same, reads: UCX may write it late (see ucx_xfer.c) */
    cx_ucx_op_t *next, *prev;   /* endpoint's list, or the done list */
    cx_ucx_op_t *hnext;         /* ack table chain */
};

struct cx_bep {
    cx_ucx_t *b;
    ucp_ep_h ep;
    void *peer;
    cx_ucx_op_t ops;             /* sentinel: ops started and not finished */
    cx_ucx_rk_t *rk[CX_UCX_RK_BUCKETS];
    int failed, err_queued;
    int peer_mode;               /* UCP_ERR_HANDLING_MODE_PEER (else NONE: see ucx_ep.c) */
    char reason[128];
    struct cx_bep *next, *prev;  /* every endpoint */
    struct cx_bep *err_next;
};

/* A message held at the target: it waits for rendezvous data, for an earlier message of the
 * inbox (order), or for its sender to become known. */
struct cx_ucx_in {
    int kind;                /* CX_XFER_MSG or CX_XFER_PUT_SIGNAL */
    uint64_t inc, req_id;
    uint8_t *data;
    size_t len;
    int ready, failed, pending;
    uint64_t deadline_ns;
    cx_ucx_in_t *next;
};

struct cx_ucx {
    cx_core_t *core;
    uint64_t inc;
    ucp_context_h ctx;
    ucp_worker_h w;
    int efd, epfd, sigfd, tfd;
    int timer_armed, sig_pending;
    uint8_t addr[4096];
    size_t addr_len;
    struct cx_bep eps;           /* sentinel */
    struct cx_bep *errq;         /* endpoints with a failure to report */
    cx_ucx_op_t done;            /* sentinel: finished ops to hand back */
    cx_ucx_op_t zombies;         /* sentinel: delivered ops a UCX request still names */
    cx_ucx_op_t *acks[CX_UCX_ACK_BUCKETS];
    uint64_t next_req_id;
    cx_ucx_in_t *in_head, *in_tail;
    size_t in_n, in_bytes;
    int no_peer_mode;            /* UCX_TLS leaves no transport with peer error handling */
    int depth;                   /* inline completions nested in submit */
    int closing_ep;              /* inside disconnect: hold messages back */
    cx_ucx_op_t *free_ops;       /* small cache: ops are allocated per xfer */
    int nfree;
};

/* ucx_env.c */
int cx_ucx_config(ucp_config_t *cfg);
int cx_ucx_rdma_usable(void);

/* ucx_backend.c */
void cx_ucx_signal(cx_ucx_t *b);                 /* make the wait fd readable */
void cx_ucx_drain(cx_ucx_t *b);
uint64_t cx_ucx_now_ns(void);

/* ucx_op.c */
cx_ucx_op_t *cx_ucx_op_new(cx_ucx_t *b, cx_bep_t *ep, cx_xfer_t *x);
void cx_ucx_op_finish(cx_ucx_t *b, cx_ucx_op_t *op, int status);
void cx_ucx_op_release(cx_ucx_t *b, cx_ucx_op_t *op);   /* after the core got it back */
void cx_ucx_op_deliver(cx_ucx_t *b, cx_ucx_op_t *op);
void cx_ucx_ops_free_cache(cx_ucx_t *b);
void cx_ucx_ack_add(cx_ucx_t *b, cx_ucx_op_t *op);
cx_ucx_op_t *cx_ucx_ack_take(cx_ucx_t *b, uint64_t req_id);
int cx_ucx_status(ucs_status_t st);
void cx_ucx_list_del(cx_ucx_op_t *op);
void cx_ucx_list_add(cx_ucx_op_t *head, cx_ucx_op_t *op);

/* ucx_xfer.c */
int cx_ucx_submit(cx_backend_t *bb, cx_bep_t *ep, cx_xfer_t *x);

/* ucx_mem.c */
int cx_ucx_mem_reg(cx_backend_t *bb, void *addr, size_t len, int mem_kind, void **mh,
                   void *key, size_t *key_len);
void cx_ucx_mem_dereg(cx_backend_t *bb, void *mh);
/* ucx_gdr.c: GPU registration abilities (the core decides GPUDirect from them) */
void cx_ucx_gpu_caps(cx_backend_t *bb, cx_backend_gpu_caps_t *caps);
int cx_ucx_rkey_get(cx_bep_t *ep, const cx_xfer_t *x, ucp_rkey_h *out);
void cx_ucx_forget_region(cx_backend_t *bb, cx_bep_t *ep, uint64_t region_id);
void cx_ucx_rkeys_drop(cx_bep_t *ep);

/* ucx_ep.c */
int cx_ucx_connect(cx_backend_t *bb, void *peer, const void *addr, size_t addr_len,
                   cx_bep_t **out);
void cx_ucx_disconnect(cx_backend_t *bb, cx_bep_t *ep);
cx_bep_t *cx_ucx_ep_of_peer(cx_ucx_t *b, void *peer);

/* ucx_log.c: UCX's log lines into connex's log (once per process) */
void cx_ucx_log_route(void);

/* ucx_am.c */
int cx_ucx_am_init(cx_ucx_t *b);
void cx_ucx_inbox_drain(cx_ucx_t *b);
void cx_ucx_arm_timer(cx_ucx_t *b, long ms);   /* one-shot wakeup of the wait fd */
void cx_ucx_inbox_free(cx_ucx_t *b);
int cx_ucx_send_ack(cx_ucx_t *b, ucp_ep_h ep, uint64_t req_id, int status);

#endif
