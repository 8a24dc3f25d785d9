/* Same-host one-sided copies (cma.h). */
#include "cma.h"

#include "connex/connex.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

int cx_cma_self_init(cx_cma_self_t *s)
{
    memset(s, 0, sizeof *s);
    s->pid = (uint32_t)getpid();
    if (getrandom(s->cookie, sizeof s->cookie, 0) != (ssize_t)sizeof s->cookie) return CX_ERR;
    if (!s->cookie[0] && !s->cookie[1]) s->cookie[0] = 1; /* never all zero: unmapped reads as that */
    return CX_OK;
}

static void put_le(uint8_t *o, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) o[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *in, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)in[i] << (8 * i);
    return v;
}

void cx_cma_adv_put(const cx_cma_self_t *s, uint8_t out[CX_CMA_ADV_LEN])
{
    put_le(out, s->pid, 4);
    put_le(out + 4, (uint64_t)(uintptr_t)s->cookie, 8);
    put_le(out + 12, s->cookie[0], 8);
    put_le(out + 20, s->cookie[1], 8);
}

void cx_cma_adv_get(const uint8_t in[CX_CMA_ADV_LEN], cx_cma_peer_t *p)
{
    p->pid = (uint32_t)get_le(in, 4);
    p->cookie_addr = get_le(in + 4, 8);
    p->cookie[0] = get_le(in + 12, 8);
    p->cookie[1] = get_le(in + 20, 8);
    p->ok = 0;
    p->matched_ns = 0;
}

static int cma_errno(int e)
{
    switch (e) {
    case ESRCH: return CX_EPEER;
    case EFAULT: return CX_EINVAL;
    case EPERM:
    case EACCES:
    case ENOSYS: return CX_EUNSUPPORTED;
    default: return CX_ERR;
    }
}

static void iov_skip(struct iovec **v, unsigned *n, size_t k)
{
    while (*n && k >= (*v)->iov_len) {
        k -= (*v)->iov_len;
        (*v)++;
        (*n)--;
    }
    if (*n) {
        (*v)->iov_base = (char *)(*v)->iov_base + k;
        (*v)->iov_len -= k;
    }
}

/* process_vm_readv or _writev of `nl` / `nr` iovecs (modified: what was copied is skipped),
 * continued after a short copy: the kernel stops at the first page it cannot reach, and the
 * next call then fails with the reason. */
static int cma_copy(int write, pid_t pid, struct iovec *l, unsigned nl, struct iovec *r, unsigned nr, size_t total)
{
    size_t done = 0;
    for (int tries = 0; done < total && tries < 64; tries++) {
        ssize_t got = write ? process_vm_writev(pid, l, nl, r, nr, 0) : process_vm_readv(pid, l, nl, r, nr, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return cma_errno(errno);
        }
        if (got == 0) return CX_EINVAL;
        done += (size_t)got;
        iov_skip(&l, &nl, (size_t)got);
        iov_skip(&r, &nr, (size_t)got);
    }
    return done == total ? CX_OK : CX_ERR;
}

static int cma_readv(pid_t pid, struct iovec *l, unsigned nl, struct iovec *r, unsigned nr, size_t total)
{
    return cma_copy(0, pid, l, nl, r, nr, total);
}

static uint64_t cma_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cookie_matches(cx_cma_peer_t *p, const uint64_t got[2])
{
    int ok = got[0] == p->cookie[0] && got[1] == p->cookie[1];
    p->matched_ns = ok ? cma_now_ns() : 0;
    return ok;
}

int cx_cma_peer_probe(cx_cma_peer_t *p)
{
    p->ok = 0;
    if (!p->pid || !p->cookie_addr) return CX_EINVAL;
    uint64_t got[2] = { 0, 0 };
    struct iovec l = { got, sizeof got }, r = { (void *)(uintptr_t)p->cookie_addr, sizeof got };
    int rc = cma_readv((pid_t)p->pid, &l, 1, &r, 1, sizeof got);
    /* Another host, another pid namespace: the pid names another process or none. */
    if (rc == CX_EPEER || rc == CX_EINVAL || (rc == CX_OK && !cookie_matches(p, got))) return CX_EUNSUPPORTED;
    if (rc != CX_OK) return rc;
    p->ok = 1;
    return CX_OK;
}

int cx_cma_copyv(cx_cma_peer_t *p, int write, const cx_cma_seg_t *segs, size_t n)
{
    if (!p->ok || !n || n > CX_CMA_SEGS_MAX) return CX_EINVAL;
    struct iovec l[CX_CMA_SEGS_MAX + 1], r[CX_CMA_SEGS_MAX + 1];
    uint64_t got[2] = { 0, 0 };
    size_t total = 0;
    unsigned k = 0;
    if (!write) { /* the cookie in the same call, first: the pid cannot change under it */
        l[0] = (struct iovec){ got, sizeof got };
        r[0] = (struct iovec){ (void *)(uintptr_t)p->cookie_addr, sizeof got };
        k = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!segs[i].len) return CX_EINVAL;
        l[k] = (struct iovec){ segs[i].local, segs[i].len };
        r[k] = (struct iovec){ (void *)(uintptr_t)segs[i].remote, segs[i].len };
        total += segs[i].len;
        k++;
    }
    if (write && p->matched_ns && cma_now_ns() - p->matched_ns < CX_CMA_COOKIE_NS) {
        int rc = cma_copy(1, (pid_t)p->pid, l, k, r, k, total); /* matched just now (cma.h) */
        if (rc == CX_EPEER) p->matched_ns = 0;
        return rc;
    }
    if (write) { /* the cookie just before: a pid reused in between would have to wrap around */
        struct iovec cl = { got, sizeof got }, cr = { (void *)(uintptr_t)p->cookie_addr, sizeof got };
        int rc = cma_readv((pid_t)p->pid, &cl, 1, &cr, 1, sizeof got);
        if (rc == CX_EINVAL || (rc == CX_OK && !cookie_matches(p, got))) return CX_EPEER;
        if (rc != CX_OK) return rc;
        return cma_copy(1, (pid_t)p->pid, l, k, r, k, total);
    }
    int rc = cma_readv((pid_t)p->pid, l, k, r, k, sizeof got + total);
    if (rc == CX_OK && !cookie_matches(p, got)) return CX_EPEER;
    return rc;
}

const char *cx_cma_why(int rc)
{
    switch (rc) {
    case CX_OK: return "ok";
    case CX_EPEER: return "its process is gone or was replaced";
    case CX_EINVAL: return "range not mapped there";
    case CX_EUNSUPPORTED: return "not permitted, or another host or pid namespace";
    default: return "error";
    }
}

int cx_cma_read(cx_cma_peer_t *p, void *dst, uint64_t src, size_t len)
{
    cx_cma_seg_t s = { dst, src, len };
    return cx_cma_copyv(p, 0, &s, 1);
}

int cx_cma_write(cx_cma_peer_t *p, uint64_t dst, const void *src, size_t len)
{
    cx_cma_seg_t s = { (void *)(uintptr_t)src, dst, len };
    return cx_cma_copyv(p, 1, &s, 1);
}
