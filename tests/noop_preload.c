/* noop_preload: an LD_PRELOAD module that turns chosen data ops of the public API into no-ops
 * that return 0, so that a program which claims to verify its transfers (connex-demo,
 * connex-bench transfer) can be shown to notice when nothing moved (tests/noop_verify.cmake).
 *
 * CXT_NOOP_OPS   comma list of read, write, put_signal (default: all three)
 *                read:       cx_read, cx_read_async
 *                write:      cx_write, cx_write_async
 *                put_signal: cx_put_signal moves no data but still sends its message (through
 *                            cx_send_msg), so the receiver sees the signal of a write that never
 *                            happened: the case a check at arrival must catch
 * CXT_NOOP_SKIP  the first N calls of each chosen kind go through (default 0), so a check that
 *                looks only at an op's first call is caught too
 *
 * A skipped async call hands out a marker op that the interposed cx_op_wait completes with 0.
 * The interposition works on programs that link libconnex dynamically (bench/CMakeLists.txt). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "connex/connex.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_READ, K_WRITE, K_PUTSIG, K_COUNT };
static const char *const kind_names[K_COUNT] = { "read", "write", "put_signal" };

static int chosen[K_COUNT];
static long skip;
static atomic_long calls[K_COUNT];
static char marker; /* the op handed out by a skipped async call */
#define MARKER ((cx_op_t *)(void *)&marker)

__attribute__((constructor)) static void noop_init(void)
{
    const char *ops = getenv("CXT_NOOP_OPS");
    const char *sk = getenv("CXT_NOOP_SKIP");
    skip = sk ? strtol(sk, NULL, 10) : 0;
    if (skip < 0) skip = 0;
    for (int k = 0; k < K_COUNT; k++) {
        if (!ops || !*ops) {
            chosen[k] = 1;
            continue;
        }
        size_t n = strlen(kind_names[k]);
        for (const char *p = ops; *p;) {
            const char *c = strchr(p, ',');
            size_t l = c ? (size_t)(c - p) : strlen(p);
            if (l == n && !strncmp(p, kind_names[k], n)) chosen[k] = 1;
            if (!c) break;
            p = c + 1;
        }
    }
}

/* 1: this call of kind k does nothing. */
static int noop(int k)
{
    return chosen[k] && atomic_fetch_add(&calls[k], 1) >= skip;
}

static void *next(const char *sym)
{
    void *f = dlsym(RTLD_NEXT, sym);
    if (!f) {
        fprintf(stderr, "noop_preload: %s not found\n", sym);
        abort();
    }
    return f;
}

int cx_read(cx_engine_t *e, const char *peer, void *dst, uint64_t remote_src, size_t len)
{
    if (noop(K_READ)) return 0;
    int (*f)(cx_engine_t *, const char *, void *, uint64_t, size_t) = next("cx_read");
    return f(e, peer, dst, remote_src, len);
}

int cx_write(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len)
{
    if (noop(K_WRITE)) return 0;
    int (*f)(cx_engine_t *, const char *, const void *, uint64_t, size_t) = next("cx_write");
    return f(e, peer, src, remote_dst, len);
}

int cx_read_async(cx_engine_t *e, const char *peer, void *dst, uint64_t remote_src, size_t len, cx_class_t cls,
                  cx_op_t **op)
{
    if (noop(K_READ)) {
        *op = MARKER;
        return 0;
    }
    int (*f)(cx_engine_t *, const char *, void *, uint64_t, size_t, cx_class_t, cx_op_t **) = next("cx_read_async");
    return f(e, peer, dst, remote_src, len, cls, op);
}

int cx_write_async(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len, cx_class_t cls,
                   cx_op_t **op)
{
    if (noop(K_WRITE)) {
        *op = MARKER;
        return 0;
    }
    int (*f)(cx_engine_t *, const char *, const void *, uint64_t, size_t, cx_class_t, cx_op_t **) =
        next("cx_write_async");
    return f(e, peer, src, remote_dst, len, cls, op);
}

int cx_put_signal(cx_engine_t *e, const char *peer, const void *src, uint64_t remote_dst, size_t len, const void *msg,
                  size_t msg_len, cx_op_t **op)
{
    if (noop(K_PUTSIG)) {
        int (*send)(cx_engine_t *, const char *, const void *, size_t) = next("cx_send_msg");
        int rc = send(e, peer, msg, msg_len);
        if (rc == 0) *op = MARKER;
        return rc;
    }
    int (*f)(cx_engine_t *, const char *, const void *, uint64_t, size_t, const void *, size_t, cx_op_t **) =
        next("cx_put_signal");
    return f(e, peer, src, remote_dst, len, msg, msg_len, op);
}

int cx_op_wait(cx_op_t *op, int timeout_ms)
{
    if (op == MARKER) return 0;
    int (*f)(cx_op_t *, int) = next("cx_op_wait");
    return f(op, timeout_ms);
}
