/* What a peer says it can do, through the warm-up: a bare ack of sequence 0, which an older peer
 * ignores, sent as an endpoint is made (tcp, cx_fi_connect) or at the first read or write to a
 * peer whose offer of same-host copies we lack (shm, fi_cma.c). Its header flags say:
 * CX_FM_F_LISTS the sender serves read lists (fi_list.c; every message carries it);
 * CX_FM_F_CMA it offers same-host copies and wants ours (fi_cma.c); CX_FM_F_CMA_ADV its offer
 * follows the status; CX_FM_F_ECHO it answers ours. A warm-up is answered unless it is an echo
 * that asks for nothing, so each side learns of the other whichever endpoint was made first, and
 * again after one side made a new one; an offer is asked for only until one came, so two peers
 * whose offers fail their probes do not keep asking. */
#include "fi_int.h"

#include "connex/log.h"

void cx_fi_warm_send(cx_backend_t *b, cx_bep_t *ep, uint16_t flags)
{
    cx_fi_op_t *op = cx_fi_op_new(b, CX_FOP_ACK, NULL, ep);
    if (!op) return; /* nothing lost but a faster path */
    op->hflags = flags;
    if (cx_fi_start(b, op)) cx_fi_op_free(b, op);
}

void cx_fi_on_warm(cx_backend_t *b, uint64_t inc, uint16_t flags, const uint8_t *adv)
{
    void *peer = cx_core_peer_by_incarnation(b->core, inc);
    cx_bep_t *ep = peer ? cx_fi_ep_by_peer(b, peer) : NULL;
    if (!ep) return; /* ours, made later, sends its own warm-up, which the peer answers */
    if (flags & CX_FM_F_LISTS) ep->lists = 1;
    if (adv) cx_fi_cma_heard(b, ep, adv);
    int asked = (flags & CX_FM_F_CMA) && b->cma;
    if ((flags & CX_FM_F_ECHO) && !asked) return;
    uint16_t f = CX_FM_F_ECHO;
    if (asked) f |= CX_FM_F_CMA_ADV | (ep->cma_heard ? 0 : CX_FM_F_CMA);
    cx_fi_warm_send(b, ep, f);
}
