/* A stand-in for the engine as a backend sees it: enough of cx_core_* to run backend instances
 * against each other (or against raw traffic) in one process, recording what they report. Used
 * by the libfabric and ZeroMQ backend tests (tests/fake_core/README.md). */
#ifndef CX_FAKE_CORE_H
#define CX_FAKE_CORE_H

#include "connex/backend.h"
#include "../../core/src/proc.h"
#include "connex/options.h"

#define FC_MAXMSG 64

struct cx_core {
    uint64_t inc;            /* this side's incarnation */
    uint64_t peer_inc;       /* the one other side */
    void *peer_cookie;       /* what peer_by_incarnation answers for it */
    uint32_t peer_pid;       /* its process (fc_open_pair: this one); 0: unknown */
    cx_proc_t proc;          /* what cx_core_peer_process answers from, as the core does */
    int refuse;              /* deliver_msg answers CX_EAGAIN */
    uint64_t reg_lo, reg_hi; /* when reg_hi: region_check refuses what is not inside */
    int region_checks;       /* region_check calls (served requests) */
    int want_ep;             /* peer_want_ep calls */
    /* put_signal check: at delivery, these bytes must already hold check_val */
    const unsigned char *check_at;
    size_t check_len;
    unsigned char check_val;
    int check_failed;
    /* recorded */
    int nmsg;
    void *msg[FC_MAXMSG];
    size_t msg_len[FC_MAXMSG];
    int peer_errors;
    int causes[4]; /* peer errors by cx_cause_t */
    int last_cause;
    int served_ok, served_bad;
    cx_opts_t opts; /* the CONNEX_* table its backend opens with, loaded by fc_open_pair */
};

typedef struct fc_xfer {
    cx_xfer_t x; /* first: the core's xfer */
    int done;    /* times completed (must end at exactly 1) */
    int status;
} fc_xfer_t;

void fc_reset(cx_core_t *c);

uint64_t fc_now_ms(void); /* CLOCK_MONOTONIC */
/* Two sides that know each other (incarnations 0x1111 and 0x2222; a's peer is cookie_b, b's is
 * cookie_a), each with a backend of ops opened on 127.0.0.1. 0, or -1 when one cannot open. */
int fc_open_pair(const struct cx_backend_ops *ops, cx_core_t *ca, cx_core_t *cb, void *cookie_a, void *cookie_b,
                 cx_backend_t **ba, cx_backend_t **bb);
/* Drives backends a and b of ops as the engine does (progress() only when a wait fd is readable,
 * so a missed re-arm shows up as a timeout) until every xfer is done: 0, or -1 after timeout_ms. */
int fc_drive(const struct cx_backend_ops *ops, cx_backend_t *a, cx_backend_t *b, fc_xfer_t **xs, int n, int timeout_ms);
/* A fresh xfer (status 12345 until completed); the caller sets local_mh and the remote key. */
void fc_xfer_init(fc_xfer_t *f, int kind, void *local, size_t len, uint64_t remote, const void *msg, size_t msg_len);

#endif
