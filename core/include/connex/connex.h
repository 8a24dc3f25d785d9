/* connex-c public API.
 *
 * One engine per process (or more, each with its own control port). A peer is named by a URL
 * `ip:port#model|stage|shard|replica` or, once the engine knows it, by its bare LID
 * `model|stage|shard|replica`. Every call that can block completes or returns an error code:
 * 0 ok, CX_EPEER (-2) the peer failed, CX_ETIMEDOUT (-3) the op timed out (the data connection
 * was closed first, so nothing lands in the caller's buffer afterwards), CX_EINVAL (-4) bad input.
 */
#ifndef CONNEX_CONNEX_H
#define CONNEX_CONNEX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library exports exactly the declarations between this push and its pop (it is built with
 * -fvisibility=hidden; tests/exports.txt lists them). */
#pragma GCC visibility push(default)

#define CX_VERSION_MAJOR 0
#define CX_VERSION_MINOR 1

enum {
    CX_OK = 0,
    CX_ERR = -1,       /* internal or system error (see the log) */
    CX_EPEER = -2,     /* the peer failed, left, or never answered a connect */
    CX_ETIMEDOUT = -3, /* per-op timeout; the data connection was closed first */
    CX_EINVAL = -4,    /* bad argument, malformed URL, unregistered or out-of-range memory */
    CX_ENOMEM = -5,
    CX_EUNSUPPORTED = -6, /* backend or feature not available here */
    CX_ECLOSED = -7,      /* the engine is closing */
    CX_EAUTH = -8,        /* authentication refused */
    CX_EAGAIN = -9,       /* the receiver's bounded queue is full: retry later */
    CX_EINPROGRESS = -10  /* cx_op_wait / cx_group_wait: the wait expired, the op is still in
                             flight and valid: wait again (never an op's own status) */
};
const char *cx_strerror(int rc);

#define CX_MODEL_MAX 64 /* model name, including the terminating NUL */
#define CX_URL_MAX 160  /* longest URL, including the terminating NUL */

typedef struct cx_lid {
    char model[CX_MODEL_MAX];
    uint32_t stage, shard, replica;
} cx_lid_t;

typedef struct cx_url {
    char host[48]; /* numeric IPv4 or IPv6 address, without brackets */
    uint16_t port;
    int is_ipv6;
    cx_lid_t lid;
} cx_url_t;

/* Strict parsers: on failure they return CX_EINVAL and write a message naming the fault into
 * err (when err is not NULL). */
int cx_url_parse(const char *s, cx_url_t *out, char *err, size_t errlen);
int cx_url_format(const cx_url_t *u, char *buf, size_t len); /* CX_EINVAL if too small */
int cx_lid_parse(const char *s, cx_lid_t *out, char *err, size_t errlen);
int cx_lid_format(const cx_lid_t *lid, char *buf, size_t len);
int cx_lid_cmp(const cx_lid_t *a, const cx_lid_t *b); /* total order */

typedef struct cx_config { /* zero-initialised = defaults */
    const char *model;     /* required: [A-Za-z0-9._:/-]{1,63} */
    uint32_t stage, shard, replica;
    const char *listen_ip;         /* default "127.0.0.1"; IPv6 accepted; "0.0.0.0" or "::": every
                                     interface (see advertise_ip) */
    uint16_t port;                 /* control port; 0 = ephemeral */
    const char *backend;           /* NULL or "auto" (every usable backend, best per peer),
                                     or "ucx" | "libfabric" | "zmq"; env CONNEX_BACKEND wins */
    uint32_t heartbeat_ms;         /* default 1000 */
    uint32_t heartbeat_timeout_ms; /* default 3000 */
    uint32_t op_timeout_ms;        /* default 30000 */
    uint32_t connect_timeout_ms;   /* first connect to a peer; default 5000 */
    uint32_t recv_queue_max;       /* bounded message queue, messages; default 4096 */
    uint64_t recv_queue_bytes;     /* bounded message queue, bytes; default 256 MiB */
    const char *auth_token;        /* shared secret peers must prove (docs/security.md); NULL: env
                                     CONNEX_AUTH_TOKEN, else the file CONNEX_AUTH_TOKEN_FILE, else none */
    /* mobility (docs/mobility.md) */
    const char *directory; /* NULL: env CONNEX_DIRECTORY, else "static"; or "etcd://ip:port" */
    const char *peers;     /* static directory: comma-separated URLs; NULL: env CONNEX_PEERS */
    uint32_t lease_ms;     /* directory lease: an entry outlives a dead process this long;
                                     default 3000 (etcd rounds up to whole seconds) */
    /* traffic classes (docs/semantics.md): per peer, ops in flight per class */
    uint32_t credits_critical;   /* default 64 */
    uint32_t credits_background; /* default 2 */
    uint32_t background_chunk;   /* background transfers move in chunks of this many bytes;
                                     default 1 MiB */
    int classes_off;             /* 1: no classes, every op is issued at once (benchmark baseline);
                                     env CONNEX_CLASSES=off */
    const char *advertise_ip;    /* the address peers are told to connect to (URL, HELLO, directory
                                     entry, backend addresses); NULL: env CONNEX_ADVERTISE_IP, else
                                     listen_ip, else (listen_ip 0.0.0.0 or ::) the address of the
                                     default-route interface (docs/semantics.md) */
} cx_config_t;

