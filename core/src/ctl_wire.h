/* The control protocol between two engines (one TCP connection per pair of peers).
 * Frame: u32 body length, u8 type, u8 version, u16 reserved, then the body (little endian). */
#ifndef CX_CTL_WIRE_H
#define CX_CTL_WIRE_H

#include "connex/connex.h"
#include "connex/wire.h"
#include "region.h"

#include <stddef.h>
#include <stdint.h>

#define CX_CTL_MAGIC 0x31584e43u /* "CNX1" */
#define CX_CTL_VERSION \
    4 /* 3: a target stages its device memory over the data backend (TS_*); 4: small
                            staged writes carry their bytes (and a put_signal's message) in TS_REQ */
#define CX_CTL_HDR 8
#define CX_CTL_MAX_BODY (64u << 20)
#define CX_BNAME_MAX 16
#define CX_BADDR_MAX 4096

enum {
    CX_CTL_HELLO = 1,     /* initiator -> acceptor */
    CX_CTL_HELLO_ACK = 2, /* acceptor -> initiator, same body */
    CX_CTL_REG_ADD = 3,   /* a region was registered */
    CX_CTL_REG_DEL = 4,   /* a region was unregistered */
    CX_CTL_REG_QUERY = 5, /* which region holds [addr, addr+len)? */
    CX_CTL_REG_REPLY = 6,
    CX_CTL_HB = 7,     /* heartbeat; with a body (u8 kind, u64 id) a probe or its answer (peer/liveness.c) */
    CX_CTL_BYE = 8,    /* clean close */
    CX_CTL_REFUSE = 9, /* handshake refused: i32 status, str8 reason; then the acceptor closes */
    CX_CTL_AUTH = 10,  /* before HELLO when a token is set: the exchange in auth.h */
    CX_CTL_DEATH = 11, /* the sender's same-host watch saw a process die: LID, incarnation */
    /* 12, 13: retired (device memory once crossed the control connection in these) */
    CX_CTL_REG_DEL_ACK = 14,  /* u64 region id: the receiver of REG_DEL dropped that region */
    CX_CTL_STATUS_QUERY = 15, /* an operator's tool (connex-ctl), instead of HELLO: u8 CX_STATUS_* */
    CX_CTL_STATUS_REPLY = 16, /* the engine and its peers (cx_wire_status_*) */
    CX_CTL_STATUS_EVENT = 17, /* after a STATUS_QUERY with CX_STATUS_WATCH: each event, as it goes out */
    CX_CTL_TS_REQ = 18,       /* stage a range of the receiver's device memory (tstage.h) */
    CX_CTL_TS_CHUNK = 19,     /* a staged chunk: its ring slot holds the bytes (read) or awaits them */
    CX_CTL_TS_ACK = 20,       /* the data backend is done with a chunk's slot */
    CX_CTL_TS_END = 21        /* a staged range ended: every slot back (a write: after the last H2D) */
};
#define CX_CTL_LAST CX_CTL_TS_END

#define CX_WCHOICE_MAX 64
typedef struct cx_wire_backend {
    char name[CX_BNAME_MAX];
    char choice[CX_WCHOICE_MAX]; /* "backend/variant/caps": what select/ needs to pair */
    uint16_t addr_len;
    const uint8_t *addr; /* points into the frame */
} cx_wire_backend_t;

typedef struct cx_wire_hello {
    uint64_t incarnation;
    cx_lid_t lid;
    char url[CX_URL_MAX];
    cx_lid_t target;   /* HELLO: whom the dialler means to reach; HELLO_ACK: the dialler */
    char host_id[128]; /* equal on two engines = same host (shared memory possible) */
    uint32_t hb_ms, hb_timeout_ms;
    uint32_t live_pid; /* same-host death watch (live.h): the sender's pid and the fd of */
    int32_t live_fd;   /* its page; 0 / -1: none */
    uint8_t nb;
    cx_wire_backend_t b[CX_MAX_BACKENDS];
    uint32_t nregions;
    cx_rd_t regions; /* positioned at the first region */
} cx_wire_hello_t;

