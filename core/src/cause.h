/* What a backend's report means for the peer and for the op: pure functions, so that every
 * decision is testable without an engine (tests/unit_cause.c). */
#ifndef CX_CAUSE_H
#define CX_CAUSE_H

#include "connex/backend.h"
#include "connex/connex.h"

typedef enum cx_verdict {
    CX_VERDICT_IGNORE = 0, /* the peer is not UP or SUSPECT: nothing to decide */
    CX_VERDICT_LOCAL,      /* a local error: the peer stays as it is */
    CX_VERDICT_PROBE,      /* SUSPECT (if UP), close the data endpoint, probe the peer */
    CX_VERDICT_FAIL,       /* FAILED now */
} cx_verdict_t;

/* The verdict for a cause a backend reported, given the peer's state now. A cause the core does
 * not know is read as CX_CAUSE_TRANSPORT: unclear, so probed, never failed on its word alone. */
cx_verdict_t cx_cause_verdict(int cause, cx_peer_state_t state);

/* The status a caller sees for an xfer a backend completed with `status`: CX_EPEER (the
 * connection failed under it) stays CX_EPEER only when the core has failed the peer
 * (`peer_failed`); otherwise it is CX_ERR. Every other status is passed through. */
int cx_cause_op_status(int status, int peer_failed);

const char *cx_cause_name(int cause);
const char *cx_verdict_name(cx_verdict_t v);

#endif
