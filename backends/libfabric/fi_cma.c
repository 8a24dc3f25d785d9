/* Same-host copies on shm: host reads and writes between two processes on one host done by the
 * initiator alone with cross-memory attach (backends/util/cma.h), as the ucx backend does
 * (backends/ucx/ucx_cma.c).
 *
 * Why not the provider's own: libfabric 1.17's shm copies with process_vm_writev too, but every
 * op also queues a notice in the target's command queue under a spinlock in the target's region,
 * which the target's progress must drain (fi_bell.c rings it to): the writer spun on that lock
 * while the woken target drained (9% of the writer's profile of 128 x 16 KiB batch writes), and
 * a batch cost a system call per entry. Here a batch's run is one process_vm_readv (or a
 * cookie read and one process_vm_writev) of up to CX_CMA_SEGS_MAX entries, done inside the post:
 * nothing queued at the target, nothing to wake, nothing to land late; a stopped target costs
 * nothing.
 *
 * Used only where both sides agree: the initiator asks for the target's offer (its pid, cookie
 * address and cookie) at its first read or write to it, which goes the provider's way, in a
 * warm-up (fi_caps.c); the target answers with its offer, the initiator reads the cookie back,
 * and from then on copies into regions whose keys say host memory (CX_FI_KEY_HOST). Not at
 * connect: a send to a peer that nothing else talks to yet, destroyed right after the connect
 * (two engines of one process), crashed libfabric 1.17's shm inside the survivor's fi_cq_read
 * (1 test run in 25, none with copies off); asked at the first op, the ask rides traffic that
 * goes to that peer anyway. Ranges: the core checked the xfer
 * against the target's region records before the submit (core/src/ops.c), as it does for every
 * backend. A copy that fails (the target gone or replaced, a range the kernel finds unmapped)
 * ends same-host copies with that peer, and the xfer goes the provider's way, which reports what
 * it finds. Device memory, messages, put_signals, multi-rail and xfers above CX_FI_CMA_MAX keep
 * the provider's path. */
#include "fi_int.h"

#include "connex/options.h"

#include "connex/log.h"

#include <string.h>

_Static_assert(CX_FM_CMA_ADV == CX_CMA_ADV_LEN, "the warm-up carries util/cma.h's advertisement");

/* The largest single xfer copied; a batch's entries up to a sixteenth of it (a larger one gains
 * nothing from sharing a call, and the copy holds the transports while it runs). */
#define CX_FI_CMA_MAX (1u << 20)

void cx_fi_cma_open(cx_backend_t *b)
{
    b->cma = !strcmp(b->prov, "shm") && cx_opts_num(b->opts, "CONNEX_FI_CMA", NULL) == 0; /* auto|off */
    b->cma_max = CX_FI_CMA_MAX;
    if (b->cma && cx_cma_self_init(&b->cma_self) != CX_OK) {
        cx_warn("libfabric: no random cookie for same-host copies (getrandom failed): not offered");
        b->cma = 0;
    }
}

void cx_fi_cma_adv(const cx_backend_t *b, cx_wr_t *w)
{
    uint8_t adv[CX_CMA_ADV_LEN];
    cx_cma_adv_put(&b->cma_self, adv);
    cx_wr_bytes(w, adv, sizeof adv);
}

void cx_fi_cma_heard(cx_backend_t *b, cx_bep_t *ep, const uint8_t *adv)
{
    ep->cma_heard = 1;
    if (!b->cma || ep->cma.ok) return;
    cx_cma_adv_get(adv, &ep->cma);
    int rc = cx_cma_peer_probe(&ep->cma);
    if (rc == CX_OK)
        cx_debug("libfabric: same-host copies with pid %u", (unsigned)ep->cma.pid);
    else
        cx_info("libfabric: no same-host copies with pid %u (%s): reads and writes go through shm",
                (unsigned)ep->cma.pid, cx_cma_why(rc));
}

