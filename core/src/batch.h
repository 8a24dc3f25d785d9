/* Batches (cx_batch_read / _write / _put_signal): one command for many entries, one completion.
 *
 * A batch is a parent op (CX_OPK_BATCH) that the caller submits or drives like any op; its start
 * runs in phases, each a set of child ops that go the way single ops go (credits, classes,
 * timeouts, peer failure), so a batch ends the way its entries do:
 *   1. peers: each distinct peer resolved once; one not up yet is connected first. An unknown
 *      peer refuses the batch; the entries of a failed one end with its status.
 *   2. checks: every entry's remote range against what its peer registered; a miss asks the
 *      peer (a region query child), and a range it does not hold refuses the batch.
 *   3. transfers: every entry started at once. Critical entries of host memory to one peer, one
 *      local and one remote region go as runs: one op each (CX_OPK_READ/WRITE with nent set),
 *      which holds a credit per entry and passes the single op's steps once, then hands its
 *      entries to the backend as plain xfers in one submit_batch, and completes when the last
 *      one is back (entries that are not ops: about a quarter of a single op's instructions,
 *      docs/semantics.md). The others (background class, device memory, ranges the target
 *      stages, more distinct runs than CX_BATCH_RUNS_OPEN at once) go as child ops, each the
 *      way a single op goes; those reaching a backend with submit_batch are collected and
 *      posted per endpoint in one call (backend.h).
 *   4. put_signal only: the last entry with the message, once the others completed.
 * A child's completion only counts down its phase; the phase's last one queues the batch for
 * cx_batches_progress, which runs after the backends in every progress turn. */
#ifndef CX_BATCH_H
#define CX_BATCH_H

#include "engine.h"

typedef struct cx_batch cx_batch_t;

/* Under plock, from go_backend: a run (op->nent) whose ranges were checked and whose x holds
 * the regions' handle and key: every entry posted to the peer's backend as an xfer of its own. */
void cx_brun_post(cx_engine_t *e, cx_op_t *op);
/* Under plock, from cx_core_xfer_done: an entry of a run (x->core) completed. */
void cx_brun_xfer_done(cx_engine_t *e, cx_xfer_t *x, int status);

/* Under plock (cx_op_start of a CX_OPK_BATCH op). */
void cx_batch_start(cx_engine_t *e, cx_op_t *op);
/* Under plock, every progress turn: batches whose phase ended go on. */
void cx_batches_progress(cx_engine_t *e);
/* Engine destroy, after every op was failed: batches complete; no phase starts any more. */
void cx_batches_close(cx_engine_t *e);
/* The batch's memory, with its parent op (cx_op_destroy). */
void cx_batch_free(cx_batch_t *b);
/* go_backend, with e->bpost set: the xfer is collected for the batch's bulk post instead of
 * being submitted alone. Returns 1 when collected. */
int cx_bpost_take(cx_engine_t *e, cx_op_t *op);
/* The scheduler admitting ops that waited for credits (cx_sched.h): the batch op belongs to, when
 * it is a batch's transfer, else NULL. Between cx_bpost_open (1: open; 0: another bulk post is
 * open, the ops go alone) and cx_bpost_close, the entries of that batch started are posted in bulk
 * as its first ones were. */
cx_batch_t *cx_batch_of(cx_op_t *op);
int cx_bpost_open(cx_engine_t *e, cx_batch_t *b);
void cx_bpost_close(cx_engine_t *e, cx_batch_t *b);

#endif
