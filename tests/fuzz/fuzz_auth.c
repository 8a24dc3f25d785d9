/* libFuzzer target: the AUTH exchange (core/src/auth.c) as a stranger drives it. The input is a
 * sequence of frames (u8 length, body) fed to cx_auth_on_frame on an inbound and an outgoing
 * connection of an engine with a token. Besides memory safety: without the token nobody gets
 * past step 3, so neither connection may ever end up authenticated. */
#include "auth.h"
#include "engine.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cx_engine_t e;
    static cx_auth_t key = { .key = "fuzz-token-0123456789abcdef", .key_len = 27, .source = "fuzz" };
    static cx_conn_t in, out;
    memset(&in, 0, sizeof in);
    memset(&out, 0, sizeof out);
    e.auth = &key;
    e.conns = &out;
    out.outgoing = 1;
    out.next = &in;
    if (cx_auth_dial_start(&e, &out)) abort();

    cx_auth_frame_t f;
    if (cx_auth_frame_get(data, size, &f) == CX_OK) {
        uint8_t b[CX_AUTH_BODY];
        cx_auth_frame_put(b, &f);
        if (size != CX_AUTH_BODY || memcmp(b, data, size)) abort();
    }
    size_t off = 0;
    int dead_in = 0, dead_out = 0;
    while (off < size) {
        size_t n = data[off++];
        if (n > size - off) n = size - off;
        char why[160];
        /* Alternate: even frames to the acceptor side, odd ones to the dialler side. */
        if (!dead_in && (off & 1)) {
            int rc = cx_auth_on_frame(&e, &in, data + off, n, why, sizeof why);
            if (rc < 0) {
                dead_in = 1;
                if (!memchr(why, 0, sizeof why)) abort();
            }
        } else if (!dead_out) {
            int rc = cx_auth_on_frame(&e, &out, data + off, n, why, sizeof why);
            if (rc < 0) {
                dead_out = 1;
                if (!memchr(why, 0, sizeof why)) abort();
            }
            if (rc == CX_AUTH_SEND_HELLO) abort(); /* forged the acceptor's proof */
        }
        off += n;
        /* The acceptor side authenticates only after a proof made with the token. */
        if (in.au.ok) abort();
    }
    return 0;
}
