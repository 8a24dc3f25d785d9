/* Op bookkeeping: lists, the ack table, and the two-step completion (finish inside UCX
 * callbacks, deliver to the core from the drain). */
#include "ucx_int.h"

#include <stdlib.h>
#include <string.h>

void cx_ucx_list_del(cx_ucx_op_t *op)
{
    if (!op->next) return;
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->next = op->prev = NULL;
}

void cx_ucx_list_add(cx_ucx_op_t *head, cx_ucx_op_t *op)
{
    op->prev = head->prev;
    op->next = head;
    head->prev->next = op;
    head->prev = op;
}

int cx_ucx_status(ucs_status_t st)
{
    if (st == UCS_OK) return CX_OK;
    if (st == UCS_ERR_NO_MEMORY) return CX_ENOMEM;
    if (st == UCS_ERR_INVALID_PARAM) return CX_EINVAL;
    /* canceled (forced close), unreachable, reset, timeout: all mean the peer is lost */
    return CX_EPEER;
}

cx_ucx_op_t *cx_ucx_op_new(cx_ucx_t *b, cx_bep_t *ep, cx_xfer_t *x)
{
    cx_ucx_op_t *op = cx_objcache_get(&b->free_ops);
    if (!op) return NULL;
    op->b = b;
    op->x = x;
    op->ep = ep;
    cx_ucx_list_add(&ep->ops, op);
    return op;
}

#define CX_UCX_BOUNCE_KEEP (64u << 20) /* larger bounce buffers are freed, not kept */

void *cx_ucx_bounce_get(cx_ucx_t *b, cx_ucx_op_t *op, size_t len)
{
    int best = -1;
    for (int i = 0; i < 2; i++)
        if (b->bounces[i].p && b->bounces[i].cap >= len && (best < 0 || b->bounces[i].cap < b->bounces[best].cap))
            best = i;
    if (best >= 0) {
        op->bounce = b->bounces[best].p;
        op->bounce_cap = b->bounces[best].cap;
        b->bounces[best].p = NULL;
    } else if ((op->bounce = malloc(len))) {
        op->bounce_cap = len;
    }
    return op->bounce;
}

/* Only once UCX no longer names it (the op is freed): keep the two largest up to the limit. */
static void bounce_put(cx_ucx_t *b, void *p, size_t cap)
{
    if (!p) return;
    if (cap > CX_UCX_BOUNCE_KEEP) {
        free(p);
        return;
    }
    int slot = !b->bounces[0].p ? 0 : !b->bounces[1].p ? 1 : b->bounces[0].cap <= b->bounces[1].cap ? 0 : 1;
    if (b->bounces[slot].p) {
        if (b->bounces[slot].cap >= cap) { /* both kept ones are at least as large */
            free(p);
            return;
        }
        free(b->bounces[slot].p);
    }
    b->bounces[slot].p = p;
    b->bounces[slot].cap = cap;
}

static void cx_ucx_op_free(cx_ucx_t *b, cx_ucx_op_t *op)
{
    if (op->ue) cx_ucx_ue_unref(op->ue);
    op->ue = NULL;
    free(op->msg_copy);
    bounce_put(b, op->bounce, op->bounce_cap);
    op->msg_copy = op->bounce = NULL;
    cx_objcache_put(&b->free_ops, op);
}

void cx_ucx_ops_free_cache(cx_ucx_t *b)
{
    /* After ucp_worker_destroy: requests that never completed (endpoints without error
     * handling to dead peers) will not call back any more. */
    while (b->zombies.next && b->zombies.next != &b->zombies) {
        cx_ucx_op_t *op = b->zombies.next;
        cx_ucx_list_del(op);
        if (op->ue) cx_ucx_ue_unref(op->ue);
        free(op->msg_copy);
        free(op->bounce);
        free(op);
    }
    cx_objcache_drain(&b->free_ops);
    for (int i = 0; i < 2; i++) {
        free(b->bounces[i].p);
        b->bounces[i].p = NULL;
    }
}

void cx_ucx_ack_add(cx_ucx_t *b, cx_ucx_op_t *op)
{
    cx_acktab_add(&b->acks, &op->ack, op->req_id);
}

cx_ucx_op_t *cx_ucx_ack_find(cx_ucx_t *b, uint64_t req_id)
{
    cx_ack_link_t *l = cx_acktab_find(&b->acks, req_id);
    return l ? cx_container_of(l, cx_ucx_op_t, ack) : NULL;
}

cx_ucx_op_t *cx_ucx_ack_take(cx_ucx_t *b, uint64_t req_id)
{
    cx_ack_link_t *l = cx_acktab_take(&b->acks, req_id);
    return l ? cx_container_of(l, cx_ucx_op_t, ack) : NULL;
}

/* The status is decided: off the endpoint, onto the done list (the drain hands it back). */
void cx_ucx_op_finish(cx_ucx_t *b, cx_ucx_op_t *op, int status)
{
    if (op->finished) return;
    op->finished = 1;
    op->status = status;
    if (op->counted_msg) { /* messages held behind it may go (rotation: ucx_xfer.c) */
        op->counted_msg = 0;
        op->ue->msgs--;
    }
    if (op->stage == CX_UCX_OPS_HELD && op->ep) op->ep->held--;
    if (op->bounce && op->x && status == CX_OK) memcpy(op->x->local, op->bounce, op->x->len);
    cx_acktab_del(&b->acks, &op->ack);
    cx_ucx_list_del(op);
    if (op->x) {
        cx_ucx_list_add(&b->done, op);
    } else if (!op->pending) {
        cx_ucx_op_free(b, op);
    }
}

/* Hand a finished op back to the core; keep the op itself while UCX may still name it. */
void cx_ucx_op_deliver(cx_ucx_t *b, cx_ucx_op_t *op)
{
    cx_ucx_list_del(op);
    cx_xfer_t *x = op->x;
    op->x = NULL;
    op->ep = NULL;
    int status = op->status;
    if (!op->pending)
        cx_ucx_op_free(b, op);
    else
        cx_ucx_list_add(&b->zombies, op); /* freed by its last request, or at close */
    if (x) cx_core_xfer_done(b->core, x, status);
}

cx_ucx_op_t *cx_ucx_req_done(void *req, void *user)
{
    cx_ucx_op_t *op = user;
    cx_ucx_lib.ucp_request_free(req);
    if (op->finished || !op->x) {
        cx_ucx_op_release(op->b, op);
        return NULL;
    }
    op->pending--;
    return op;
}

void cx_ucx_op_drop(cx_ucx_t *b, cx_ucx_op_t *op)
{
    op->x = NULL;
    op->ep = NULL;
    op->finished = 1;
    cx_acktab_del(&b->acks, &op->ack);
    cx_ucx_list_del(op);
    /* No request of it completed here: counting one (cx_ucx_op_release) freed an op whose
     * message was still posted, when the peer's failure finished it inside the post (its
     * endpoint's error handler runs within ucp_am_send_nbx), and the send's later completion
     * then wrote into the freed op: a corrupted op cache, SIGSEGV on a driving caller. */
    if (op->pending <= 0)
        cx_ucx_op_free(b, op);
    else
        cx_ucx_list_add(&b->zombies, op); /* freed by its last request, or with its worker */
}

/* A UCX request naming this op completed; free the op once nothing refers to it. */
void cx_ucx_op_release(cx_ucx_t *b, cx_ucx_op_t *op)
{
    if (op->pending > 0) op->pending--;
    if (!op->pending && op->finished && !op->x) {
        cx_ucx_list_del(op);
        cx_ucx_op_free(b, op);
    }
}