/* Whether x may be copied: a host read or write into a host region of the peer's. `flags`: its
 * key's (CX_FI_KEY_*). */
static int takes(const cx_backend_t *b, const cx_bep_t *ep, const cx_xfer_t *x, size_t max, uint8_t flags)
{
    return (x->kind == CX_XFER_READ || x->kind == CX_XFER_WRITE) && x->len && x->len <= max && x->local &&
        x->local_mem == CX_MEM_HOST && (flags & CX_FI_KEY_HOST) && x->remote >= x->remote_base && b->cma &&
        ep->cma.ok && !b->owner;
}

/* Copies to this peer not known yet: ask for its offer once (this op goes the provider's way). */
static int unknown(cx_backend_t *b, cx_bep_t *ep)
{
    if (ep->cma.ok) return 0;
    if (!ep->cma_heard && !ep->cma_asked && !b->owner) {
        ep->cma_asked = 1;
        cx_fi_warm_send(b, ep, CX_FM_F_CMA);
    }
    return 1;
}

/* A failed copy: no more with this peer (what failed is the provider's to find and report). */
static void cma_failed(cx_bep_t *ep, int kind, size_t n, int rc)
{
    cx_info("libfabric: %zu same-host %s (pid %u): %s; the provider's path from now on", n,
            kind == CX_XFER_READ ? "reads" : "writes", (unsigned)ep->cma.pid, cx_cma_why(rc));
    ep->cma.ok = 0;
}

int cx_fi_cma_submit(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *x, int *rc)
{
    if (!b->cma || (x->kind != CX_XFER_READ && x->kind != CX_XFER_WRITE) || unknown(b, ep)) return 0;
    cx_fi_key_t k;
    if (cx_fi_key_parse(x->rkey, x->rkey_len, &k) || !takes(b, ep, x, b->cma_max, k.flags)) return 0;
    int r = x->kind == CX_XFER_READ ? cx_cma_read(&ep->cma, x->local, x->remote, x->len)
                                    : cx_cma_write(&ep->cma, x->remote, x->local, x->len);
    if (r != CX_OK) {
        cma_failed(ep, x->kind, 1, r);
        return 0;
    }
    b->cma_ops++;
    *rc = CX_OK;
    cx_core_xfer_done(b->core, x, CX_OK);
    return 1;
}

int cx_fi_cma_wants(cx_backend_t *b, const cx_bep_t *ep, const cx_xfer_t *x)
{
    uint64_t raddr, rkey;
    return b->cma && ep->cma.ok && !cx_fi_key_cached(b, x, &raddr, &rkey) &&
        takes(b, ep, x, b->cma_max / 16, b->kc.flags);
}

size_t cx_fi_cma_batch(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    if (!b->cma || (xs[0]->kind != CX_XFER_READ && xs[0]->kind != CX_XFER_WRITE) || unknown(b, ep)) return 0;
    cx_cma_seg_t seg[CX_CMA_SEGS_MAX];
    size_t k = 0, budget = b->cma_max, max = b->cma_max / 16;
    uint64_t raddr, rkey;
    for (; k < n && k < CX_CMA_SEGS_MAX; k++) {
        cx_xfer_t *x = xs[k];
        if (cx_fi_key_cached(b, x, &raddr, &rkey) || !takes(b, ep, x, max, b->kc.flags) || x->len > budget ||
            (k && x->kind != xs[0]->kind))
            break;
        budget -= x->len;
        seg[k] = (cx_cma_seg_t){ x->local, x->remote, x->len };
    }
    if (!k) return 0;
    int r = cx_cma_copyv(&ep->cma, xs[0]->kind == CX_XFER_WRITE, seg, k);
    if (r != CX_OK) {
        cma_failed(ep, xs[0]->kind, k, r);
        return 0;
    }
    b->cma_ops += k;
    for (size_t i = 0; i < k; i++) rcs[i] = CX_OK;
    for (size_t i = 0; i < k; i++) cx_core_xfer_done(b->core, xs[i], CX_OK);
    return k;
}
