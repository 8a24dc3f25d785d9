/* The backend vtable: what a data-path backend implements and what the core offers it.
 *
 * A backend moves bytes and reports what it sees; it never decides what a failure means (it calls
 * cx_core_peer_error with the cause it saw, and the core decides what that means for the peer). Every function of the ops table and every cx_core_*
 * call below runs under the engine's transport lock: on the progress thread, or on a caller's
 * thread that drives the transports while the progress thread sleeps (core/src/drive.h). One
 * thread at a time, never concurrently; a backend keeps no thread-local state across calls.
 */
#ifndef CONNEX_BACKEND_H
#define CONNEX_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "connex/connex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cx_core cx_core_t;       /* the engine as a backend sees it */
typedef struct cx_backend cx_backend_t; /* a backend instance, the backend's own struct */
typedef struct cx_bep cx_bep_t;         /* a backend endpoint to one peer incarnation */
struct cx_opts;                         /* the CONNEX_* variables, parsed (connex/options.h) */

/* Memory kinds: CX_MEM_HOST, CX_MEM_CUDA, CX_MEM_SIM (connex.h). */

enum { CX_XFER_READ = 0, CX_XFER_WRITE = 1, CX_XFER_PUT_SIGNAL = 2, CX_XFER_MSG = 3 };

/* One transfer handed to a backend. Owned by the core; valid until cx_core_xfer_done(). */
typedef struct cx_xfer {
    int kind;               /* CX_XFER_* */
    void *local;            /* READ: destination; WRITE/PUT_SIGNAL: source; MSG: unused */
    size_t len;             /* payload bytes (0 only for MSG) */
    void *local_mh;         /* this backend's handle of the local region (from mem_reg) */
    int local_mem;          /* CX_MEM_* of the local buffer */
    uint64_t remote;        /* remote address */
    uint64_t remote_region; /* the peer's id of the region holding it */
    uint64_t remote_base;   /* that region's start address at the peer */
    const void *rkey;       /* this backend's key blob for that region (may be empty) */
    size_t rkey_len;
    const void *msg; /* PUT_SIGNAL and MSG: the message */
    size_t msg_len;
    void *bp[6]; /* backend scratch (list links, request handles, ...) */
    /* The core's, never touched by a backend: set on an entry of a batch's run (core/src/batch.h),
     * an xfer that is not an op of its own; the backend posts and completes it as any other. */
    void *core;
} cx_xfer_t;

/* What a backend can do with GPU memory, for the core's GPUDirect decision (docs/gpu.md). */
typedef struct cx_backend_gpu_caps {
    int rdma;    /* it drives an RDMA NIC (not TCP, not shared memory) */
    int peermem; /* it can register GPU virtual addresses (nvidia_peermem) */
    int dmabuf;  /* it can register GPU memory through a dma-buf fd */
} cx_backend_gpu_caps_t;

typedef struct cx_backend_params {
    cx_core_t *core;
    const char *listen_ip;    /* the engine's listen address (numeric; may be 0.0.0.0 or ::) */
    const char *advertise_ip; /* the address peers are told (numeric, never a wildcard): bind
                                  or advertise it where listen_ip is a wildcard. NULL: listen_ip */
    uint64_t incarnation;     /* this engine's incarnation: put it on the wire so the target can
                                  tell the core who sent a request (cx_core_peer_by_incarnation) */
    /* The CONNEX_* variables as parsed at engine create: a backend reads its own from here
     * (cx_opts_num / cx_opts_str), never from the environment, so a value changed later does
     * not reach it. Never NULL; the table outlives the backend (closed before it is freed), so
     * a backend may keep the pointer. */
    const struct cx_opts *opts;
    /* The selection's plan for this backend (select/, docs/selection.md): what it opens, exactly.
     * NULL or "" where the plan leaves it to the backend (a build without select/). */
    int gpu_direct;          /* 1: GPU memory will be registered directly (docs/gpu.md) */
    const char *provider;    /* libfabric: the provider ("efa", "verbs;ofi_rxm", "tcp;ofi_rxm") */
    const char *domain;      /* libfabric: the domain (NIC) to open ("rdmap16s27-rdm", "mlx5_0") */
    const char *net_devices; /* UCX: the RDMA devices, UCX_NET_DEVICES syntax ("mlx5_0:1,...") */
    int net_devices_exact;   /* 1: net_devices is the user's list: use it as is, add nothing */
    /* libfabric multi-rail: every NIC (domain) to open, comma-separated ("mlx5_0,mlx5_1"): one
     * domain, CQ, AV and endpoint per rail, large transfers striped over them. NULL or a single
     * name: the one `domain` above. */
    const char *domains;
    /* libfabric: the rails of each GPU, "0=mlx5_0,mlx5_1;1=mlx5_2" (names from `domains`): a
     * region on GPU g moves over g's rails, host memory over all. NULL or "": every rail. */
    const char *gpu_domains;
} cx_backend_params_t;

