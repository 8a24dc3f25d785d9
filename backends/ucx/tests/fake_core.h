/* A stand-in for the core, so the backend can be tested alone: each process of the test has one
 * peer (the other process); the fake core records what the backend reports. */
#ifndef CX_UCX_FAKE_CORE_H
#define CX_UCX_FAKE_CORE_H

#include "connex/backend.h"

typedef struct fx_xfer { /* an xfer and what the backend said about it */
    cx_xfer_t x;
    int done, status, calls;
} fx_xfer_t;

typedef struct fake_core {
    uint64_t peer_inc; /* the other process's incarnation */
    int peer_cookie;   /* its address is the peer cookie */
    int peer_errors;
    char last_error[128];
    int last_cause;                              /* cx_cause_t of the last peer error */
    int (*on_msg)(const void *data, size_t len); /* deliver_msg's answer */
    int served_ok, served_bad;
    uint64_t reg_lo, reg_hi; /* when reg_hi: region_check refuses what is not inside */
    int pins;                /* region_check pins not unpinned yet */
} fake_core_t;

extern fake_core_t fx;
extern char fx_last_log[512]; /* the last line logged */
#define FX_CORE ((cx_core_t *)(void *)&fx)

#endif
