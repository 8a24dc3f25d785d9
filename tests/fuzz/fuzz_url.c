/* libFuzzer target: the URL and LID parsers (every peer name a caller or a HELLO hands in).
 * Besides memory safety: whatever parses must format and parse back to the same value. */
#include "connex/connex.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void lid_same(const cx_lid_t *a, const cx_lid_t *b)
{
    if (cx_lid_cmp(a, b) || strcmp(a->model, b->model) || a->stage != b->stage || a->shard != b->shard ||
        a->replica != b->replica)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char s[512];
    if (size >= sizeof s) size = sizeof s - 1;
    memcpy(s, data, size);
    s[size] = 0;
    char err[200], buf[CX_URL_MAX];

    cx_url_t u, u2;
    if (cx_url_parse(s, &u, err, sizeof err) == CX_OK) {
        if (u.lid.model[CX_MODEL_MAX - 1] || u.host[sizeof u.host - 1]) abort();
        if (cx_url_format(&u, buf, sizeof buf) != CX_OK) abort();
        if (cx_url_parse(buf, &u2, err, sizeof err) != CX_OK) abort();
        if (strcmp(u.host, u2.host) || u.port != u2.port || u.is_ipv6 != u2.is_ipv6) abort();
        lid_same(&u.lid, &u2.lid);
        if (cx_lid_cmp(&u.lid, &u.lid)) abort();
    } else if (!memchr(err, 0, sizeof err)) {
        abort(); /* the message must be a terminated string */
    }
    cx_url_parse(s, &u, NULL, 0); /* no message buffer at all */
    cx_url_parse(s, &u, err, 1);

    cx_lid_t l, l2;
    if (cx_lid_parse(s, &l, err, sizeof err) == CX_OK) {
        if (cx_lid_format(&l, buf, sizeof buf) != CX_OK) abort();
        if (cx_lid_parse(buf, &l2, err, sizeof err) != CX_OK) abort();
        lid_same(&l, &l2);
        /* Too small a buffer is an error, never an overflow. */
        char tiny[4];
        if (strlen(buf) >= sizeof tiny && cx_lid_format(&l, tiny, sizeof tiny) != CX_EINVAL) abort();
    }
    cx_lid_parse(s, &l, NULL, 0);
    return 0;
}
