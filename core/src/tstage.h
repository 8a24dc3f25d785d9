/* Target-side staging over the pair's data backend: one-sided ops on a peer's device memory that
 * the backend cannot reach (no GPUDirect at the peer). docs/gpu.md draws the pipeline.
 *
 * The initiator asks for a range (TS_REQ on the control connection). The target stages it
 * through its pinned ring (staging.h), chunk by chunk on its copy engine, and hands each chunk's
 * slot to the initiator (TS_CHUNK: slot address and the ring's key for the backend the pair
 * uses). The bytes cross on the data backend, initiated by the initiator in both directions:
 * a read reads the slot after the target's D2H copy filled it; a write writes the slot, then the
 * target copies it H2D. TS_ACK gives the slot back (a read) or says it is full (a write); TS_END
 * ends the range once every slot is back, a write's only after its last H2D copy. put_signal's
 * message follows as a TS_REQ of its own after that TS_END, so it is delivered after the data.
 *
 * Bounded: the ring (CONNEX_STAGE_SLOTS), a range's share of it (CONNEX_STAGE_PER_JOB) and the
 * ranges one peer has staged at once (CONNEX_STAGE_PEER_JOBS); a request past the last waits in
 * its peer's queue. Failure: a chunk's backend xfer is an op linked to the peer (CX_OPK_TSUB),
 * so timeouts and peer failure complete it as any other; a range, and the user's op, ends only
 * after all its xfers did (no byte moves in a caller's buffer after the call returned). The
 * target ends a range whose peer failed (CX_EPEER) or went silent past the op timeout
 * (CX_ETIMEDOUT: it closes the data connection to that peer first), and takes its slots back. */
#ifndef CX_TSTAGE_H
#define CX_TSTAGE_H

#include "engine.h"

/* Does an op on this remote region go through the target's staging (device memory the pair's
 * backend has no key for, at a target that does not serve requests in software)? */
int cx_tstage_wanted(cx_engine_t *e, const cx_peer_t *p, const cx_rregion_t *rr);
/* Should a region of this memory kind be registered with backend b? (device memory: only when
 * the backend reaches it itself: GPUDirect, or a software target; else this side stages it) */
int cx_tstage_register_with(cx_engine_t *e, int b, int mem_kind);
/* Initiator, host memory here: stage the whole op at the target (OPS_TSTAGE). Completes it. */
void cx_tstage_start(cx_engine_t *e, cx_op_t *op);

/* Initiator: one range of the peer's device memory, to or from a registered host buffer (the
 * op's own, or a slot of this side's ring when this side's memory is device memory too). */
typedef struct cx_tstage_range {
    int kind; /* CX_XFER_READ or CX_XFER_WRITE */
    void *local;
    void *local_mh; /* the peer's backend's handle of the local buffer */
    uint64_t remote;
    size_t len;
    const void *msg; /* with signal: delivered at the target after the data */
    size_t msg_len;
    int signal;
    uint64_t deadline_ns;
    void (*done)(void *arg, uint32_t index, int status); /* exactly once, never from inside */
    void *arg;
    uint32_t index;
    int piece; /* a chunk of this side's own staging: the target stages it whole, unsplit */
} cx_tstage_range_t;
int cx_tstage_range(cx_engine_t *e, cx_peer_t *p, const cx_tstage_range_t *r);

/* cx_op_finish calls this for an op with op->ts: 1 when it took the op over. */
int cx_tstage_op_finish(cx_engine_t *e, cx_op_t *op, int status);
/* Control frames TS_REQ, TS_CHUNK, TS_ACK, TS_END from peer p. */
void cx_tstage_on_frame(cx_engine_t *e, cx_peer_t *p, uint8_t type, const uint8_t *body, size_t len);
/* Every progress-loop iteration: deadlines and failed peers, both roles. Cheap when idle. */
void cx_tstage_progress(cx_engine_t *e);
/* Engine teardown, before cx_staging_fini: every range ends (CX_ECLOSED). */
void cx_tstage_fini(cx_engine_t *e);
/* After cx_staging_fini (whose pipelines end the ranges still copying): frees what is left. */
void cx_tstage_free(cx_engine_t *e);

/* For tests: ranges this engine stages as target, and as initiator. */
typedef struct cx_tstage_debug {
    unsigned served, queued, ranges, subs;
    unsigned quarantined;                /* slots held for a same-host peer that went silent or failed */
    uint64_t inline_ranges, chunks_lent; /* target, since start: writes served from TS_REQ's
                                            bytes; slots lent to initiators (TS_CHUNK) */
} cx_tstage_debug_t;
void cx_tstage_debug(cx_engine_t *e, cx_tstage_debug_t *out); /* on the progress thread */

#endif
