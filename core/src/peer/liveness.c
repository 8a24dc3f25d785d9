/* Liveness: heartbeats and their silence, the probe of a peer a backend reported a transport
 * error for, SUSPECT/FAILED/LEFT, the same-host DEATH report, and reconnecting to a failed peer. */
#include "peer_int.h"

#include "connex/log.h"

#include <stdio.h>
#include <string.h>

/* Reconnecting to a failed peer: a restart takes milliseconds, so the first try comes soon; the
 * wait doubles after each miss, up to one try a second. */
#define CX_RECONNECT_FIRST_MS 20
#define CX_RECONNECT_MAX_MS 1000

uint32_t cx_peer_next_backoff_ms(uint32_t ms)
{
    return ms < CX_RECONNECT_MAX_MS / 2 ? ms * 2 : CX_RECONNECT_MAX_MS;
}

void cx_peer_report_death(cx_engine_t *e, cx_peer_t *dead)
{
    uint8_t buf[128];
    cx_wr_t w;
    cx_wr_init(&w, buf, sizeof buf);
    cx_wire_put_death(&w, &dead->lid, dead->incarnation);
    if (!w.ok) return;
    for (cx_peer_t *p = e->peers; p; p = p->next)
        if (p != dead && p->conn && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT))
            cx_conn_send(e, p->conn, CX_CTL_DEATH, buf, w.len);
}

void cx_peer_drop_ep(cx_engine_t *e, cx_peer_t *p, int status)
{
    if (!p->ep) return;
    for (cx_op_t *op = p->ops.next; op != &p->ops; op = op->next)
        if (op->stage == OPS_IN_BACKEND && !op->forced_status) op->forced_status = status;
    cx_bep_t *ep = p->ep;
    p->ep = NULL;
    e->be[p->bidx].ops->disconnect(e->be[p->bidx].b, ep, status);
}

/* A probe is a heartbeat with a body: u8 CX_HB_PROBE and a u64 id; the peer answers at once with
 * u8 CX_HB_ANSWER and the same id. A peer that predates probes ignores the body of a heartbeat:
 * its probe ends at the deadline, answered by whatever was heard from it since. */
enum { CX_HB_PROBE = 1, CX_HB_ANSWER = 2 };

static void send_probe(cx_engine_t *e, cx_conn_t *c, uint8_t kind, uint64_t id)
{
    uint8_t body[9];
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u8(&w, kind);
    cx_wr_u64(&w, id);
    cx_conn_send(e, c, CX_CTL_HB, body, w.len);
}

/* The probe ended and the peer is alive: SUSPECT no more, and the ops that waited for the
 * verdict end with a local error. */
static void probe_answered(cx_engine_t *e, cx_peer_t *p, const char *how)
{
    p->probing = 0;
    cx_info("peer %s: probe answered (%s): the peer is alive", p->url, how);
    if (p->state == CX_PEER_SUSPECT) {
        p->state = CX_PEER_UP;
        p->suspect_reported = 0;
        cx_event_emit(e, p, CX_EVENT_UP, "recovered (probe answered)");
    }
    cx_ops_verdict_alive(e, p);
    /* The data endpoint the error closed comes back now, not at our next op: the peer closed its
     * own when the probe came (cx_peer_on_hb) and opens a new one for its next op, and UCX pairs
     * the endpoints two workers make to each other in the order they are made, so both sides
     * make one each time. A request of the peer that comes first waits for it in the backend
     * (cx_core_peer_want_ep). */
    if (!p->ep && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) (void)cx_peer_ensure_ep(e, p);
}

