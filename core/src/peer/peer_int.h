/* What the units of the peer layer call in each other; the rest of the core sees engine.h. */
#ifndef CX_PEER_INT_H
#define CX_PEER_INT_H

#include "../engine.h"

/* table.c */
void cx_peer_set_incarnation(cx_engine_t *e, cx_peer_t *p, uint64_t inc);
void cx_peer_set_url(cx_peer_t *p, const cx_url_t *u);
void cx_peer_adv_free(cx_peer_t *p); /* the data addresses its HELLO advertised */

/* rregion.c: the peer's regions as its HELLO and REG_* frames describe them */
void cx_rregions_free(cx_peer_t *p);
int cx_rregion_add(cx_engine_t *e, cx_peer_t *p, const cx_wire_region_t *w);
/* REG_ADD, REG_DEL, REG_DEL_ACK, REG_QUERY, REG_REPLY from p; 1 when type is one of them. */
int cx_rregion_on_frame(cx_engine_t *e, cx_peer_t *p, uint8_t type, const uint8_t *body, size_t len);

/* hello.c: the handshake */
void cx_hello_send(cx_engine_t *e, cx_conn_t *c, uint8_t type, const cx_lid_t *target);
/* An authentication failure: counted, logged, the handshake ends with CX_EAUTH; returns 1 (c is
 * closed). */
int cx_hello_auth_failed(cx_engine_t *e, cx_conn_t *c, const char *why);
/* A frame on a connection whose handshake has not finished; returns 1 if c was closed. */
int cx_hello_on_frame(cx_engine_t *e, cx_conn_t *c, uint8_t type, const uint8_t *body, size_t len);

/* status.c: the operator's view (connex-ctl) */
/* STATUS_QUERY on a connection that is not a peer's; returns 1 if c was closed. */
int cx_status_on_query(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len);
/* An event went out: to every connection watching. */
void cx_status_event(cx_engine_t *e, const cx_event_t *ev);

/* conn.c */
void cx_peer_dial_failed(cx_engine_t *e, cx_peer_t *p, const char *reason, int fail_status);

/* liveness.c */
uint32_t cx_peer_next_backoff_ms(uint32_t ms);
void cx_peer_left(cx_engine_t *e, cx_peer_t *p); /* BYE: LEFT, no reconnect */
void cx_peer_on_hb(cx_engine_t *e, cx_peer_t *p, const uint8_t *body, size_t len);
void cx_peer_on_death(cx_engine_t *e, cx_peer_t *from, const uint8_t *body, size_t len);

#endif