/* The version of this interface. A backend sets .version = CX_BACKEND_API_VERSION; the core
 * refuses one built against another version (cx_backend_check). Bump it on any change of the
 * layout of struct cx_backend_ops or of the contract of a call (an op's or a cx_core_* one). */
#define CX_BACKEND_API_VERSION 5

struct cx_backend_ops {
    /* version and name lead the struct in every version of it, so that the core can read them
     * and name a backend it refuses. */
    uint32_t version; /* the CX_BACKEND_API_VERSION it was built against */
    const char *name; /* "ucx", "libfabric", "zmq" */
    /* Open the backend. CX_EUNSUPPORTED when it cannot run here (say why in the log). */
    int (*open)(const cx_backend_params_t *p, cx_backend_t **out);
    void (*close)(cx_backend_t *b);
    /* The address blob advertised to peers in HELLO. */
    int (*address)(cx_backend_t *b, void *buf, size_t *len);
    /* An fd that becomes readable when progress() has work (-1: none, progress is polled). */
    int (*wait_fd)(cx_backend_t *b);
    /* Drive the backend: complete xfers, serve requests, deliver messages; leave the wait fd
     * armed so that the next activity wakes the progress thread. Returns 0, or 1 when work
     * remains (it stopped at a fairness budget): the core then calls again without sleeping. */
    int (*progress)(cx_backend_t *b);
    /* Optional (NULL: progress is used). One cheap pass that completes what has arrived, without
     * arming the wait fd: a caller driving the transports calls it in a loop while it waits for
     * its op, then calls progress() once before it lets go (core/src/drive.h). Returns 1 when it
     * found work. */
    int (*poll)(cx_backend_t *b);

    /* Register a region; the key blob (up to *key_len bytes) travels to peers. */
    int (*mem_reg)(cx_backend_t *b, void *addr, size_t len, int mem_kind, void **mh, void *key, size_t *key_len);
    void (*mem_dereg)(cx_backend_t *b, void *mh);

