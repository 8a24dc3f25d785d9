/* Host staging of GPU memory for backends that cannot reach it directly (see docs/gpu.md).
 * Runs on the progress thread, except cx_staging_fini (after it stopped).
 *
 * A staged op (the "parent") stays linked to its peer in stage OPS_STAGING with op->arg pointing
 * at its staging job; each chunk goes to the peer's backend as a "sub" op (kind CX_OPK_SUB,
 * op->arg -> the chunk), also linked to the peer so the op timeout and the peer-failure paths
 * see it. cx_op_finish hands both kinds back here (cx_staging_op_finish); the parent completes
 * exactly once, after every slot it held is back in the ring. */
#ifndef CX_STAGING_H
#define CX_STAGING_H

#include "engine.h"

/* The op's local buffer is device memory its backend cannot register directly: move it through
 * the pinned ring in chunks, overlapping copies with the network. Completes the op. */
void cx_staging_submit(cx_engine_t *e, cx_op_t *op, cx_rregion_t *rr);
/* Does the local memory of this kind need staging on backend bidx? (Nonzero also when the
 * GPUDirect policy refuses the combination: cx_staging_submit then fails the op with why.) */
int cx_staging_needed(cx_engine_t *e, int bidx, int mem_kind);
/* cx_op_finish calls this first for an op with op->arg set (after unlinking it from its peer).
 * Returns 1 when staging took the op over (a sub-xfer, or a parent whose job must drain first:
 * it is completed later), 0 for an op that is none of staging's business. */
int cx_staging_op_finish(cx_engine_t *e, cx_op_t *op, int status);
/* Every progress-loop iteration, after the backends: copy completions, chunk hand-off, op
 * deadlines of staged ops. Cheap when nothing is staged. */
void cx_staging_progress(cx_engine_t *e);
/* Counters into the stats. */
void cx_staging_stats(cx_engine_t *e, cx_stats_t *st);
/* Engine teardown: cancel jobs, free rings (after the backends stopped using them). */
void cx_staging_fini(cx_engine_t *e);

/* The pinned ring of (kind, device), created and registered with every backend at first use:
 * target-side staging (tstage.h) lends its slots to a peer's data backend. */
#define CX_STAGING_RING_ID0 (UINT64_C(1) << 63) /* region ids of rings: never a user region's */
typedef struct cx_staging_ring {
    struct cx_stage *st;
    void *base;
    size_t len;
    uint64_t id;     /* CX_STAGING_RING_ID0 + pipe: a backend's key cache tells it apart */
    void *const *mh; /* per backend index */
    uint8_t *const *key;
    const size_t *key_len;
} cx_staging_ring_t;
int cx_staging_ring(cx_engine_t *e, int kind, int device, cx_staging_ring_t *out);
/* Is [addr, addr+len) inside a ring? A backend that serves reads in software checks the range
 * against the registry (cx_core_region_check), which lets these through as host memory. */
int cx_staging_ring_holds(cx_engine_t *e, uint64_t addr, size_t len);

/* For tests (through cx_exec, any thread but the progress thread): ring slots and live jobs. */
typedef struct cx_staging_debug {
    int pipes, jobs;            /* rings created; staged ops not yet completed */
    int jobs_max;               /* the most staged ops live at once since the previous call */
    unsigned subs;              /* chunks handed to a backend, not yet completed */
    uint32_t slots, slots_free; /* over every ring */
    uint64_t jobs_ok, jobs_failed;
    unsigned served, queued;             /* ranges staged here for peers (tstage.h): running, waiting */
    unsigned ranges;                     /* ranges this side asked a peer to stage, not yet ended */
    unsigned quarantined;                /* slots held for a same-host peer that went silent or failed (tstage.h) */
    uint64_t inline_ranges, chunks_lent; /* target, since start (tstage.h) */
} cx_staging_debug_t;
int cx_staging_debug(cx_engine_t *e, cx_staging_debug_t *out);

#endif
