/* The group step envelope and the receiver's duplicate window (step.c), for group.c and tests.
 * A step message on the wire: 24 bytes, little endian, then the caller's payload:
 *   u64 CX_STEP_MAGIC, u64 receiver incarnation, u64 step id (per sender incarnation, from 1). */
#ifndef CX_STEP_H
#define CX_STEP_H

#include <stddef.h>
#include <stdint.h>

#define CX_STEP_MAGIC 0x0a31504554535843ull /* "CXSTEP1\n" read as little endian */
#define CX_STEP_HDR 24
/* Step ids tracked per sender below the highest seen: older ones count as duplicates. */
#define CX_STEP_WINDOW 4096u

void cx_step_hdr_put(uint8_t *hdr, uint64_t receiver_incarnation, uint64_t step);

/* One sender's window: the highest id seen and a bitmap of the CX_STEP_WINDOW ids up to it. */
typedef struct cx_step_win {
    uint64_t top;
    uint64_t bits[CX_STEP_WINDOW / 64];
} cx_step_win_t;
/* 1: id is new (now recorded), 0: seen before or older than the window. id 0 is never new. */
int cx_step_win_accept(cx_step_win_t *w, uint64_t id);
/* Forget id again (the message it came in could not be queued: the sender will retry). */
void cx_step_win_undo(cx_step_win_t *w, uint64_t id);

#endif
