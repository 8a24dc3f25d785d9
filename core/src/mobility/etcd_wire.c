/* Decoding etcd's kv objects into directory entries (etcd_wire.h). */
#include "etcd_wire.h"

#include <stdio.h>
#include <string.h>

int cx_etcd_kv_entry(cx_js_t kv, int is_del, cx_dir_entry_t *ent, char *err, size_t errlen)
{
    char k64[512], v64[1024];
    uint8_t key[384], val[768];
    memset(ent, 0, sizeof *ent);
    snprintf(err, errlen, "bad key");
    int kl = cx_js_str(cx_js_get(kv, "key"), k64, sizeof k64) ? -1 : cx_b64_dec(k64, strlen(k64), key, sizeof key - 1);
    if (cx_js_u64(cx_js_get(kv, "mod_revision"), &ent->version)) kl = -1;
    size_t pl = strlen(CX_ETCD_KEY_PREFIX);
    if (kl <= (int)pl || memcmp(key, CX_ETCD_KEY_PREFIX, pl)) return CX_EINVAL;
    key[kl] = 0;
    if (memchr(key, 0, (size_t)kl)) {
        snprintf(err, errlen, "key holds a NUL");
        return CX_EINVAL;
    }
    if (cx_lid_parse((char *)key + pl, &ent->lid, err, errlen) != CX_OK) return CX_EINVAL;
    if (is_del) return CX_OK;
    int vl =
        cx_js_str(cx_js_get(kv, "value"), v64, sizeof v64) ? -1 : cx_b64_dec(v64, strlen(v64), val, sizeof val - 1);
    if (vl <= 0) {
        snprintf(err, errlen, "value is not base64");
        return CX_EINVAL;
    }
    val[vl] = 0;
    char *sp = strchr((char *)val, ' ');
    if (sp) *sp = 0;
    cx_url_t u;
    if (cx_url_parse((char *)val, &u, err, errlen) != CX_OK) return CX_EINVAL;
    if (cx_lid_cmp(&u.lid, &ent->lid)) {
        snprintf(err, errlen, "value names another LID");
        return CX_EINVAL;
    }
    return cx_url_format(&u, ent->url, sizeof ent->url);
}
