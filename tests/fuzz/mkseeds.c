/* Writes the seed corpus (corpus/<target>/seed-*) with the project's own encoders, so the seeds
 * are exactly what peers send. Run from tests/fuzz/: ../../build/tests/fuzz/fuzz_mkseeds corpus
 * The output is committed; rerun it when a wire format changes. */
#include "auth.h"
#include "ctl_wire.h"
#include "zmq_int.h"
#ifdef CX_SEEDS_UCX
#include "ucx_wire.h"
#endif
#ifdef CX_SEEDS_FI
#include "fi_wire.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *root;

static void put(const char *target, const char *name, const void *b, size_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, target);
    (void)mkdir(p, 0755); /* a new target's directory; fopen says if it is still missing */
    snprintf(p, sizeof p, "%s/%s/seed-%s", root, target, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(p);
        exit(1);
    }
    fclose(f);
}

/* Encodes with a cx_wr_t encoder into a scratch buffer and writes it as a seed. */
#define PUT_WR(target, name, cap, ...)                                     \
    do {                                                                   \
        static uint8_t wb_[cap];                                           \
        cx_wr_t w_;                                                        \
        cx_wr_init(&w_, wb_, sizeof wb_);                                  \
        __VA_ARGS__;                                                       \
        if (!w_.ok) {                                                      \
            fprintf(stderr, "seed %s/%s does not encode\n", target, name); \
            exit(1);                                                       \
        }                                                                  \
        put(target, name, wb_, w_.len);                                    \
    } while (0)

static size_t frame(uint8_t *out, uint8_t type, const void *body, size_t n)
{
    cx_ctl_hdr(out, (uint32_t)n, type);
    memcpy(out + CX_CTL_HDR, body, n);
    return CX_CTL_HDR + n;
}