typedef struct cx_engine cx_engine_t;
typedef struct cx_op cx_op_t;

int cx_engine_create(const cx_config_t *cfg, cx_engine_t **out);
void cx_engine_destroy(cx_engine_t *e);                /* BYE to peers, frees everything */
const char *cx_engine_local_url(const cx_engine_t *e); /* "127.0.0.1:51001#llama|1|0|0" */
const char *cx_engine_backends(const cx_engine_t *e);  /* opened backends, best first: "ucx,zmq" */
uint64_t cx_engine_incarnation(const cx_engine_t *e);

/* Connect to a peer and wait until it is up (optional: ops connect on first use). */
int cx_connect(cx_engine_t *e, const char *peer_url, int timeout_ms);
/* The backend this pair uses ("zmq", ...), or NULL when the peer is unknown or not connected. */
const char *cx_peer_backend(cx_engine_t *e, const char *peer);

typedef enum {
    CX_PEER_UNKNOWN = 0,
    CX_PEER_CONNECTING,
    CX_PEER_UP,
    CX_PEER_SUSPECT,
    CX_PEER_FAILED,
    CX_PEER_LEFT
} cx_peer_state_t;
cx_peer_state_t cx_peer_state(cx_engine_t *e, const char *peer);

/* One known peer, as cx_peer_list reports it. */
typedef struct cx_peer_info {
    cx_lid_t lid;
    char url[CX_URL_MAX];
    cx_peer_state_t state;
    char backend[16];       /* the pair's backend while UP or SUSPECT, else "" */
    char why[192];          /* why the pair uses that backend (the selection's reason) */
    uint64_t incarnation;   /* the peer's current (or last) incarnation, 0 before any */
    uint64_t ops_in_flight; /* ops this engine has bound to that peer */
    int same_host;          /* 1: the peer runs on this host (shared-memory paths apply) */
    int death_watch;        /* 1: a same-host death watch follows its process: a crash of it is
                                 reported at once, not when its sockets close (docs/semantics.md) */
    char transport[64];     /* what the pair's data endpoint really runs over, as the backend's
                                 library reports it (UCX: its lanes, "tcp/lo"; libfabric: the
                                 provider); "" when unknown or not connected */
} cx_peer_info_t;
/* Fills up to max entries; returns the number of known peers (may exceed max), or an error. */
int cx_peer_list(cx_engine_t *e, cx_peer_info_t *out, int max);

/* Memory: host or GPU (detected). Registered ranges may not overlap. */
int cx_register_memory(cx_engine_t *e, void *addr, size_t len);
int cx_unregister_memory(cx_engine_t *e, void *addr);

/* Memory kinds (docs/gpu.md): what cx_register_memory detects for a buffer. CX_MEM_SIM is the
 * simulated device (CONNEX_GPU_SIM=1): host memory every path treats as device memory. */
enum { CX_MEM_HOST = 0, CX_MEM_CUDA = 1, CX_MEM_SIM = 2 };
/* CX_MEM_* of [addr, addr+len), or CX_EINVAL (logged) when addr is NULL or the range starts in a
 * device allocation and runs past its end. */
