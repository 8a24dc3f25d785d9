/* ofi_rxm providers: one message to ourselves at open, so that rxm's first-send allocations are
 * made before the engine is up, not on the first transfer after a (re)join.
 *
 * Why: rxm grows its transmit bounce-buffer pool on an endpoint's first send, one chunk of 1024
 * buffers of FI_OFI_RXM_BUFFER_SIZE (16 KiB) + header: 17.3 MB that libfabric zeroes at once.
 * Touching 17 MB of fresh memory costs 4,200 page faults: 75-310 ms on this VM (measured with a
 * plain memset of a fresh 17.3 MB buffer; the libfabric memset was found with an LD_PRELOAD
 * memset logger), and it landed on the progress thread of a restarted peer exactly while its
 * first connection was being set up: the survivor's first read after JOINED waited for it
 * (connex-bench failover, libfabric_tcp: engine up -> first transfer 75-300 ms). A send to our
 * own address (rxm makes a loopback connection for it) grows the pool here instead. */
#include "fi_int.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <string.h>
#include <time.h>

#define CX_FI_WARM_MS 2000 /* bound on the whole exchange; on expiry the open goes on */

static uint64_t cx_fi_warm_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* A completion of the warm-up send seen later by the progress loop (the warm-up gave up first). */
void cx_fi_warm_done(cx_backend_t *b)
{
    if (b->warm_txi >= 0) {
        cx_fi_tx_put(b, b->warm_txi);
        b->warm_txi = -1;
    }
}

void cx_fi_warm_self(cx_backend_t *b, const void *name)
{
    b->warm_txi = -1;
    if (!strstr(b->prov, "ofi_rxm")) return;
    uint64_t t0 = cx_fi_warm_now_ms();
    fi_addr_t self;
    if (fi_av_insert(b->av, name, 1, &self, 0, NULL) != 1) {
        cx_debug("libfabric: %s: warm-up: our own address does not insert; skipped", b->prov);
        return;
    }
    b->warm_txi = cx_fi_tx_get(b);
    uint8_t *buf = cx_fi_tx_buf(b, b->warm_txi);
    cx_wr_t w;
    cx_wr_init(&w, buf, CX_FI_BUF);
    /* A bare ack of sequence 0: a receiver ignores it ("ack for unknown op"). */
    cx_fi_hdr_put(&w, &(cx_fi_hdr_t){ .type = CX_FM_ACK, .inc = b->inc, .seq = 0, .flags = CX_FM_F_RUNG });
    cx_fi_ack_put(&w, 0);
    b->warm_ctx.type = CX_FI_CTX_WARM;
    int posted = 0, sent = 0, got = 0;
    struct fi_cq_data_entry e[8]; /* the CQ's format (fi_setup.c) */
    /* Bounded in time and in rounds; each round reads the CQ, which also drives rxm's
     * connection to itself. */
    for (int round = 0; round < 200000 && !(sent && got); round++) {
        if (cx_fi_warm_now_ms() - t0 > CX_FI_WARM_MS) break;
        if (!posted) {
            ssize_t r = fi_send(b->ep, buf, w.len, fi_mr_desc(b->txmr), self, &b->warm_ctx.fc);
            if (r == 0)
                posted = 1;
            else if (r != -FI_EAGAIN) {
                cx_debug("libfabric: %s: warm-up send: %s", b->prov, cx_fi_strerror((int)-r));
                break;
            }
        }
        ssize_t n = fi_cq_read(b->cq, e, 8);
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ee;
            memset(&ee, 0, sizeof ee);
            if (fi_cq_readerr(b->cq, &ee, 0) == 1) {
                cx_fi_ctx_t *c = ee.op_context;
                if (c == &b->warm_ctx) {
                    sent = 1;
                    got = 1; /* failed: nothing to wait for */
                } else if (c && c->type == CX_FI_CTX_RX) {
                    cx_fi_rx_post(b, (cx_fi_rx_t *)c);
                }
                cx_debug("libfabric: %s: warm-up: %s", b->prov, cx_fi_strerror(ee.err));
            }
            continue;
        }
        for (ssize_t i = 0; i < n; i++) {
            cx_fi_ctx_t *c = e[i].op_context;
            if (c == &b->warm_ctx) {
                sent = 1;
            } else if (c && c->type == CX_FI_CTX_RX) {
                got = 1; /* nobody else knows our address yet: it is ours */
                cx_fi_rx_post(b, (cx_fi_rx_t *)c);
            }
        }
    }
    if (sent) cx_fi_warm_done(b);
    /* Closes rxm's connection to ourselves (FI_AV_REMOVE_CLEANUP); its accepted side stays until
     * the endpoint closes. */
    fi_av_remove(b->av, &self, 1, 0);
    cx_debug("libfabric: %s: warm-up send to ourselves: %s in %llu ms", b->prov, sent && got ? "done" : "incomplete",
             (unsigned long long)(cx_fi_warm_now_ms() - t0));
}
