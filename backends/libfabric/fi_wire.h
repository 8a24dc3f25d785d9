/* The libfabric backend's wire formats: the message header every fi_send carries (messages,
 * put_signal's signal, acks, rendezvous headers), the address blob advertised in HELLO and a
 * region's key blob. Pure: no libfabric types or calls, so tests/fuzz/fuzz_fi.c compiles it
 * without the rdma headers (the provider's own address bytes are an opaque blob here).
 *
 * Decoders take (bytes, len) from a peer, never read past len, and return CX_OK or CX_EINVAL;
 * they fill what they could read even when they fail (the caller may still answer the sender).
 * A blob decoded into a (pointer, length) points into the input. Encoders append to a cx_wr_t
 * (check w.ok) and write only what the decoders accept.
 */
#ifndef CX_FI_WIRE_H
#define CX_FI_WIRE_H

#include "connex/connex.h"
#include "connex/wire.h"

#include <stddef.h>
#include <stdint.h>

/* Message header: u8 type, u8 version, u16 reserved (0, ignored), u64 sender incarnation,
 * u64 sequence. After it: MSG / SIG the message itself, ACK the status, *_RTS a cx_fi_rts_t,
 * RREQ / PREQ / RREQ_IN a cx_fi_wbreq_t, RDATA the status then the bytes read, ADDR an
 * address blob. */
enum {
    CX_FM_MSG = 1,
    CX_FM_SIG = 2,
    CX_FM_ACK = 3,
    CX_FM_MSG_RTS = 4,
    CX_FM_SIG_RTS = 5,
    CX_FM_RREQ = 6,
    CX_FM_PREQ = 7,
    CX_FM_RREQ_IN = 8, /* a small read on tcp: answer with the bytes (RDATA) */
    CX_FM_RDATA = 9,   /* a part of the answer to RREQ_IN: i32 status, u32 offset, bytes */
    CX_FM_ADDR = 10,   /* shm: the sender's new endpoint, seq its generation, then its address blob
                        (fi_rot.c) */
    CX_FM_RLIST = 11   /* small reads of a batch, one request for many (fi_list.c): seq the first's */
};
#define CX_FM_RDATA_HDR 8              /* RDATA after the header: i32 status, u32 offset */
#define CX_FM_RD_INLINE_MAX 65536u     /* the largest read a target answers with RDATA */
#define CX_FM_RD_INLINE_DEFAULT 32768u /* what a reader asks that way unless told (fi_wb.c) */
#define CX_FM_VERSION 1
#define CX_FM_F_RUNG 0x1u     /* shm: the sender rings our doorbell for this message (fi_bell.c) */
#define CX_FM_F_RAW 0x2u      /* RREQ_IN, RLIST: the reader takes headerless answer parts (CX_FI_CQD_RDATA) */
#define CX_FM_F_LISTS 0x4u    /* any message: its sender serves RLIST (fi_list.c) */
#define CX_FM_F_ECHO 0x8u     /* a warm-up (bare ack of sequence 0) answering the peer's: not answered */
#define CX_FM_F_CMA 0x10u     /* a warm-up: the sender offers same-host copies, wants the receiver's offer */
#define CX_FM_F_CMA_ADV 0x20u /* a warm-up: after the status, the sender's offer (CX_FM_CMA_ADV bytes) */
#define CX_FM_CMA_ADV 28      /* the offer: util/cma.h's advertisement (CX_CMA_ADV_LEN) */
/* A part of a small read's answer without header: the bytes alone (as many as rxm's eager limit,
 * where a part with header holds 28 fewer: 16 KiB went in two messages) and this word as the
 * send's remote CQ data: u8 CX_FI_CQD_RDATA, u24 the part's offset in the read, u32 the low
 * half of the reader's sequence. Only to a reader that asked with CX_FM_F_RAW. */