int main(int argc, char **argv)
{
    root = argc > 1 ? argv[1] : "corpus";
    static const char *urls[] = {
        "127.0.0.1:5000#llama|1|0|0",
        "10.0.0.2:51001#llama-8b|1|2|3",
        "[::1]:7000#m.x/y:z-1|0|0|4294967295",
        "[fe80::1%eth0]:1#m|0|0|0",
        "llama|1|0|0",
        "0.0.0.0:0#a|0|0|0",
        "127.0.0.1:65536#m|0|0|0",
        "127.0.0.1:80#m|1|2",
        "1.2.3.4:5#|0|0|0",
        "127.0.0.1:5000#llama|01|0|0",
    };
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
        char n[16];
        snprintf(n, sizeof n, "%zu", i);
        put("url", n, urls[i], strlen(urls[i]));
    }

    /* A HELLO with two backends and two regions, and the frames that follow a handshake. */
    uint8_t body[4096], stream[16384];
    cx_lid_t me = { .model = "llama", .stage = 1 }, you = { .model = "llama", .stage = 2 };
    const char *names[2] = { "ucx", "zmq" };
    const uint8_t a0[] = { 1, 2, 3, 4, 5, 6, 7, 8 }, a1[] = "tcp://127.0.0.1:4000";
    const uint8_t *addrs[2] = { a0, a1 };
    uint16_t lens[2] = { sizeof a0, sizeof a1 - 1 };
    cx_region_t r1, r2;
    memset(&r1, 0, sizeof r1);
    memset(&r2, 0, sizeof r2);
    uint8_t k0[] = { 9, 9, 9, 9 }, k1[] = { 7 };
    r1.id = 1;
    r1.addr = 0x10000;
    r1.len = 4096;
    r1.mh[0] = (void *)1;
    r1.key[0] = k0;
    r1.key_len[0] = sizeof k0;
    r1.mh[1] = (void *)1;
    r1.key[1] = k1;
    r1.key_len[1] = sizeof k1;
    r2.id = 2;
    r2.addr = 0x7fff0000;
    r2.len = 1 << 20;
    r2.mh[1] = (void *)1;
    r2.key[1] = k1;
    r2.key_len[1] = sizeof k1;
    cx_wr_t w;
    cx_wr_init(&w, body, sizeof body);
    const char *choices[2] = { "ucx//0x7", "zmq//0x1" };
    cx_wire_put_hello_head(&w, 0x1122334455667788ull, &me, "127.0.0.1:5000#llama|1|0|0", &you, "host/boot", 1000, 3000,
                           4242, 7, 2, names, choices, addrs, lens, 2);
    cx_wire_put_region(&w, &r1, names, 2);
    cx_wire_put_region(&w, &r2, names, 2);
    if (!w.ok) return 1;
    size_t hello_len = w.len;
    put("ctl", "hello-body", body, hello_len);
    size_t off = frame(stream, CX_CTL_HELLO, body, hello_len);
    put("ctl", "hello-frame", stream, off);

    cx_wr_init(&w, body, sizeof body);
    cx_wire_put_region(&w, &r1, names, 2);
    put("ctl", "region-body", body, w.len);
    off += frame(stream + off, CX_CTL_REG_ADD, body, w.len);
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u64(&w, 1);
    off += frame(stream + off, CX_CTL_REG_DEL, body, w.len);
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u64(&w, 5);
    cx_wr_u64(&w, 0x10000);
    cx_wr_u64(&w, 64);
    off += frame(stream + off, CX_CTL_REG_QUERY, body, w.len);
    cx_wr_init(&w, body, sizeof body);
    cx_wr_u64(&w, 5);
    cx_wr_u8(&w, 1);
    cx_wire_put_region(&w, &r2, names, 2);
    off += frame(stream + off, CX_CTL_REG_REPLY, body, w.len);
    cx_wr_init(&w, body, sizeof body);
    cx_wire_put_death(&w, &you, 0x99aabbccddeeff01ull);
    off += frame(stream + off, CX_CTL_DEATH, body, w.len);
    off += frame(stream + off, CX_CTL_HB, NULL, 0);
    off += frame(stream + off, CX_CTL_BYE, NULL, 0);
    put("ctl", "session", stream, off);

    cx_wr_init(&w, body, sizeof body);
    cx_wr_u32(&w, (uint32_t)CX_EAUTH);
    cx_wr_str8(&w, "wrong token");
    off = frame(stream, CX_CTL_REFUSE, body, w.len);
    put("ctl", "refuse", stream, off);

    cx_auth_frame_t af;
    uint8_t ab[CX_AUTH_BODY];
    off = 0;
    for (uint8_t s = 1; s <= 4; s++) {
        af.step = s;
        memset(af.data, 0x40 + s, sizeof af.data);
        cx_auth_frame_put(ab, &af);
        char n[16];
        snprintf(n, sizeof n, "step%u", s);
        put("auth", n, ab, sizeof ab);
        off += frame(stream + off, CX_CTL_AUTH, ab, sizeof ab);
    }
    put("ctl", "auth", stream, off);
    /* fuzz_auth's own input form: (u8 length, body) pairs */
    uint8_t seq[2 * (1 + CX_AUTH_BODY)];
    for (int i = 0; i < 2; i++) {
        af.step = (uint8_t)(1 + 2 * i); /* step 1 to the acceptor, step 3 after it */
        memset(af.data, 0x11 * (i + 1), sizeof af.data);
        seq[i * (1 + CX_AUTH_BODY)] = CX_AUTH_BODY;
        cx_auth_frame_put(seq + i * (1 + CX_AUTH_BODY) + 1, &af);
    }
    put("auth", "sequence", seq, sizeof seq);

    cx_zmq_req_t q = { .kind = CX_XFER_WRITE, .id = 42, .sender = 0xabcdef, .addr = 0x10000, .len = 4096 };
    uint8_t zb[CX_ZMQ_REQ_HDR];
    for (int k = CX_XFER_READ; k <= CX_XFER_MSG; k++) {
        q.kind = (uint8_t)k;
        cx_zmq_req_put(zb, &q);
        char n[16];
        snprintf(n, sizeof n, "req%d", k);
        put("zmq", n, zb, sizeof zb);
    }
    cx_zmq_rep_t p = { .id = 42, .status = CX_EINVAL };
    uint8_t pb[CX_ZMQ_REP_HDR];
    cx_zmq_rep_put(pb, &p);
    put("zmq", "rep", pb, sizeof pb);
    /* batch frames (wire version 2): a read of three entries, a write of two with its data */
    static uint8_t bf[CX_ZMQ_BREQ_HDR + 3 * CX_ZMQ_BENT + 48];
    cx_zmq_breq_put(bf, &(cx_zmq_breq_t){ .kind = CX_XFER_READ, .id = 43, .sender = 0xabcdef, .n = 3 });
    for (uint32_t i = 0; i < 3; i++) cx_zmq_bent_put(bf, i, 0x10000 + 0x1000 * i, 16384);
    put("zmq", "breq-read", bf, CX_ZMQ_BREQ_HDR + 3 * CX_ZMQ_BENT);
    cx_zmq_breq_put(bf, &(cx_zmq_breq_t){ .kind = CX_XFER_WRITE, .id = 44, .sender = 0xabcdef, .n = 2 });
    cx_zmq_bent_put(bf, 0, 0x10000, 16);
    cx_zmq_bent_put(bf, 1, 0x20000, 32);
    memset(bf + CX_ZMQ_BREQ_HDR + 2 * CX_ZMQ_BENT, 0x5a, 48);
    put("zmq", "breq-write", bf, CX_ZMQ_BREQ_HDR + 2 * CX_ZMQ_BENT + 48);
    const int32_t bst[3] = { CX_OK, CX_EINVAL, CX_OK };
    uint8_t bp[CX_ZMQ_BREP_HDR + 12];
    cx_zmq_brep_put(bp, 43, CX_OK, bst, 3);
    put("zmq", "brep", bp, cx_zmq_brep_size(3));
    cx_zmq_brep_put(bp, 44, CX_EPEER, NULL, 0);
    put("zmq", "brep-refused", bp, cx_zmq_brep_size(0));
    /* address blobs: version 1 (a bare endpoint), version 2 over IPv4 and IPv6 */
    char zab[128];
    put("zmq", "addr-v1", "tcp://127.0.0.1:4000", 20);
    cx_zmq_addr_put(zab, sizeof zab, "tcp://127.0.0.1:4000", 0);
    put("zmq", "addr-v2", zab, strlen(zab));
    cx_zmq_addr_put(zab, sizeof zab, "tcp://[fd00::1]:4000", 1);
    put("zmq", "addr-v2-ipv6", zab, strlen(zab));

