/* Same-host copies: host reads and writes between two processes on one host, done by the
 * initiator alone with cross-memory attach (backends/util/cma.h), where UCX has no peer error
 * handling (shared-memory-only UCX_TLS: posix, sysv, cma).
 *
 * Why not UCX's own cma: on such endpoints UCX 1.13 serves small gets and puts with active
 * messages that the target's worker must answer (the target's progress thread wakes for every
 * op: 16 KiB reads and writes took 44 us against 3 us for the raw ucp_get loop, whose target
 * spins), and a cma zcopy that meets a dead target fails an endpoint without error handling,
 * which UCX 1.13 does not survive (ucx_read.c). Here a copy is one process_vm_readv (or a cookie
 * read and one process_vm_writev), done inside the post: nothing to wake, nothing to land late,
 * and a target that is gone or replaced fails the op with CX_EPEER.
 *
 * Used only where both sides agree: the target advertises its cookie after its worker address
 * (CX_UCX_CMA_MAGIC) and marks host regions in their keys (CX_UCX_HOST_MAGIC); the initiator
 * reads the cookie back at connect. Device memory and simulated device memory keep UCX's path,
 * and so do xfers above CONNEX_UCX_CMA_MAX (the copy holds the transports' lock while it runs). */
#include "ucx_int.h"

#include "connex/options.h"

#include <string.h>

void cx_ucx_cma_open(cx_ucx_t *b)
{
    b->cma = cx_opts_num(b->opts, "CONNEX_UCX_CMA", NULL) == 0; /* auto|off */
    b->cma_max = (size_t)cx_opts_num(b->opts, "CONNEX_UCX_CMA_MAX", NULL);
    if (b->cma && cx_cma_self_init(&b->cma_self) != CX_OK) {
        cx_warn("ucx: no random cookie for same-host copies (getrandom failed): not offered");
        b->cma = 0;
    }
}

void cx_ucx_cma_advertise(cx_ucx_t *b, cx_wr_t *w)
{
    if (!b->cma) return;
    uint8_t adv[CX_CMA_ADV_LEN];
    cx_cma_adv_put(&b->cma_self, adv);
    cx_ucx_ext_put(w, CX_UCX_CMA_MAGIC, adv, sizeof adv);
}

/* Only endpoints without peer error handling: elsewhere UCX reaches the peer's memory itself
 * (rc, dc, cma with error handling) or the pair runs over tcp, which a user who asked for tcp
 * means to measure. */
void cx_ucx_cma_connect(cx_ucx_t *b, cx_bep_t *ep, const uint8_t *adv)
{
    memset(&ep->cma, 0, sizeof ep->cma);
    if (!b->cma || !adv || ep->peer_mode) return;
    cx_cma_adv_get(adv, &ep->cma);
    int rc = cx_cma_peer_probe(&ep->cma);
    if (rc == CX_OK)
        cx_debug("ucx: same-host copies with pid %u", (unsigned)ep->cma.pid);
    else
        cx_info("ucx: no same-host copies with pid %u (%s): reads and writes go through UCX", (unsigned)ep->cma.pid,
                cx_cma_why(rc));
}

int cx_ucx_cma_takes(cx_ucx_t *b, const cx_bep_t *ep, const cx_xfer_t *x, const cx_ucx_rk_t *rec)
{
    return ep->cma.ok && rec && rec->host && x->len && x->len <= b->cma_max && x->local_mem == CX_MEM_HOST &&
        x->kind != CX_XFER_MSG && ep->ue && !ep->ue->peer_mode;
}

static int cma_in_range(const cx_xfer_t *x, const cx_ucx_rk_t *rec)
{
    return x->remote >= rec->base && x->remote - rec->base <= rec->len && x->len <= rec->len - (x->remote - rec->base);
}

/* The range is checked here against what the target registered (its key says it), as the
 * target checks a read it answers: the kernel would copy from anything mapped. */
int cx_ucx_cma_copy(cx_ucx_t *b, cx_bep_t *ep, const cx_xfer_t *x, const cx_ucx_rk_t *rec)
{
    if (!cma_in_range(x, rec)) {
        cx_error("ucx: %s of %zu bytes at 0x%llx is outside the peer's region 0x%llx + %llu",
                 x->kind == CX_XFER_READ ? "read" : "write", x->len, (unsigned long long)x->remote,
                 (unsigned long long)rec->base, (unsigned long long)rec->len);
        return CX_EINVAL;
    }
    int rc = x->kind == CX_XFER_READ ? cx_cma_read(&ep->cma, x->local, x->remote, x->len)
                                     : cx_cma_write(&ep->cma, x->remote, x->local, x->len);
    if (rc == CX_OK)
        b->cma_ops++;
    else
        cx_debug("ucx: same-host %s of %zu bytes at 0x%llx (pid %u): %s", x->kind == CX_XFER_READ ? "read" : "write",
                 x->len, (unsigned long long)x->remote, (unsigned)ep->cma.pid, cx_cma_why(rc));
    return rc;
}

/* Runs of reads or of writes, each run one call (CX_CMA_SEGS_MAX at most), CONNEX_UCX_CMA_MAX
 * bytes in all: the post holds the transports' lock no longer than one op's copy may. Only
 * entries of up to a sixteenth of that: larger ones go through UCX, where the target answers
 * them in a pipeline at the raw loop's pace (128 x 1 MiB reads: 0.87 of it), and a batch
 * whose first entry was copied and the rest not, its credits coming back one copy at a time,
 * took 1.5 times the raw loop. What a copy does not take, or takes out of range, is left to
 * cx_ucx_submit_copied, which says why (or posts it through UCX). */
void cx_ucx_cma_batch(cx_ucx_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    if (!b->cma || !ep->cma.ok || ep->failed || !ep->ue || ep->ue->peer_mode) return;
    cx_cma_seg_t seg[CX_CMA_SEGS_MAX];
    size_t idx[CX_CMA_SEGS_MAX];
    size_t budget = b->cma_max;
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        int kind = -1;
        for (; i < n && k < CX_CMA_SEGS_MAX; i++) {
            cx_xfer_t *x = xs[i];
            ucp_rkey_h rk;
            const cx_ucx_rk_t *rec = NULL;
            if ((x->kind != CX_XFER_READ && x->kind != CX_XFER_WRITE) || !x->local ||
                cx_ucx_rkey_get(ep->ue, x, &rk, &rec) != CX_OK || !cx_ucx_cma_takes(b, ep, x, rec) ||
                !cma_in_range(x, rec) || x->len > budget || x->len > b->cma_max / 16)
                continue;
            if (kind >= 0 && x->kind != kind) break; /* the next run starts here */
            kind = x->kind;
            budget -= x->len;
            seg[k] = (cx_cma_seg_t){ x->local, x->remote, x->len };
            idx[k++] = i;
        }
        if (!k) continue;
        int rc = cx_cma_copyv(&ep->cma, kind == CX_XFER_WRITE, seg, k);
        if (rc == CX_OK)
            b->cma_ops += k;
        else
            cx_debug("ucx: %zu same-host %s (pid %u): %s", k, kind == CX_XFER_READ ? "reads" : "writes",
                     (unsigned)ep->cma.pid, cx_cma_why(rc));
        for (size_t m = 0; m < k; m++) rcs[idx[m]] = rc;
    }
}
