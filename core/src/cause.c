/* The core's reading of a backend's failure report (cause.h). */
#include "cause.h"

cx_verdict_t cx_cause_verdict(int cause, cx_peer_state_t state)
{
    if (state != CX_PEER_UP && state != CX_PEER_SUSPECT) return CX_VERDICT_IGNORE;
    switch (cause) {
    case CX_CAUSE_PEER_GONE: return CX_VERDICT_FAIL;
    case CX_CAUSE_LOCAL: return CX_VERDICT_LOCAL;
    case CX_CAUSE_TRANSPORT:
    default: return CX_VERDICT_PROBE;
    }
}

int cx_cause_op_status(int status, int peer_failed)
{
    if (status == CX_EPEER && !peer_failed) return CX_ERR;
    return status;
}

const char *cx_cause_name(int cause)
{
    switch (cause) {
    case CX_CAUSE_PEER_GONE: return "peer gone";
    case CX_CAUSE_TRANSPORT: return "transport";
    case CX_CAUSE_LOCAL: return "local";
    default: return "unknown cause";
    }
}

const char *cx_verdict_name(cx_verdict_t v)
{
    switch (v) {
    case CX_VERDICT_IGNORE: return "ignore";
    case CX_VERDICT_LOCAL: return "local error";
    case CX_VERDICT_PROBE: return "suspect and probe";
    case CX_VERDICT_FAIL: return "failed";
    }
    return "?";
}
