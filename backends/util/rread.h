/* Reads answered by the target: the reader asks for a window of the read (address, length), the
 * target checks the range against its registry and answers with the bytes in parts of at most a
 * transport's eager size, each naming its offset; the reader copies a part into the caller's
 * buffer only while the read still waits (it is in the ack table), so that nothing lands after
 * the read ended. UCX (shared memory without peer error handling) and libfabric (tcp reads
 * up to CONNEX_FI_READ_INLINE) both serve reads this way; what differs is how a part travels.
 *
 * Reader: cx_rread_window gives the next window to ask for, cx_rread_take checks and copies one
 * part. Target: cx_rread_parts / cx_rread_part cut an answer into parts. */
#ifndef CX_UTIL_RREAD_H
#define CX_UTIL_RREAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct cx_rread {
    size_t got;          /* bytes of the read in the caller's buffer so far */
    size_t win, win_end; /* the window asked for last: [win, win_end) */
} cx_rread_t;

enum {
    CX_RREAD_MORE = 1, /* more parts of this window to come */
    CX_RREAD_ASK = 2,  /* this window is in: ask for the next (cx_rread_window) */
    CX_RREAD_DONE = 3, /* the whole read is in */
    CX_RREAD_BAD = -1  /* out of order, empty or past the window: the read fails */
};

/* The next window of a read of `total` bytes, at most `max` long: its offset in *off; returns its
 * length, 0 when the read is complete. */
size_t cx_rread_window(cx_rread_t *r, size_t total, size_t max, size_t *off);

/* One part of the answer: `len` bytes at offset `off` of the read (not of the window). Parts come
 * in order (one sender, one ordered channel). Copies into dst + off when the part is the one
 * expected; returns CX_RREAD_* . */
int cx_rread_take(cx_rread_t *r, void *dst, size_t total, size_t off, const void *data, size_t len);

/* Target: an answer of n bytes in parts of at most `part` bytes (1 part when n is 0: a refusal
 * carries no bytes). */
size_t cx_rread_parts(size_t n, size_t part);
size_t cx_rread_part(size_t n, size_t part, size_t i, size_t *off); /* its length; offset in *off */

#endif