#ifdef CX_SEEDS_UCX
    /* The UCX backend: AM headers and acks as ucx_xfer.c / ucx_am.c send them, and the HELLO
     * blobs around opaque bytes standing in for what UCX packs (the backend never parses those). */
    uint8_t opaque[180];
    for (size_t i = 0; i < sizeof opaque; i++) opaque[i] = (uint8_t)(i * 37 + 11);
    PUT_WR(
        "ucx", "msg", 64,
        cx_ucx_msg_hdr_put(&w_, &(cx_ucx_msg_hdr_t){ .kind = CX_XFER_MSG, .inc = 0x1122334455667788ull, .req_id = 1 }));
    PUT_WR(
        "ucx", "signal", 64,
        cx_ucx_msg_hdr_put(
            &w_,
            &(cx_ucx_msg_hdr_t){ .kind = CX_XFER_PUT_SIGNAL, .inc = 0x8877665544332211ull, .req_id = 0xfffffffffull }));
    const int ack_st[] = { CX_OK, CX_EAGAIN, CX_EINVAL };
    for (size_t i = 0; i < sizeof ack_st / sizeof *ack_st; i++) {
        char n[16];
        snprintf(n, sizeof n, "ack%d", -ack_st[i]);
        PUT_WR("ucx", n, 64,
               cx_ucx_ack_hdr_put(&w_, &(cx_ucx_ack_hdr_t){ .req_id = 42 + i, .status = (int32_t)ack_st[i] }));
    }
    PUT_WR("ucx", "addr", 512, cx_ucx_blob_put(&w_, CX_UCX_ADDR_MAGIC, opaque, sizeof opaque));
    PUT_WR("ucx", "rkey", 512, cx_ucx_blob_put(&w_, CX_UCX_KEY_MAGIC, opaque, 41));
    {
        uint8_t adv[28], host[CX_UCX_HOST_LEN];
        for (size_t i = 0; i < sizeof adv; i++) adv[i] = (uint8_t)(i * 29 + 3);
        for (size_t i = 0; i < sizeof host; i++) host[i] = (uint8_t)(i + 1);
        PUT_WR("ucx", "addr-cma", 512,
               (cx_ucx_blob_put(&w_, CX_UCX_ADDR_MAGIC, opaque, sizeof opaque),
                cx_ucx_ext_put(&w_, CX_UCX_CMA_MAGIC, adv, sizeof adv)));
        PUT_WR("ucx", "rkey-host", 512,
               (cx_ucx_blob_put(&w_, CX_UCX_KEY_MAGIC, opaque, 41),
                cx_ucx_ext_put(&w_, CX_UCX_HOST_MAGIC, host, sizeof host)));
    }
    PUT_WR(
        "ucx", "rreq", 64,
        cx_ucx_rreq_hdr_put(&w_,
                            &(cx_ucx_rreq_hdr_t){
                                .inc = 0x1122334455667788ull, .req_id = 7, .addr = 0x7f0000001000ull, .len = 16384 }));
    PUT_WR(
        "ucx", "wreq", 64,
        cx_ucx_wreq_hdr_put(
            &w_,
            &(cx_ucx_wreq_hdr_t){ .inc = 0x1122334455667788ull, .req_id = 9, .addr = 0x7f0000002000ull, .len = 4096 }));
    PUT_WR("ucx", "rdata", 64,
           cx_ucx_rdata_hdr_put(&w_, &(cx_ucx_rdata_hdr_t){ .req_id = 7, .status = CX_OK, .offset = 8000 }));
    PUT_WR("ucx", "rdata-refused", 64,
           cx_ucx_rdata_hdr_put(&w_, &(cx_ucx_rdata_hdr_t){ .req_id = 8, .status = CX_EINVAL, .offset = 0 }));
    PUT_WR("ucx", "upd", 512,
           cx_ucx_upd_put(&w_,
                          &(cx_ucx_upd_hdr_t){
                              .inc = 0x1122334455667788ull, .gen = 3, .addr = opaque, .addr_len = sizeof opaque }));