int cx_mem_kind(const void *addr, size_t len);
/* Device memory for buffers a binding manages itself: kind CX_MEM_CUDA (on CUDA device `device`)
 * or CX_MEM_SIM (the simulated device, which must be on). CX_EUNSUPPORTED when that device is not
 * available, CX_EINVAL for another kind or len 0, CX_ENOMEM; every refusal is logged. */
int cx_mem_alloc(int kind, int device, size_t len, void **out);
void cx_mem_free(void *p); /* p from cx_mem_alloc; NULL is ignored */
/* A synchronous copy between any two kinds of memory (host, CUDA, sim). */
int cx_mem_copy(void *dst, const void *src, size_t len);

/* The first region the peer registered (the lowest region id it announced that is still
 * registered), as its HELLO and region announcements told this engine: *addr and *len, both 0
 * when the peer has none. CX_EPEER when the peer is unknown or not up (connect first). */
int cx_peer_first_region(cx_engine_t *e, const char *peer, uint64_t *addr, uint64_t *len);

/* One-sided, synchronous. The local buffer must lie inside a region registered with this engine,
 * the remote range inside one region registered with the peer. */
int cx_read(cx_engine_t *e, const char *peer, void *dst, uint64_t remote_src, size_t len);
int cx_write(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len);

/* Write, then a message that the peer receives only after the data is in place. Asynchronous:
 * *op is set on success and must be passed to cx_op_wait exactly once. */
int cx_put_signal(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len, const void *msg,
                  size_t msg_len, cx_op_t **op);
/* Returns the op's status and frees it; when timeout_ms expires first it returns CX_EINPROGRESS
 * and the op stays valid (wait again). Any other value is the op's own status (CX_EAGAIN included:
 * a put_signal whose message the receiver refused), and the op is gone. timeout_ms < 0 waits until the op completes (ops always complete:
 * the engine's op timeout bounds them). */
int cx_op_wait(cx_op_t *op, int timeout_ms);

/* Traffic classes. Critical ops (the default of every synchronous call) go first; background
 * ops (KV migration, recovery) are chunked, limited to credits_background in flight per peer, and
 * yield to critical ops on the same peer. */
typedef enum { CX_CLASS_CRITICAL = 0, CX_CLASS_BACKGROUND = 1 } cx_class_t;
/* Asynchronous read and write in a class: *op is set on success; pass it to cx_op_wait once. */
int cx_read_async(cx_engine_t *e, const char *peer, void *dst, uint64_t remote_src, size_t len, cx_class_t cls,
                  cx_op_t **op);
int cx_write_async(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len, cx_class_t cls,
                   cx_op_t **op);

/* Batches: many blocks in one call, one completion, a status per entry (docs/api.md,
 * docs/semantics.md "Batches"). An entry names its peer (a URL or a LID, as for cx_read); entries
 * of one batch may name different peers. Every entry is checked before anything moves: a bad
 * one (NULL or unregistered local buffer, zero length, a remote range the peer has not
 * registered, an unknown peer) refuses the whole batch with CX_EINVAL, and the log names the
 * entry's index and its fault. Otherwise each entry ends on its own: CX_OK, or CX_EPEER when its
 * peer failed, CX_ETIMEDOUT (its peer's data connection was closed first), ... while entries to
 * other peers complete normally. The batch returns CX_OK when every entry did, else the status
 * of the first entry (in entry order) that failed. `status` (NULL: not wanted) receives n
 * statuses when the batch completes; for the async forms it must stay valid until cx_op_wait
 * returns, and so must the entries' buffers (the entries array itself is copied). */
typedef struct cx_batch_entry {
    const char *peer; /* URL or LID; cx_batch_put_signal: NULL or its peer */
    void *local;      /* read: destination; write: source */
    uint64_t remote;  /* address at the peer */
    size_t len;       /* bytes, > 0 */
} cx_batch_entry_t;
#define CX_BATCH_MAX (1u << 16) /* most entries in one batch */

int cx_batch_read(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, int *status);
int cx_batch_write(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, int *status);
/* Asynchronous, in a class: *op is set on success; pass it to cx_op_wait once. */
int cx_batch_read_async(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, cx_class_t cls, int *status,
                        cx_op_t **op);
int cx_batch_write_async(cx_engine_t *e, const cx_batch_entry_t *ents, size_t n, cx_class_t cls, int *status,
                         cx_op_t **op);
