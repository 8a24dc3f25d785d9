/* Caller-driven progress: a caller that finds the transports free starts its op itself and, for
 * up to the poll window (spin.h), progresses them until the op is done, instead of handing the op
 * to the progress thread and waiting for two thread wake-ups.
 *
 * The progress thread owns the transports through `e->plock`: it holds the lock for the whole of
 * each loop iteration and drops it only while it sleeps in epoll_wait. A caller takes the lock
 * with a trylock, never waits for it, and while it holds it runs exactly what one progress
 * iteration runs after its events (every backend's turn, staging, groups, traffic classes), so
 * everything the progress thread owns stays single-owner. The control connections, timers and
 * same-host watch stay with the progress thread, and so do execs, connecting data endpoints,
 * GPU staging and thread-bound backends (backend.h): a caller hands such ops off. */
#ifndef CX_DRIVE_H
#define CX_DRIVE_H

#include "engine.h"

/* Start `op` on this thread when the transports are free; with `wait`, also progress them for up
 * to the op's poll window or until the op is done. Returns 1 when the op was started here (the
 * caller then waits for it as usual), 0 when it must go through cx_submit. */
int cx_drive(cx_engine_t *e, cx_op_t *op, int wait);

/* A caller whose op went through cx_submit (the lock was busy): until the op is done or its poll
 * window ends, take the lock when it comes free and drive. Returns 1 when the op is done. */
int cx_drive_wait(cx_engine_t *e, cx_op_t *op);

/* Under plock, on a driving caller: leave `op` (started, linked to its peer) for the progress
 * thread, which sends it on its way again (cx_op_go) at its next iteration: a data endpoint to
 * connect, a thread-bound backend, or device memory to stage. */
void cx_drive_handoff(cx_engine_t *e, cx_op_t *op);
/* Under plock: `op` ended while handed off (its peer failed, it timed out). */
void cx_drive_handoff_drop(cx_engine_t *e, cx_op_t *op);

/* CONNEX_DRIVE=0 turns caller-driven progress off (every op goes through the progress thread). */
int cx_drive_enabled(void);

#endif
