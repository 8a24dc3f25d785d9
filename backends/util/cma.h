/* Same-host one-sided copies (Linux cross-memory attach: process_vm_readv / process_vm_writev):
 * the initiator copies straight from or into the target's registered memory, with no work at
 * the target, so a sleeping or stopped target costs nothing. Rules that keep it safe:
 *
 * - A target advertises its pid and the address of a 16-byte cookie (two random words) it keeps
 *   for its whole life (cx_cma_self_t). An initiator uses CMA with that peer only after reading
 *   the cookie back at the advertised pid (cx_cma_peer_probe): that proves same host, same pid
 *   namespace, permission to read (ptrace rules, seccomp) and the right process, and a peer for
 *   which any of these fails keeps the transport's path.
 * - Every read reads the cookie again in the same system call, and a write reads it first unless
 *   it matched within the last CX_CMA_COOKIE_NS: a pid that a dead peer's process left and
 *   another process took fails the copy with CX_EPEER instead of touching a stranger's memory.
 *   For a pid to be taken by another process in between, the target must die, be reaped, and
 *   the kernel's pid counter wrap around pid_max (32768 at least: tens of thousands of forks)
 *   within that window. A target that is gone fails the copy as well (ESRCH).
 * - Ranges are the caller's to check against the target's registry (the initiator holds the
 *   region records, revoked before the target's unregister returns): the kernel checks only that
 *   the pages are mapped (else CX_EINVAL, EFAULT).
 * - A copy is synchronous: when it returns, the bytes are in place; nothing lands later.
 *
 * Depends on libc and connex.h (status codes) only. */
#ifndef CX_UTIL_CMA_H
#define CX_UTIL_CMA_H

#include <stddef.h>
#include <stdint.h>

/* What a process advertises about itself (its cookie lives inside this struct: keep it at a
 * fixed address, in a long-lived object, for as long as peers may copy). */
typedef struct cx_cma_self {
    uint64_t cookie[2];
    uint32_t pid;
} cx_cma_self_t;

/* What an initiator knows of a target. `ok`: probed and usable. */
typedef struct cx_cma_peer {
    uint32_t pid;
    uint64_t cookie_addr;
    uint64_t cookie[2];
    int ok;
    uint64_t matched_ns; /* CLOCK_MONOTONIC of the last read that found the cookie (0: none) */
} cx_cma_peer_t;

/* A write within this long of the cookie's last match does not read it again: a syscall on a
 * virtual machine costs more than a 4 KiB copy (ucx_shm 4 KiB writes: two syscalls, 6.3 us p50
 * where a read, one, takes 3.4). */
#define CX_CMA_COOKIE_NS 1000000u

/* Fill in a fresh random cookie and our pid. Returns CX_OK, or CX_ERR without randomness. */
int cx_cma_self_init(cx_cma_self_t *s);

/* The advertisement: pid, cookie address, cookie (28 bytes, little endian), and its reverse. */
#define CX_CMA_ADV_LEN 28u
void cx_cma_adv_put(const cx_cma_self_t *s, uint8_t out[CX_CMA_ADV_LEN]);
void cx_cma_adv_get(const uint8_t in[CX_CMA_ADV_LEN], cx_cma_peer_t *p); /* p->ok = 0 */

/* Read the peer's cookie back: CX_OK (p->ok set) when it matches; otherwise p->ok stays 0 and
 * the reason is returned (CX_EUNSUPPORTED: not permitted or not the same pid namespace or host;
 * CX_EPEER: no such process; CX_EINVAL: a zero pid or cookie address). */
int cx_cma_peer_probe(cx_cma_peer_t *p);

/* One copy of `len` bytes (> 0). CX_OK; CX_EPEER when the target is gone or the pid is no longer
 * its process; CX_EINVAL when the kernel finds the range unmapped (EFAULT); CX_ERR otherwise. A
 * read may have written part of `dst` when it fails. */
int cx_cma_read(cx_cma_peer_t *p, void *dst, uint64_t src, size_t len);
/* What a status of the calls above means, for a log line (the core's cx_strerror is not a
 * backend's to call: their unit tests link them alone). */
const char *cx_cma_why(int rc);
int cx_cma_write(cx_cma_peer_t *p, uint64_t dst, const void *src, size_t len);

/* Many copies, all reads or all writes, in one system call (a system call costs more than
 * copying 16 KiB on a virtual machine: 128 x 16 KiB reads took 2.8-3.5 us each one by one, 0.8
 * as one call). The same outcome for every segment: CX_OK when all are in place. */
typedef struct cx_cma_seg {
    void *local;
    uint64_t remote;
    size_t len; /* > 0 */
} cx_cma_seg_t;
#define CX_CMA_SEGS_MAX 255u /* a bound on the stack a call takes (IOV_MAX is 1024) */
int cx_cma_copyv(cx_cma_peer_t *p, int write, const cx_cma_seg_t *segs, size_t n);

#endif