/* Writes the entries to `peer`, then delivers msg there: the peer queues the message only after
 * every entry is in place. The last entry goes with the message, once every other entry completed;
 * when one failed, the message is not sent and the last entry takes the first failure's status.
 * Asynchronous: cx_op_wait returns once the peer queued (or refused, CX_EAGAIN) the message. */
int cx_batch_put_signal(cx_engine_t *e, const char *peer, const cx_batch_entry_t *ents, size_t n, const void *msg,
                        size_t msg_len, cx_class_t cls, int *status, cx_op_t **op);

#define CX_MSG_MAX (64u << 20) /* largest message or put_signal message */

typedef struct cx_msg {
    cx_lid_t from;
    char from_url[CX_URL_MAX];
    void *data;
    size_t len;
    uint64_t step; /* a group step's id (cx_group_send), unique per sender incarnation;
                             0 for a plain message */
    uint64_t from_incarnation;
} cx_msg_t;

int cx_send_msg(cx_engine_t *e, const char *peer, const void *buf, size_t len);
/* 0 and a message (release it with cx_msg_release), or CX_ETIMEDOUT when none arrived. */
int cx_recv_msg(cx_engine_t *e, cx_msg_t *msg, int timeout_ms);
void cx_msg_release(cx_msg_t *msg);

typedef enum {
    CX_EVENT_UP = 0,  /* first contact with a peer, or a suspect peer recovered */
    CX_EVENT_JOINED,  /* a known LID came back (new incarnation, or reconnected after FAILED) */
    CX_EVENT_FAILED,  /* died, hung past the heartbeat timeout, or cut off; reason says which */
    CX_EVENT_SUSPECT, /* heartbeats missing; not yet failed */
    CX_EVENT_LEFT,    /* clean close (BYE), or its directory entry was deleted or expired */
    CX_EVENT_MOVED    /* a known LID is now registered at another URL (directory) */
} cx_event_type_t;
const char *cx_event_name(cx_event_type_t t); /* "up", "joined", "failed", "suspect", "left", "moved" */

typedef struct cx_event {
    cx_event_type_t type;
    cx_lid_t peer;
    char url[CX_URL_MAX];
    char reason[128];
    uint64_t incarnation;
    uint64_t time_ns; /* CLOCK_MONOTONIC when the engine saw it */
} cx_event_t;

/* 0 and an event, or CX_ETIMEDOUT when none arrived within timeout_ms (< 0: wait forever). */
int cx_wait_event(cx_engine_t *e, cx_event_t *ev, int timeout_ms);

enum { CX_OPK_READ = 0, CX_OPK_WRITE, CX_OPK_PUT_SIGNAL, CX_OPK_MSG, CX_OPK_COUNT };

typedef struct cx_stats {
    uint32_t peers_connecting, peers_up, peers_suspect, peers_failed, peers_left;
    uint64_t regions, registered_bytes;
    uint64_t ops_in_flight; /* a batch counts its entries not yet completed (a run: until its last) */
    uint64_t peer_failures, peer_joins, op_timeouts;
    uint64_t ops[CX_OPK_COUNT];        /* completed ok, initiated here */
    uint64_t op_errors[CX_OPK_COUNT];  /* completed with an error, initiated here */
    uint64_t bytes[CX_OPK_COUNT];      /* payload bytes of ok ops initiated here */
    uint64_t served_ops[CX_OPK_COUNT]; /* requests served here as target (where the backend sees them) */
    uint64_t served_bytes[CX_OPK_COUNT];
    uint64_t rejected_requests; /* target side: out of bounds, unknown sender, garbage */
    uint64_t msgs_queued;       /* messages waiting for cx_recv_msg */
    uint64_t msgs_refused;      /* refused with CX_EAGAIN because the queue was full */
    uint64_t events_dropped;    /* oldest events dropped because nobody read them */
    uint64_t auth_refused;
    uint64_t staged_h2d_bytes, staged_d2h_bytes;
    int gpudirect;                     /* 1 when GPU memory is registered with the NIC directly */
    uint64_t steps_handed_over;        /* group steps re-sent to another member after a failure */
    uint64_t steps_duplicates_dropped; /* receiver side: group steps seen before, not queued again */
    uint64_t directory_changes;        /* directory entries added, moved or removed, as seen here */
    uint64_t background_chunks;        /* chunks of background-class transfers issued */
    uint64_t background_deferred;      /* times a background chunk waited for critical ops */
    uint64_t ops_driven;               /* ops a caller started on its own thread (drive.h) */
    uint64_t ops_driven_done;          /* ops done while their own caller drove the transports */
} cx_stats_t;
int cx_stats(cx_engine_t *e, cx_stats_t *st);
/* The engine's counters, its peers (state, backend, incarnation, since when, ops, bytes, errors,
 * failures, joins) and op latency histograms per op kind and backend, as Prometheus text
 * (exposition format 0.0.4; docs/operations.md lists the metrics). Writes at most len bytes
 * (NUL-terminated; buf may be NULL when len is 0) and returns the length the whole text needs,
 * like snprintf, or a negative CX_* code. CONNEX_METRICS=ip:port serves the same text at
 * GET /metrics. */