#endif

#ifdef CX_SEEDS_FI
    /* The libfabric backend: every message type as fi_xfer.c sends it, the address blobs of the
     * providers it runs on (fi_getname bytes: a sockaddr_in for tcp, a name for shm), keys. */
    cx_fi_hdr_t fh = { .type = CX_FM_MSG, .inc = 0x0102030405060708ull, .seq = 7 };
    PUT_WR("fi", "msg", 256, cx_fi_hdr_put(&w_, &fh); cx_wr_bytes(&w_, "hello", 5));
    fh.type = CX_FM_MSG;
    PUT_WR("fi", "msg-empty", 256, cx_fi_hdr_put(&w_, &fh));
    fh.type = CX_FM_SIG;
    PUT_WR("fi", "sig", 256, cx_fi_hdr_put(&w_, &fh); cx_wr_bytes(&w_, "signal!", 7));
    fh.type = CX_FM_ACK;
    PUT_WR("fi", "ack0", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_ack_put(&w_, CX_OK));
    PUT_WR("fi", "ack9", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_ack_put(&w_, CX_EAGAIN));
    fh.type = CX_FM_MSG_RTS;
    cx_fi_rts_t rt = { .len = 1 << 20, .addr = 0x7f0012340000ull, .key = 5 };
    PUT_WR("fi", "msg-rts", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_rts_put(&w_, &rt));
    fh.type = CX_FM_SIG_RTS;
    rt.len = CX_MSG_MAX;
    rt.addr = 0;
    PUT_WR("fi", "sig-rts", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_rts_put(&w_, &rt));
    fh.type = CX_FM_RREQ;
    cx_fi_wbreq_t wq = { .what = 0x7f0012340000ull, .len = 4096, .dst = 0x7f0056780000ull, .key = 9 };
    PUT_WR("fi", "rreq", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_wbreq_put(&w_, &wq));
    fh.type = CX_FM_PREQ;
    wq.what = 17;
    wq.len = 1 << 20;
    wq.dst = 0;
    PUT_WR("fi", "preq", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_wbreq_put(&w_, &wq));
    fh.type = CX_FM_RREQ_IN;
    wq = (cx_fi_wbreq_t){ .what = 0x7f0012340000ull, .len = 40000 };
    PUT_WR("fi", "rreq-in", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_wbreq_put(&w_, &wq));
    fh.type = CX_FM_RDATA;
    PUT_WR("fi", "rdata", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_rdata_put(&w_, CX_OK, 16360, "sixteen bytes!!!", 16));
    PUT_WR("fi", "rdata-err", 256, cx_fi_hdr_put(&w_, &fh); cx_fi_rdata_put(&w_, CX_EINVAL, 0, NULL, 0));
    const uint8_t sin[16] = { 2, 0, 0x13, 0x88, 127, 0, 0, 1 };
    cx_fi_addr_t fa = { .prov = "tcp;ofi_rxm", .fmt = 1, .name = sin, .name_len = sizeof sin, .pid = 4242 };
    PUT_WR("fi", "addr-tcp", 512, cx_fi_addr_put(&w_, &fa));
    const char shm_name[] = "fi_ns://4242:0:0";
    cx_fi_addr_t fs = {
        .prov = "shm", .fmt = 14, .name = (const uint8_t *)shm_name, .name_len = sizeof shm_name, .pid = 4242
    };
    PUT_WR("fi", "addr-shm", 512, cx_fi_addr_put(&w_, &fs));
    PUT_WR("fi", "key-virt", 64,
           cx_fi_key_put(&w_, &(cx_fi_key_t){ .flags = CX_FI_KEY_VIRT, .base = 0x7f0000001000ull, .key = 0x1234 }));
    PUT_WR("fi", "key-offset", 64, cx_fi_key_put(&w_, &(cx_fi_key_t){ .flags = 0, .base = 0x10000, .key = 3 }));
    /* multi-rail (fi_rail.c): two rails' addresses in one blob, two rails' keys in one */
    uint8_t rab[512], rkb[64];
    cx_wr_t aw, kw;
    cx_wr_init(&aw, rab, sizeof rab);
    cx_fi_addr_put(&aw, &fa);
    cx_wr_init(&kw, rkb, sizeof rkb);
    cx_fi_key_put(&kw, &(cx_fi_key_t){ .flags = CX_FI_KEY_VIRT, .base = 0x7f0000001000ull, .key = 0x1234 });
    PUT_WR("fi", "addr-rails", 1100, cx_wr_u8(&w_, CX_FI_ADDRS_VERSION); cx_wr_u8(&w_, 2);
           cx_wr_blob16(&w_, rab, aw.len); cx_wr_blob16(&w_, rab, aw.len));
    PUT_WR(
        "fi", "key-rails", 128, cx_wr_u8(&w_, CX_FI_KEYS_VERSION); cx_wr_u8(&w_, 2); for (int r_ = 0; r_ < 2; r_++) {
            cx_wr_u8(&w_, (uint8_t)kw.len);
            cx_wr_bytes(&w_, rkb, kw.len);
        });
#endif
    return 0;
}