    /* Connect to a peer incarnation whose HELLO carried `addr`. `peer` is the core's cookie for
     * cx_core_peer_error. Failing here makes the core try the next backend. */
    int (*connect)(cx_backend_t *b, void *peer, const void *addr, size_t addr_len, cx_bep_t **ep);
    /* Close now (no linger): afterwards no byte moves into or out of any xfer buffer of this
     * endpoint, and every xfer still outstanding on it has been completed (CX_EPEER). `why`:
     * CX_EPEER the peer failed, left or restarted (its process may be gone mid-send), or the
     * backend reported a transport error on this endpoint (CX_CAUSE_TRANSPORT);
     * CX_ETIMEDOUT an op timed out (the peer may be alive, or hung); CX_ECLOSED the engine
     * closes. Only for what the backend keeps of the peer: what a failure means is the core's. */
    void (*disconnect)(cx_backend_t *b, cx_bep_t *ep, int why);
    /* Start an xfer; completion through cx_core_xfer_done (possibly before this returns).
     * Returning an error means the xfer was not started and will not be completed. */
    int (*submit)(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *x);
    /* Optional: the peer dropped a region; forget any cached key for it. */
    void (*forget_region)(cx_backend_t *b, cx_bep_t *ep, uint64_t region_id);
    /* 1: the target serves every request in software (cx_core_mem_copy), so it reaches device
     * memory without registering it. 0 (RDMA backends): device memory the backend cannot
     * register is not registered with it, and ops on it go through the target's core. */
    int software_target;
    /* 1: the backend's handles stay on the progress thread, and callers of an engine that has it
     * never drive the transports (core/src/drive.h). For a library whose objects are not safe to
     * hand from thread to thread, even under a lock, or that was seen to fail when they were. */
    int thread_bound;
    /* Optional: what it can do with GPU memory (NULL: nothing; device memory is then staged). */
    void (*gpu_caps)(cx_backend_t *b, cx_backend_gpu_caps_t *caps);
    /* Optional: what an endpoint really runs over, as the library reports it once connected
     * (UCX: the transports of the ucp_ep's lanes, e.g. "tcp/lo" or "posix/memory,cma/memory";
     * libfabric: the provider). Never derived from the configuration or from what the selection
     * expected. Writes a NUL-terminated string ("" when unknown). */
    void (*ep_transport)(cx_backend_t *b, cx_bep_t *ep, char *buf, size_t n);
    /* Optional: called at every engine create, before the selection probe (which may be the
     * library's first use in the process). For settings that the library reads only from the
     * environment, once, at its first call: set only where the user left them unset, each
     * logged at info, never at load time. */
    void (*prepare)(void);
    /* Optional (NULL: the core calls submit per xfer). Start n xfers on one endpoint, in order, as
     * submit would each, posting them in bulk (libfabric: FI_MORE on all but the last, one
     * doorbell; UCX: every post, then one progress). rcs[i] is what submit would have returned
     * for xs[i]: an error means that xfer was not started and will not be completed; the others
     * complete through cx_core_xfer_done (possibly before this returns). A batch's entries
     * (core/src/batch.h) come this way. */
    void (*submit_batch)(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs);
};

/* ---- what the core offers a backend (all on the progress thread) ---- */

/* Complete an xfer with what the transport said: CX_OK, a local error (CX_ERR, CX_ENOMEM,
 * CX_EAGAIN, CX_EINVAL, ...) or CX_EPEER, "the connection failed under it". The core decides
 * what the caller sees (docs/semantics.md, "Failure causes"): CX_EPEER while a probe of the peer
 * is out waits for its verdict; CX_ERR to a peer still up waits briefly for one (a killed peer's
 * reset may be read after this). A backend that reports a cause (cx_core_peer_error) does so
 * before it completes the xfers that cause ended, so that they complete under the core's
 * verdict. */
void cx_core_xfer_done(cx_core_t *c, cx_xfer_t *x, int status);

/* What a backend saw go wrong on the connection to a peer. The core decides what it means
 * (docs/semantics.md, "Failure causes"). */
enum cx_cause {
    /* The peer's process is gone: its connection was reset by it, its pid exited, the library
     * says the peer is unreachable for good. The core fails the peer now. */
    CX_CAUSE_PEER_GONE = 1,
    /* An error on the connection whose meaning is unclear (a timeout of the library, a broken
     * connection that may be this side's doing). The core marks the peer SUSPECT, closes the data
     * endpoint and probes the peer over the control connection: an answer makes it UP again,
     * silence past the heartbeat timeout makes it FAILED. */
    CX_CAUSE_TRANSPORT = 2,
    /* Local: a resource error, a post the library refused, the cancel of our own op (one on an
     * endpoint this side closed). The peer's state does not change; the op ends with the local
     * error the backend completed it with. */
    CX_CAUSE_LOCAL = 3,
};
typedef enum cx_cause cx_cause_t;
/* A backend saw an error on the connection to a peer (the cookie given to connect). `reason` is
 * for the log and the peer's event. The core may disconnect endpoints from inside the call. */
void cx_core_peer_error(cx_core_t *c, void *peer, cx_cause_t cause, const char *reason);
/* What the core knows of a peer's process (the same-host watch, core/src/proc.h). */
enum cx_proc_state {
    CX_PROC_UNKNOWN = 0, /* not on this host, no pid in its HELLO, or nothing to tell */
    CX_PROC_ALIVE = 1,
    CX_PROC_STOPPED = 2, /* stopped by a signal (SIGSTOP) or a tracer: alive, but not running */
    CX_PROC_EXITED = 3,  /* exited for good: the kernel has torn its memory down */
};
/* The process of `peer` (a connect cookie), looked at now: CX_PROC_*. A pidfd poll and a read of
 * /proc/<pid>/stat: for decisions taken now and then (every 50 ms), not per op. */