typedef struct cx_wire_region {
    uint64_t id, addr, len;
    uint8_t mem_kind;
    uint8_t nkeys;
    struct {
        char name[CX_BNAME_MAX];
        uint16_t len;
        const uint8_t *key;
    } keys[CX_MAX_BACKENDS];
} cx_wire_region_t;

/* Writes the 8-byte header for a body of blen bytes. */
void cx_ctl_hdr(uint8_t *hdr, uint32_t blen, uint8_t type);
/* Parses a header: 0 and (*blen, *type), or CX_EINVAL for a bad version or oversize body. */
int cx_ctl_hdr_parse(const uint8_t *hdr, uint32_t *blen, uint8_t *type);

/* Region encoding; backend names come from `names` (index = local backend index). */
void cx_wire_put_region(cx_wr_t *w, const cx_region_t *r, const char *const *names, int nb);
int cx_wire_get_region(cx_rd_t *r, cx_wire_region_t *out);

void cx_wire_put_hello_head(cx_wr_t *w, uint64_t inc, const cx_lid_t *lid, const char *url, const cx_lid_t *target,
                            const char *host_id, uint32_t hb_ms, uint32_t hbt_ms, uint32_t live_pid, int32_t live_fd,
                            int nb, const char *const *names, const char *const *choices, const uint8_t *const *addrs,
                            const uint16_t *addr_lens, uint32_t nregions);
/* DEATH: which process (LID and incarnation) the sender saw die on its host (live.h). */
void cx_wire_put_death(cx_wr_t *w, const cx_lid_t *lid, uint64_t inc);
int cx_wire_get_death(const uint8_t *body, size_t len, cx_lid_t *lid, uint64_t *inc);

/* STATUS_QUERY's body: u8, what the tool asks for. The reply: the engine (u64 incarnation, str8
 * url, str8 lid, str8 backends, u64 unix ms now, u32 peers), then per peer: str8 lid, str8 url,
 * u8 state, str8 backend, str8 transport, u64 incarnation, u64 unix ms of its last event (0:
 * none), u64 failures, joins, ops in flight, op errors, op timeouts. An event: u8 type, str8 lid,
 * str8 url, u64 incarnation, u64 unix ms, str8 reason. */
enum { CX_STATUS_PEERS = 0, CX_STATUS_WATCH = 1 };
#define CX_STATUS_PEERS_MAX 65536
typedef struct cx_wire_status {
    uint64_t incarnation, now_ms;
    char url[CX_URL_MAX], lid[96], backends[64];
    uint32_t npeers;
    cx_rd_t peers; /* positioned at the first peer */
} cx_wire_status_t;
typedef struct cx_wire_status_peer {
    char lid[96], url[CX_URL_MAX], backend[CX_BNAME_MAX], transport[64];
    int state;
    uint64_t incarnation, since_ms, failures, joins, in_flight, errors, timeouts;
} cx_wire_status_peer_t;
typedef struct cx_wire_status_event {
    int type;
    char lid[96], url[CX_URL_MAX], reason[128];
    uint64_t incarnation, time_ms;
} cx_wire_status_event_t;
void cx_wire_put_status_head(cx_wr_t *w, uint64_t inc, const char *url, const char *lid, const char *backends,
                             uint64_t now_ms, uint32_t npeers);
void cx_wire_put_status_peer(cx_wr_t *w, const cx_wire_status_peer_t *p);
void cx_wire_put_status_event(cx_wr_t *w, const cx_wire_status_event_t *ev);
/* Decoders: 0, or CX_EINVAL for a malformed body (a peer count over CX_STATUS_PEERS_MAX, a state
 * or event type out of range, a string too long, bytes left over). */
int cx_wire_get_status_head(const uint8_t *body, size_t len, cx_wire_status_t *s);
int cx_wire_get_status_peer(cx_rd_t *r, cx_wire_status_peer_t *p); /* the next of s->peers */
int cx_wire_get_status_event(const uint8_t *body, size_t len, cx_wire_status_event_t *ev);

/* Decodes a HELLO body up to its regions (iterate them with cx_wire_get_region on h->regions). */
int cx_wire_get_hello(const uint8_t *body, size_t len, cx_wire_hello_t *h, char *err, size_t errlen);

#endif