void cx_peer_probe(cx_engine_t *e, cx_peer_t *p, const char *reason)
{
    if (p->state != CX_PEER_UP && p->state != CX_PEER_SUSPECT) return;
    cx_warn("peer %s: %s: suspect, probing it over the control connection", p->url, reason);
    if (p->state == CX_PEER_UP) {
        p->state = CX_PEER_SUSPECT;
        cx_event_emit(e, p, CX_EVENT_SUSPECT, reason);
    }
    int first = !p->probing;
    if (first) {
        p->probing = 1;
        p->probe_id++;
        p->probe_sent_ns = cx_now_ns();
    }
    /* The connection the error came from is closed; the next op opens a new one. Its ops end
     * with what the backend says (CX_EPEER: they wait for the verdict, cx_core_xfer_done). */
    if (p->ep) {
        cx_bep_t *ep = p->ep;
        p->ep = NULL;
        e->be[p->bidx].ops->disconnect(e->be[p->bidx].b, ep, CX_EPEER);
    }
    if (first && p->conn) send_probe(e, p->conn, CX_HB_PROBE, p->probe_id);
}

static void close_conns(cx_engine_t *e, cx_peer_t *p)
{
    if (p->conn) cx_conn_close(e, p->conn);
    if (p->pending) cx_conn_close(e, p->pending);
}

void cx_peer_fail(cx_engine_t *e, cx_peer_t *p, const char *reason)
{
    int was_up = p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT;
    p->probing = 0;
    /* A pending outgoing connection survives: it is how the peer gets back. */
    if (p->conn) cx_conn_close(e, p->conn);
    cx_peer_drop_ep(e, p, CX_EPEER);
    cx_peer_ops_fail(e, p, CX_EPEER);
    cx_rregions_free(p);
    /* Its endpoint is gone: no backend asks about this process any more (an exit fd handed out
     * is the backend's own), and a failed peer holds no fd. Its next HELLO follows it again. */
    cx_proc_forget(&p->proc);
    if (was_up) {
        p->state = CX_PEER_FAILED;
        cx_event_emit(e, p, CX_EVENT_FAILED, reason);
    } else if (p->state == CX_PEER_CONNECTING && !p->ever_up) {
        p->state = CX_PEER_UNKNOWN;
    } else if (p->state == CX_PEER_CONNECTING) {
        p->state = CX_PEER_FAILED;
    }
    if (p->ever_up && p->state == CX_PEER_FAILED) {
        /* Keep knocking: a process restarted on the same port rejoins even if it does not know
         * us. Start fast (a restart takes milliseconds), back off to one attempt a second. */
        p->reconnect = 1;
        p->backoff_ms = CX_RECONNECT_FIRST_MS;
        p->next_reconnect_ns = cx_now_ns() + cx_ms_to_ns(CX_RECONNECT_FIRST_MS);
    }
}

void cx_peer_left(cx_engine_t *e, cx_peer_t *p)
{
    p->probing = 0;
    close_conns(e, p);
    cx_peer_drop_ep(e, p, CX_EPEER);
    cx_peer_ops_fail(e, p, CX_EPEER);
    cx_rregions_free(p);
    cx_proc_forget(&p->proc);
    p->state = CX_PEER_LEFT;
    p->reconnect = 0;
    cx_event_emit(e, p, CX_EVENT_LEFT, "clean close (BYE)");
}

void cx_peer_heard(cx_engine_t *e, cx_peer_t *p)
{
    p->last_rx_ns = cx_now_ns();
    /* While probed it stays SUSPECT until its answer (a frame sent before could be in flight). */
    if (p->state == CX_PEER_SUSPECT && !p->probing) {
        p->state = CX_PEER_UP;
        p->suspect_reported = 0;
        cx_event_emit(e, p, CX_EVENT_UP, "recovered");
    }
}