int cx_core_peer_process(cx_core_t *c, void *peer);
/* A new fd, the caller's to close (close-on-exec), that turns readable (POLLIN) once the process
 * of `peer` has exited; it keeps naming that process after the peer restarts or is forgotten.
 * -1 when the core does not follow its process (not on this host, no pid, an old kernel). For a
 * backend thread to wait on, or a cheap poll on a hot path. What an exit means for the peer is
 * still the core's: the backend reports CX_CAUSE_PEER_GONE. */
int cx_core_peer_exit_fd(cx_core_t *c, void *peer);
/* Resolve the sender of an incoming request. NULL: unknown (refuse the request). */
void *cx_core_peer_by_incarnation(cx_core_t *c, uint64_t incarnation);
/* The endpoint the core holds for `peer` (a connect cookie) on backend instance `b`, in O(1):
 * for per-message lookups. NULL while the core holds none for it there (connect not returned
 * yet, disconnected, another backend): a backend that may know one then looks for itself. */
cx_bep_t *cx_core_peer_ep(cx_core_t *c, cx_backend_t *b, void *peer);
/* A request from `peer` (a cookie from cx_core_peer_by_incarnation, in this same call) needs an
 * answer, and the backend holds no endpoint for it: the core dropped it after a transport error
 * and makes a new one only for an op of its own. The core makes it soon, outside the backend's
 * calls, if the peer is still up; the backend keeps the request meanwhile (bounded, briefly) and
 * serves it once cx_core_peer_ep or its own lookup finds the endpoint. */
void cx_core_peer_want_ep(cx_core_t *c, void *peer);

/* Target side, for backends that serve requests in software: is [addr, addr+len) inside one
 * registered region? Returns CX_OK or CX_EINVAL (and logs). With pin != NULL the region is pinned
 * against unregistration until cx_core_region_unpin(*pin) (callable from any thread). */
int cx_core_region_check(cx_core_t *c, uint64_t addr, size_t len, void **pin);
void cx_core_region_unpin(void *pin);
/* Target side: copy between a request's bytes and a registered region, whatever memory the region
 * is (host, GPU, simulated device: a device-aware copy, done when it returns). CX_OK or an error
 * (logged). cx_core_region_kind: CX_MEM_* of the region holding [addr, addr+len), or CX_EINVAL;
 * a backend must not hand device memory to its network library (zero-copy sends) itself. */
int cx_core_mem_copy(cx_core_t *c, void *dst, const void *src, size_t len);
int cx_core_region_kind(cx_core_t *c, uint64_t addr, size_t len);
/* The CUDA device ordinal of the GPU memory at [addr, addr+len), for a backend that registers it
 * with its NIC (libfabric's FI_HMEM device id); -1 for host memory or an unknown pointer. */
int cx_core_mem_device(cx_core_t *c, const void *addr, size_t len);

/* Deliver a message (plain or put_signal's) from a peer. The core copies it. Returns CX_OK, or
 * CX_EAGAIN when the receive queue is full (tell the sender), CX_EINVAL for an unknown sender. */
int cx_core_deliver_msg(cx_core_t *c, void *peer, const void *data, size_t len);
/* Count a request served here as target (kind is CX_XFER_*; ok=0 counts a rejection). */
void cx_core_count_served(cx_core_t *c, int kind, size_t bytes, int ok);

/* dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) for a backend that loads its library at
 * its first open, from any thread: the signal dispositions of the process are the same after it
 * as before (a handler a constructor installed is put back, and logged at info). NULL if the
 * library does not load, with dlerror's reason in why[wn]. */
void *cx_core_dlopen(const char *soname, char *why, size_t wn);

/* The registry of compiled-in backends, best first (filled in by the build). */
extern const struct cx_backend_ops *const cx_backends_builtin[];

#ifdef __cplusplus
}
#endif
#endif
