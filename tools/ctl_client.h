/* connex-ctl's side of the control protocol: it connects to an engine's control port as a tool,
 * not a peer (no HELLO): the AUTH exchange when a token is set, then STATUS_QUERY, and reads
 * STATUS_REPLY and (watching) STATUS_EVENT frames. Blocking sockets; every read and write is
 * bounded by a deadline. */
#ifndef CX_CTL_CLIENT_H
#define CX_CTL_CLIENT_H

#include "auth.h"
#include "ctl_wire.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cx_ctlc {
    int fd;
    uint8_t *body; /* the last frame's body (malloc'ed, grown as needed) */
    size_t cap;
} cx_ctlc_t;

/* Connects to the engine at url, authenticates with auth (NULL: none) and asks what
 * (CX_STATUS_PEERS or CX_STATUS_WATCH). 0, or a CX_* code with why: CX_EPEER (unreachable),
 * CX_EAUTH (refused, or the engine did not prove the token), CX_ETIMEDOUT, CX_EINVAL (bad URL). */
int cx_ctlc_open(cx_ctlc_t *c, const char *url, const cx_auth_t *auth, int what, int timeout_ms, char *why,
                 size_t whylen);
/* The next frame within timeout_ms: 0 with *type and the body in c->body (*len bytes),
 * CX_ETIMEDOUT, or CX_EPEER (closed, refused: why says). */
int cx_ctlc_read(cx_ctlc_t *c, int timeout_ms, uint8_t *type, size_t *len, char *why, size_t whylen);
void cx_ctlc_close(cx_ctlc_t *c);

#endif
