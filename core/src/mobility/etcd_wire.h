/* What connex keeps in etcd, and the decoder of etcd's answers into directory entries: a pure
 * function of the bytes (no curl, no engine), so the fuzzer (tests/fuzz/fuzz_etcd.c) runs it on
 * anything a server, or something pretending to be one, could send. */
#ifndef CX_ETCD_WIRE_H
#define CX_ETCD_WIRE_H

#include "connex/connex.h"
#include "json_lite.h"

#include <stddef.h>

/* Key: prefix + LID; value: "<url> <incarnation hex>". */
#define CX_ETCD_KEY_PREFIX "/connex/lid/"

/* One kv object of a range answer or a watch event ({"key": b64, "value": b64, "mod_revision": n})
 * into an entry (for a DELETE only the LID and the version). CX_OK, or CX_EINVAL with the reason
 * in err: not under the prefix, not base64, a LID or URL that does not parse, a value naming
 * another LID. */
int cx_etcd_kv_entry(cx_js_t kv, int is_del, cx_dir_entry_t *ent, char *err, size_t errlen);

#endif
