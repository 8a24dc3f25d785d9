/* Target-side staging: one-sided ops on a peer's device memory that the pair's backend cannot
 * reach.
 *
 * An RDMA backend reaches a peer's GPU memory only with GPUDirect at the peer. Without it, the
 * peer registers the region with no key for that backend, and ops on it go to the peer's core
 * over the control connection instead: RMA_REQ frames of at most CX_RSTAGE_CHUNK bytes, at most
 * CX_RSTAGE_WINDOW of them in flight per op, which the target checks against its registry and
 * serves with a device-aware copy, answering RMA_RESP. put_signal's message follows in its own
 * frame once every chunk is in place. The initiator's buffer may be device memory too (copied
 * in and out the same way).
 *
 * Bytes land only when their answer finds its op still waiting, on the progress thread: an op
 * that timed out or failed takes no late bytes. Backends that serve every request in software
 * (`software_target`, zmq) reach device memory themselves and never come here. */
#ifndef CX_RSTAGE_H
#define CX_RSTAGE_H

#include "engine.h"

#define CX_RSTAGE_CHUNK (1u << 20)
#define CX_RSTAGE_WINDOW 4

/* Does this op on this remote region go through the target's core? */
int cx_rstage_wanted(cx_engine_t *e, const cx_peer_t *p, const cx_rregion_t *rr);
/* Initiator: start the op (OPS_RSTAGE); it completes through cx_op_finish. */
void cx_rstage_start(cx_engine_t *e, cx_op_t *op);
/* Control frames from peer p: a request to serve, an answer to one of ours. */
void cx_rstage_on_req(cx_engine_t *e, cx_peer_t *p, const uint8_t *body, size_t len);
void cx_rstage_on_resp(cx_engine_t *e, cx_peer_t *p, const uint8_t *body, size_t len);
/* Should a region of this memory kind be registered with backend b? (device memory: only when
 * the backend reaches it itself: GPUDirect, or a software target) */
int cx_rstage_register_with(cx_engine_t *e, int b, int mem_kind);

#endif