#define CX_FI_CQD_RDATA 0xD1u
#define CX_FM_HDR 20
#define CX_FM_ACK_LEN 4 /* after the header: i32 status */
#define CX_FM_RTS 24    /* after the header: u64 len, u64 addr, u64 key */
#define CX_FM_WBREQ 32  /* RREQ / PREQ after the header: a cx_fi_wbreq_t */
/* RLIST after the header: u32 n, u32 0 (reserved), then n entries of u64 the reader's sequence
 * for that read, u64 the source address at the target, u32 length, u32 0 (reserved). Each entry
 * is served as an RREQ_IN of its own (answered by its parts or an ack, under its sequence). */
#define CX_FM_RLIST_HEAD 8
#define CX_FM_RLIST_ENT 24
#define CX_FM_RLIST_MAX 512 /* entries of one list */

#define CX_FI_ADDR_VERSION 2 /* address blob: provider, format, name, pid */
#define CX_FI_PROV_MAX 64    /* provider name, including the terminating NUL */
#define CX_FI_KEY_VERSION 1  /* key blob: version, flags, registered base, key */
#define CX_FI_KEY_VIRT 1u    /* flag: the provider addresses regions by virtual address */
#define CX_FI_KEY_HOST 2u    /* flag: host memory, which a same-host copy may reach (fi_cma.c) */
#define CX_FI_KEY_LEN 18
/* Multi-rail (fi_rail.c): one blob per engine and one per region still, carrying every rail's. */
#define CX_FI_ADDRS_VERSION 3 /* address blob: u8 3, u8 n, n x (u16 length, a version-2 blob) */
#define CX_FI_KEYS_VERSION 2  /* key blob: u8 2, u8 n, n x (u8 length, a version-1 blob) */
#define CX_FI_RAILS_MAX 8

typedef struct cx_fi_hdr {
    uint8_t type;   /* CX_FM_*; the decoder leaves telling them apart to the caller */
    uint64_t inc;   /* the sender's incarnation */
    uint64_t seq;   /* MSG/SIG/RTS: the sender's sequence; ACK: the one answered */
    uint16_t flags; /* CX_FM_F_*; unknown bits ignored */
} cx_fi_hdr_t;

typedef struct cx_fi_rts { /* a large message the target pulls with fi_read */
    uint64_t len;          /* 1 .. CX_MSG_MAX */
    uint64_t addr;         /* as the sender's provider wants it (virtual or offset) */
    uint64_t key;
} cx_fi_rts_t;

typedef struct cx_fi_wbreq { /* "write this to me" (reads and large messages on tcp, fi_wb.c) */
    uint64_t what;           /* RREQ, RREQ_IN: the source address at the target; PREQ: the
                                   target's sequence of the message it should write */
    uint64_t len;            /* 1 .. the backend's largest transfer (checked by the caller) */
    uint64_t dst;            /* where to write, as the asker's provider wants it (RREQ_IN: 0) */
    uint64_t key;            /* the asker's key for that one op (RREQ_IN: 0) */
} cx_fi_wbreq_t;

typedef struct cx_fi_addr {    /* the address blob in HELLO */
    char prov[CX_FI_PROV_MAX]; /* NUL-terminated, no NUL inside */
    uint32_t fmt;              /* fi_info addr_format */
    const uint8_t *name;       /* fi_getname bytes, never empty */
    size_t name_len;
    uint32_t pid; /* shm: the process its region names carry (fi_rot.c), else informative */
} cx_fi_addr_t;

typedef struct cx_fi_key { /* a region's key blob */
    uint8_t flags;         /* CX_FI_KEY_*; unknown bits ignored */
    uint64_t base;         /* the registered start address at the peer */
    uint64_t key;          /* fi_mr_key */
} cx_fi_key_t;

