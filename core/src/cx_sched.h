/* (Named cx_sched.h: core/src is on the include path, where "sched.h" would hide <sched.h>.) */
/* Traffic classes: per-peer credits and chunked background transfers (docs/semantics.md,
 * "Traffic classes"). Runs on the progress thread only.
 *
 * Every op that goes to a peer passes cx_sched_admit (from cx_op_issue). Per peer and class the
 * scheduler counts the ops holding a credit (from issue to completion, region queries included)
 * and keeps a FIFO of ops waiting for one (stage OPS_WAIT_CREDIT, still linked to the peer, so
 * the timeout and peer-failure paths see them). A critical op takes a credit when fewer than
 * credits_critical are out and nobody waits before it. A batch's run (batch.h) weighs as many
 * credits as it has entries: it goes when they fit, or when nothing else is out, and gives
 * them back as its entries complete (a few at a time, cx_sched_entries_done).
 *
 * A background read or write of host memory becomes a "parent" (stage OPS_CHUNKED): it leaves
 * the peer's op list for the peer's background list, and cx_sched_pump cuts it into chunks of
 * background_chunk bytes (ops of kind CX_OPK_CHUNK, linked to the peer like any op). A chunk
 * starts only when the peer's background ops in flight are below credits_background, no critical
 * op waits for a credit, and - while critical ops are in flight or were within 2 ms - no other
 * background chunk is; chunks started then are background_chunk / 16 (at least 4 KiB).
 * The parent completes once every chunk it started completed: first error wins, and after an
 * error no new chunk starts. Background ops of device memory go as one critical-class op (the
 * GPU staging path chunks them itself).
 *
 * Completions only release credits and mark the peer; the waiting ops start from cx_sched_pump,
 * called by the progress loop after the backends, never from inside a backend callback. The
 * entries of one batch that start together there reach their backend in one bulk post (batch.h). */
#ifndef CX_CX_SCHED_H
#define CX_CX_SCHED_H

#include "engine.h"

/* Engine create: defaults (0 = default), bounds, and env CONNEX_CLASSES=off. */
void cx_sched_config(cx_config_t *cfg, const cx_opts_t *o);
/* From cx_op_issue: 0 = the op holds its credit (or classes are off): issue it now; 1 = the
 * scheduler took it (queued for a credit, or a background transfer to be chunked). */
int cx_sched_admit(cx_engine_t *e, cx_op_t *op);
/* ops.c: hand an admitted op to the backend (the body of cx_op_issue past admission). */
void cx_op_go(cx_engine_t *e, cx_op_t *op);
/* From cx_op_finish (op already unlinked from its peer): releases the op's credit; returns 1
 * when the scheduler took the op over (a chunk: it is accounted to its parent and freed). */
int cx_sched_op_finish(cx_engine_t *e, cx_op_t *op, int status);
/* `n` entries of a batch's run came back (batch.c): their credits are free again; the run keeps
 * one until cx_sched_op_finish. */
void cx_sched_entries_done(cx_engine_t *e, cx_op_t *op, uint32_t n);
/* Progress loop, every iteration: starts waiting ops and chunks where credits allow. Returns
 * nonzero when it handed anything to a backend (the loop then polls again without sleeping). */
int cx_sched_pump(cx_engine_t *e);
/* How long the progress thread may sleep (at most max_ms) before background held back for
 * critical ops is due to be looked at again. */
int cx_sched_timeout_ms(cx_engine_t *e, int max_ms);
/* From cx_ops_tick: background transfers that waited op_timeout_ms without a chunk starting. */
void cx_sched_tick(cx_engine_t *e, cx_peer_t *p, uint64_t now);
/* From cx_peer_ops_fail, after the peer's linked ops failed: its background transfers fail. */
void cx_sched_peer_fail(cx_engine_t *e, cx_peer_t *p, int status);
/* Background transfers not yet completed count as ops in flight. */
void cx_sched_stats(cx_engine_t *e, cx_stats_t *st);

#endif
