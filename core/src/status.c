#include "connex/connex.h"

const char *cx_strerror(int rc)
{
    switch (rc) {
    case CX_OK: return "ok";
    case CX_ERR: return "internal error";
    case CX_EPEER: return "peer failed";
    case CX_ETIMEDOUT: return "timed out";
    case CX_EINVAL: return "invalid argument";
    case CX_ENOMEM: return "out of memory";
    case CX_EUNSUPPORTED: return "not supported";
    case CX_ECLOSED: return "engine closed";
    case CX_EAUTH: return "authentication refused";
    case CX_EAGAIN: return "receiver queue full, try again";
    case CX_EINPROGRESS: return "still in progress (the wait expired; wait again)";
    default: return "unknown status";
    }
}

const char *cx_event_name(cx_event_type_t t)
{
    switch (t) {
    case CX_EVENT_UP: return "up";
    case CX_EVENT_JOINED: return "joined";
    case CX_EVENT_FAILED: return "failed";
    case CX_EVENT_SUSPECT: return "suspect";
    case CX_EVENT_LEFT: return "left";
    case CX_EVENT_MOVED: return "moved";
    }
    return "unknown";
}
