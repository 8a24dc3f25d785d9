/* libFuzzer target: what an etcd server (or anything answering on its port) sends the directory:
 * JSON answers of the gateway (range, watch events, lease grants) and the base64 keys and values
 * inside them, decoded by json_lite.c and etcd_wire.c. Besides memory safety: an entry that
 * decodes names a URL that parses back to the same LID, and base64 round-trips. */
#include "etcd_wire.h"
#include "json_lite.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void entry(cx_js_t kv, int is_del)
{
    cx_dir_entry_t ent;
    char err[200];
    if (cx_etcd_kv_entry(kv, is_del, &ent, err, sizeof err) != CX_OK) {
        if (!memchr(err, 0, sizeof err)) abort();
        return;
    }
    if (!memchr(ent.lid.model, 0, sizeof ent.lid.model)) abort();
    if (is_del) return;
    if (!memchr(ent.url, 0, sizeof ent.url)) abort();
    cx_url_t u;
    if (cx_url_parse(ent.url, &u, NULL, 0) != CX_OK || cx_lid_cmp(&u.lid, &ent.lid)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy without a terminator: the decoders take a span and must stay inside. */
    char *s = malloc(size ? size : 1);
    if (!s) return 0;
    memcpy(s, data, size);
    cx_js_t root = { s, s + size };

    entry(root, 0); /* a bare kv */
    entry(root, 1);
    cx_js_t it = { 0, 0 }, kv; /* a range answer */
    for (int i = 0; i < 64 && cx_js_next(cx_js_get(root, "kvs"), &it, &kv); i++) entry(kv, 0);
    cx_js_t res = cx_js_get(root, "result"), ev; /* a watch message */
    cx_js_t it2 = { 0, 0 };
    for (int i = 0; i < 64 && cx_js_next(cx_js_get(res, "events"), &it2, &ev); i++) {
        char type[16];
        int del = cx_js_str(cx_js_get(ev, "type"), type, sizeof type) == 0 && !strcmp(type, "DELETE");
        entry(cx_js_get(ev, "kv"), del);
    }
    uint64_t v; /* lease grant, headers */
    cx_js_u64(cx_js_get(cx_js_get(root, "header"), "revision"), &v);
    cx_js_u64(cx_js_get(root, "ID"), &v);
    cx_js_u64(cx_js_get(res, "compact_revision"), &v);
    (void)cx_js_bool(cx_js_get(res, "canceled"));
    char str[64];
    if (cx_js_str(cx_js_get(root, "TTL"), str, sizeof str) == 0 && !memchr(str, 0, sizeof str)) abort();

    /* base64: whatever decodes encodes back to a string that decodes to the same bytes. */
    uint8_t bin[512], bin2[512];
    char enc[4 * (sizeof bin / 3 + 1) + 1];
    int n = cx_b64_dec(s, size, bin, sizeof bin);
    if (n >= 0) {
        size_t el = cx_b64_enc(bin, (size_t)n, enc);
        if (el >= sizeof enc || enc[el]) abort();
        int n2 = cx_b64_dec(enc, el, bin2, sizeof bin2);
        if (n2 != n || memcmp(bin, bin2, (size_t)n)) abort();
    }
    free(s);
    return 0;
}
