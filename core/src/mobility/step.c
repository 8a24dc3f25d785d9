/* Group steps, receiver side: recognise the envelope group.c puts in front of a step, strip it,
 * and drop a step this engine already queued (same sender LID, sender incarnation and step id).
 * Progress thread only (cx_core_deliver_msg), except cx_step_forget_peer(e, NULL) at destroy. */
#include "mobility/mobility.h"
#include "mobility/step.h"

#include "connex/log.h"
#include "engine.h"

#include <stdlib.h>
#include <string.h>

struct cx_step_rx { /* per sender: e->steps_rx */
    cx_lid_t lid;
    uint64_t incarnation;
    cx_step_win_t win;
    struct cx_step_rx *next;
};

static void put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

void cx_step_hdr_put(uint8_t *hdr, uint64_t receiver_incarnation, uint64_t step)
{
    put64(hdr, CX_STEP_MAGIC);
    put64(hdr + 8, receiver_incarnation);
    put64(hdr + 16, step);
}

#define WBIT(id) ((id) % CX_STEP_WINDOW)

int cx_step_win_accept(cx_step_win_t *w, uint64_t id)
{
    if (id == 0) return 0;
    if (id > w->top) {
        /* Slide: the ids between the old top and this one were not seen. */
        if (id - w->top >= CX_STEP_WINDOW)
            memset(w->bits, 0, sizeof w->bits);
        else
            for (uint64_t k = w->top + 1; k < id; k++) w->bits[WBIT(k) / 64] &= ~(1ull << (WBIT(k) % 64));
        w->top = id;
        w->bits[WBIT(id) / 64] |= 1ull << (WBIT(id) % 64);
        return 1;
    }
    if (w->top - id >= CX_STEP_WINDOW) return 0; /* too old to tell: treated as seen */
    uint64_t bit = 1ull << (WBIT(id) % 64);
    if (w->bits[WBIT(id) / 64] & bit) return 0;
    w->bits[WBIT(id) / 64] |= bit;
    return 1;
}

void cx_step_win_undo(cx_step_win_t *w, uint64_t id)
{
    if (id == 0 || id > w->top || w->top - id >= CX_STEP_WINDOW) return;
    w->bits[WBIT(id) / 64] &= ~(1ull << (WBIT(id) % 64));
}

static struct cx_step_rx *rx_get(cx_engine_t *e, cx_peer_t *from)
{
    for (struct cx_step_rx *r = e->steps_rx; r; r = r->next) {
        if (cx_lid_cmp(&r->lid, &from->lid)) continue;
        if (r->incarnation != from->incarnation) {
            /* The sender restarted: its ids start over, the old window means nothing. */
            memset(&r->win, 0, sizeof r->win);
            r->incarnation = from->incarnation;
        }
        return r;
    }
    struct cx_step_rx *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->lid = from->lid;
    r->incarnation = from->incarnation;
    r->next = e->steps_rx;
    e->steps_rx = r;
    return r;
}

int cx_step_accept(cx_engine_t *e, cx_peer_t *from, const void *data, size_t len, const void **payload, size_t *plen,
                   uint64_t *step)
{
    *payload = data;
    *plen = len;
    *step = 0;
    const uint8_t *b = data;
    /* Both the magic and our own random incarnation: a plain message that merely starts with the
     * magic is delivered untouched. */
    if (!from || len < CX_STEP_HDR || get64(b) != CX_STEP_MAGIC || get64(b + 8) != e->incarnation) return 0;
    uint64_t id = get64(b + 16);
    if (id == 0) return 0;
    struct cx_step_rx *r = rx_get(e, from);
    if (!r) return 0; /* out of memory: deliver it, unchecked, rather than lose it */
    *payload = b + CX_STEP_HDR;
    *plen = len - CX_STEP_HDR;
    *step = id;
    if (!cx_step_win_accept(&r->win, id)) {
        e->st.steps_duplicates_dropped++;
        cx_info("step %llu from %s (incarnation %016llx) seen before: dropped", (unsigned long long)id, from->url,
                (unsigned long long)from->incarnation);
        return 2;
    }
    return 1;
}

/* The message carrying this step was refused (queue full): the sender retries it. */
void cx_step_unaccept(cx_engine_t *e, cx_peer_t *from, uint64_t step)
{
    for (struct cx_step_rx *r = e->steps_rx; r; r = r->next)
        if (!cx_lid_cmp(&r->lid, &from->lid) && r->incarnation == from->incarnation) cx_step_win_undo(&r->win, step);
}

void cx_step_forget_peer(cx_engine_t *e, cx_peer_t *p)
{
    for (struct cx_step_rx **pp = &e->steps_rx; *pp;) {
        struct cx_step_rx *r = *pp;
        if (p && cx_lid_cmp(&r->lid, &p->lid)) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        free(r);
    }
}