void cx_peers_tick(cx_engine_t *e, uint64_t now)
{
    uint64_t hb = cx_ms_to_ns(e->cfg.heartbeat_ms);
    uint64_t hbt = cx_ms_to_ns(e->cfg.heartbeat_timeout_ms);
    /* SUSPECT one heartbeat interval before FAILED, but not before half the timeout. */
    uint64_t suspect = hbt - hb > hbt / 2 ? hbt - hb : hbt / 2;
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        if (p->conn && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT)) {
            uint64_t quiet = now - p->last_rx_ns;
            if (p->probing && now - p->probe_sent_ns >= hbt) {
                /* No answer: a peer that predates probes is alive if it was heard since. */
                if (p->last_rx_ns > p->probe_sent_ns) {
                    probe_answered(e, p, "heard from it, no answer");
                } else {
                    cx_peer_fail(e, p, "probe unanswered for the heartbeat timeout");
                    continue;
                }
            }
            if (quiet >= hbt) {
                char why[96];
                snprintf(why, sizeof why, "no heartbeat for %llu ms", (unsigned long long)cx_ns_to_ms(quiet));
                cx_peer_fail(e, p, why);
                continue;
            }
            if (quiet >= suspect && p->state == CX_PEER_UP) {
                char why[96];
                snprintf(why, sizeof why, "no heartbeat for %llu ms", (unsigned long long)cx_ns_to_ms(quiet));
                p->state = CX_PEER_SUSPECT;
                cx_event_emit(e, p, CX_EVENT_SUSPECT, why);
            }
            if (now - p->last_tx_ns >= hb) cx_conn_send(e, p->conn, CX_CTL_HB, NULL, 0);
        }
        if (p->pending && now - p->pending->t_start_ns >= hbt) {
            cx_conn_close(e, p->pending);
            cx_peer_dial_failed(e, p, "handshake not answered", 0);
        }
        if (!p->conn && !p->pending) {
            if (p->state == CX_PEER_FAILED && p->reconnect && now >= p->next_reconnect_ns) {
                p->backoff_ms = cx_peer_next_backoff_ms(p->backoff_ms);
                p->next_reconnect_ns = now + cx_ms_to_ns(p->backoff_ms);
                cx_peer_dial(e, p);
            } else if (p->state == CX_PEER_CONNECTING) {
                cx_peer_dial(e, p); /* a handshake that was cut: try again */
            }
        }
    }
    /* Inbound connections that never said HELLO (scanners, garbage) do not stay forever. */
    for (cx_conn_t *c = e->conns, *n; c; c = n) {
        n = c->next;
        if (!c->bound && !c->outgoing && !c->watch && now - c->t_start_ns >= hbt) {
            cx_info("control: closing a connection that sent no HELLO in %u ms", e->cfg.heartbeat_timeout_ms);
            cx_conn_close(e, c);
        }
    }
}

void cx_peer_on_hb(cx_engine_t *e, cx_peer_t *p, const uint8_t *body, size_t len)
{
    if (!len) return;
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    uint8_t kind = cx_rd_u8(&r);
    uint64_t id = cx_rd_u64(&r);
    if (!r.ok) return;
    if (kind == CX_HB_PROBE && p->conn) {
        /* The prober closed its side of our data path after a transport error (cx_peer_probe):
         * ours goes too, so that our next op opens a new one instead of sending into a
         * connection the prober no longer answers on (UCX drops what comes for a closed
         * endpoint: our read of the prober's memory waited for the op timeout). Our ops on it end
         * CX_ERR, as the prober's did. */
        if (p->ep) cx_info("peer %s: it probes us after a transport error: closing our data endpoint too", p->url);
        cx_peer_drop_ep(e, p, CX_ERR);
        send_probe(e, p->conn, CX_HB_ANSWER, id);
    } else if (kind == CX_HB_ANSWER && p->probing && id == p->probe_id)
        probe_answered(e, p, "answer");
}

/* One hop, no forwarding: only a watcher reports what it saw itself. A report about another
 * incarnation (already restarted) or a peer not up is stale and dropped. */
void cx_peer_on_death(cx_engine_t *e, cx_peer_t *from, const uint8_t *body, size_t len)
{
    cx_lid_t lid;
    uint64_t inc;
    if (cx_wire_get_death(body, len, &lid, &inc)) {
        cx_warn("peer %s: malformed DEATH ignored", from->url);
        return;
    }
    cx_peer_t *q = cx_peer_find(e, &lid);
    if (q && q != from && q->incarnation == inc && (q->state == CX_PEER_UP || q->state == CX_PEER_SUSPECT)) {
        char why[160];
        snprintf(why, sizeof why, "process exited (seen by %s on its host)", from->lid_str);
        cx_peer_fail(e, q, why);
    }
}