void cx_fi_hdr_put(cx_wr_t *w, const cx_fi_hdr_t *h);
/* The first CX_FM_HDR bytes of buf (version checked); the body is buf + CX_FM_HDR. */
int cx_fi_hdr_get(const void *buf, size_t len, cx_fi_hdr_t *h);
/* The flags of a header put into buf already (buf holds at least CX_FM_HDR bytes). */
void cx_fi_hdr_flags_set(void *buf, uint16_t flags);
void cx_fi_ack_put(cx_wr_t *w, int32_t status);
int cx_fi_ack_get(const void *body, size_t len, int32_t *status);
/* A warm-up's body: the status, then with CX_FM_F_CMA_ADV the offer (*adv points into body, else
 * NULL). The decoder refuses any other length. */
int cx_fi_warm_get(const void *body, size_t len, int has_adv, int32_t *status, const uint8_t **adv);
void cx_fi_rts_put(cx_wr_t *w, const cx_fi_rts_t *r);
int cx_fi_rts_get(const void *body, size_t len, cx_fi_rts_t *r);
void cx_fi_wbreq_put(cx_wr_t *w, const cx_fi_wbreq_t *q);
int cx_fi_wbreq_get(const void *body, size_t len, cx_fi_wbreq_t *q); /* len 0 refused */
/* RDATA's body: the status, the offset of these bytes in the read, the bytes (pointing into
 * body). Refused: bytes with an error status, or bytes past CX_FM_RD_INLINE_MAX. */
void cx_fi_rdata_put(cx_wr_t *w, int32_t status, uint32_t off, const void *data, size_t len);
int cx_fi_rdata_get(const void *body, size_t len, int32_t *status, uint32_t *off, const uint8_t **data, size_t *dlen);
/* RLIST: the head, then each entry (after cx_fi_rlist_get accepted the body, entry i < n is
 * in it). The decoder refuses a count of 0 or past CX_FM_RLIST_MAX, or a body of another
 * length than the count says; entries' lengths are the server's to check (cx_fi_wb_on_rreq_in). */
void cx_fi_rlist_head_put(cx_wr_t *w, uint32_t n);
void cx_fi_rlist_ent_put(cx_wr_t *w, uint64_t seq, uint64_t what, uint32_t len);
int cx_fi_rlist_get(const void *body, size_t len, uint32_t *n);
void cx_fi_rlist_ent(const void *body, uint32_t i, uint64_t *seq, cx_fi_wbreq_t *q);
/* The CQ data word of a headerless part (CX_FI_CQD_RDATA); the decoder refuses another tag or an
 * offset past CX_FM_RD_INLINE_MAX. */
uint64_t cx_fi_cqd_rdata(uint32_t off, uint64_t seq);
int cx_fi_cqd_rdata_get(uint64_t data, uint32_t *off, uint32_t *seq_lo);

void cx_fi_addr_put(cx_wr_t *w, const cx_fi_addr_t *a);
int cx_fi_addr_get(const void *buf, size_t len, cx_fi_addr_t *a);

/* Rail i's part of an address blob (version 2: the blob itself is rail 0's, the only one) or of a
 * key blob (version 1 likewise), pointing into buf; *n: how many rails the blob carries. Every
 * part is length-checked, not decoded (cx_fi_addr_get / cx_fi_key_get do that). */
int cx_fi_addr_rail(const void *buf, size_t len, int i, const uint8_t **part, size_t *part_len, int *n);
int cx_fi_key_rail(const void *buf, size_t len, int i, const uint8_t **part, size_t *part_len, int *n);

void cx_fi_key_put(cx_wr_t *w, const cx_fi_key_t *k);
int cx_fi_key_get(const void *buf, size_t len, cx_fi_key_t *k);
/* The remote address the provider wants for `remote` in that region: CX_EINVAL below its base.
 * Inline: a batch's every entry asks. */
static inline int cx_fi_key_target(const cx_fi_key_t *k, uint64_t remote, uint64_t *raddr)
{
    if (remote < k->base) return CX_EINVAL;
    /* Without FI_MR_VIRT_ADDR the provider addresses a region by offset from its start. */
    *raddr = (k->flags & CX_FI_KEY_VIRT) ? remote : remote - k->base;
    return CX_OK;
}

#endif