int cx_stats_format(cx_engine_t *e, char *buf, size_t len);

/* ---- mobility (docs/mobility.md) ---- */

/* The identity directory: LID -> URL, with a version (etcd's revision; a counter for the static
 * directory) so that a stale route is recognised. This engine registers itself at create (under a
 * lease the progress thread keeps alive) and deletes its entry at destroy. */
typedef struct cx_dir_entry {
    cx_lid_t lid;
    char url[CX_URL_MAX];
    uint64_t version;
} cx_dir_entry_t;
/* Entries whose LID matches `pattern` ("model|stage|shard|replica", any field may be "*").
 * Fills up to max entries; returns how many match (may exceed max), or an error. */
int cx_directory_list(cx_engine_t *e, const char *pattern, cx_dir_entry_t *out, int max);
const char *cx_directory_kind(cx_engine_t *e); /* "static" or "etcd" */

/* Replica groups: every member whose LID matches a pattern ("model|stage|*|*"), followed through
 * the directory and the transport events. Steps sent to a group go to one live member; if that
 * member fails before it queued the step, the step is handed to another member. A receiver
 * queues each step at most once (duplicates are dropped by (sender incarnation, step id)). */
typedef struct cx_group cx_group_t;
typedef enum { CX_PICK_ROUND_ROBIN = 0, CX_PICK_LEAST_INFLIGHT = 1 } cx_pick_t;

int cx_group_open(cx_engine_t *e, const char *pattern, cx_pick_t policy, cx_group_t **out);
void cx_group_close(cx_group_t *g); /* steps still in flight complete with CX_ECLOSED */
/* Add a member by URL (besides what the directory lists); its LID must match the pattern. */
int cx_group_add(cx_group_t *g, const char *url);
/* Members (up to max) and their states; returns the member count. */
int cx_group_members(cx_group_t *g, cx_lid_t *lids, cx_peer_state_t *states, int max);
/* The member the policy picks now (skips FAILED, SUSPECT and LEFT); CX_EPEER when none is live. */
int cx_group_pick(cx_group_t *g, cx_lid_t *out);
/* The caller saw this member misbehave: skip it (and hand its steps over) until it rejoins. */
int cx_group_mark_failed(cx_group_t *g, const char *lid);
/* A step: a message (send) or a write then a message (put_signal, remote_offset counted from the
 * start of the first region the member registered). Asynchronous: wait with cx_group_wait. */
int cx_group_send(cx_group_t *g, const void *msg, size_t len, cx_op_t **op);
int cx_group_put_signal(cx_group_t *g, const void *src, size_t len, uint64_t remote_offset, const void *msg,
                        size_t msg_len, cx_op_t **op);
/* cx_op_wait for a group step that also says which member queued it (taken_by may be NULL) and
 * its step id (step may be NULL). CX_EPEER: no member was left. CX_EINPROGRESS: the wait expired,
 * the step is still in flight (wait again). */
int cx_group_wait(cx_op_t *op, int timeout_ms, cx_lid_t *taken_by, uint64_t *step);

/* Logging: CONNEX_LOG=error|warn|info|debug (default warn), to stderr. */
void cx_log_set_level(int level); /* 0 error .. 3 debug */

/* The CONNEX_* environment variables (README.md, "Configuration"): one line each, in the options
 * table's order, with the effective value, where it came from (default, environment, or BAD for a
 * value cx_engine_create refuses), the component that reads it, a line of doc and the allowed
 * values. Writes at most len bytes (NUL-terminated) and returns the length the whole report
 * needs, like snprintf. */
size_t cx_options_report(char *buf, size_t len);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
