/* The embedded directory: a fixed membership from cfg.peers or CONNEX_PEERS (comma-separated
 * URLs), plus this engine. No server, no lease: an entry changes only when a HELLO shows its LID
 * at a new address (cx_dir_seen_at), with the version counting those changes. */
#include "dir_impl.h"

#include "connex/log.h"

#include <stdio.h>
#include <string.h>

static int static_open(cx_dir_t *d, const char *spec)
{
    (void)spec;
    cx_dir_entry_t self = { .lid = d->lid, .version = 1 };
    snprintf(self.url, sizeof self.url, "%s", d->url);
    if (cx_dir_table_apply(d, &self, CX_DIR_PUT) < 0) return CX_ENOMEM;
    const char *s = d->peers;
    int idx = 0;
    while (s && *s) {
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        while (n && (*s == ' ' || *s == '\t')) {
            s++;
            n--;
        }
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
        idx++;
        if (n) {
            char one[CX_URL_MAX + 1], err[256];
            cx_url_t u;
            if (n > CX_URL_MAX || (memcpy(one, s, n), one[n] = 0, cx_url_parse(one, &u, err, sizeof err))) {
                if (n > CX_URL_MAX) snprintf(err, sizeof err, "URL #%d is longer than %d bytes", idx, CX_URL_MAX);
                cx_error("directory: static peer list, entry #%d: %s (the list is comma-separated "
                         "ip:port#model|stage|shard|replica)",
                         idx, err);
                return CX_EINVAL;
            }
            if (cx_lid_cmp(&u.lid, &d->lid)) { /* this engine's own LID: its own URL wins */
                cx_dir_entry_t ent = { .lid = u.lid, .version = 1 };
                cx_url_format(&u, ent.url, sizeof ent.url);
                if (cx_dir_table_apply(d, &ent, CX_DIR_PUT) < 0) return CX_ENOMEM;
            }
        }
        s = c ? c + 1 : NULL;
    }
    return CX_OK;
}

static void static_close(cx_dir_t *d)
{
    (void)d;
}

const cx_dir_ops_t cx_dir_static_ops = { "static", static_open, static_close };
