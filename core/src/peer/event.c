/* Peer events (UP, SUSPECT, FAILED, JOINED, LEFT, MOVED) into the engine's event queue, in an
 * order that the same-host watcher's own reports cannot break. */
#include "peer_int.h"

#include "connex/log.h"
#include "../mobility/mobility.h"

#include <stdio.h>
#include <string.h>

void cx_event_fill(cx_event_t *ev, const cx_lid_t *lid, const char *url, uint64_t inc, cx_event_type_t t,
                   const char *reason)
{
    memset(ev, 0, sizeof *ev);
    ev->type = t;
    ev->peer = *lid;
    snprintf(ev->url, sizeof ev->url, "%s", url);
    snprintf(ev->reason, sizeof ev->reason, "%s", reason ? reason : "");
    ev->incarnation = inc;
    ev->time_ns = cx_now_ns();
}

/* The same-host watcher reports a death from its own thread, at once: handing it to the progress
 * thread first cost a second wake-up, 2-5 ms of the SIGKILL -> FAILED tail on a busy 2-CPU host
 * (connex-bench failover, sigkill). The progress thread learns of it later, so the order is kept here: one
 * FAILED per incarnation, and nothing about a dead incarnation after its FAILED. */
int cx_event_gate(cx_peer_t *p, cx_event_type_t t, uint64_t inc, int watcher)
{
    uint64_t tag = inc + 1;
    if (watcher) {
        if (p->ev_dead == tag || p->ev_inc != tag || p->ev_ended) return 0; /* told already, or a newer one */
        p->ev_dead = tag;
        p->ev_ended = 1;
        return 1;
    }
    /* A dead process neither recovers nor fails twice. LEFT (its directory entry went) and MOVED
     * are about the LID, and still go out. */
    if (p->ev_dead == tag && (t == CX_EVENT_UP || t == CX_EVENT_FAILED || t == CX_EVENT_SUSPECT)) return 0;
    if (t == CX_EVENT_UP || t == CX_EVENT_JOINED) {
        p->ev_inc = tag;
        p->ev_ended = 0;
    } else if ((t == CX_EVENT_FAILED || t == CX_EVENT_LEFT) && p->ev_inc == tag) {
        p->ev_ended = 1;
    }
    return 1;
}

int cx_peer_reported_dead(cx_engine_t *e, cx_peer_t *p)
{
    pthread_mutex_lock(&e->evq.mu);
    int dead = p->ev_dead == p->incarnation + 1;
    pthread_mutex_unlock(&e->evq.mu);
    return dead;
}

void cx_event_emit(cx_engine_t *e, cx_peer_t *p, cx_event_type_t t, const char *reason)
{
    cx_event_t ev;
    cx_event_fill(&ev, &p->lid, p->url, p->incarnation, t, reason);
    if (t == CX_EVENT_FAILED) e->st.peer_failures++, p->m.failures++;
    if (t == CX_EVENT_JOINED) e->st.peer_joins++, p->m.joins++;
    p->m.since_ns = cx_now_ns();
    pthread_mutex_lock(&e->evq.mu);
    int out = cx_event_gate(p, t, p->incarnation, 0);
    if (out) cx_evq_push_locked(&e->evq, &ev);
    /* The same-host watcher queued its FAILED itself, off this thread: watching tools hear it now. */
    int watcher_said = !out && t == CX_EVENT_FAILED && p->ev_dead == p->incarnation + 1;
    pthread_mutex_unlock(&e->evq.mu);
    if (out || watcher_said) cx_status_event(e, &ev);
    if (out)
        cx_log(t == CX_EVENT_FAILED ? CX_LOG_WARN : CX_LOG_INFO, "peer %s: %s%s%s", p->url, cx_event_name(t),
               reason && *reason ? ": " : "", reason ? reason : "");
    else
        cx_debug("peer %s: %s (%s) not reported: the same-host watch reported it dead", p->url, cx_event_name(t),
                 reason ? reason : "");
    cx_groups_on_event(e, p, t);
}

/* ---------------------------------------------------------------- sending */
