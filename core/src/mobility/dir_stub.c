/* Placeholder for the identity directory while groups are built on their own branch: the lead
 * deletes this file at the merge and links the real directory (dir.c, dir_static.c, dir_etcd.c).
 * It knows no entries; groups learn members from cx_group_add and the transport events. */
#include "mobility/mobility.h"

#include "connex/log.h"
#include "engine.h"

int cx_dir_start(cx_engine_t *e) { (void)e; return CX_OK; }
void cx_dir_stop(cx_engine_t *e) { (void)e; }
void cx_dir_tick(cx_engine_t *e, uint64_t now) { (void)e; (void)now; }

int cx_dir_lookup(cx_engine_t *e, const cx_lid_t *lid, cx_dir_entry_t *out)
{
    (void)e; (void)lid; (void)out;
    return CX_EINVAL;
}

int cx_dir_each(cx_engine_t *e, const cx_lid_pat_t *pat, void (*fn)(void *ctx, const cx_dir_entry_t *ent), void *ctx)
{
    (void)e; (void)pat; (void)fn; (void)ctx;
    return 0;
}

int cx_directory_list(cx_engine_t *e, const char *pattern, cx_dir_entry_t *out, int max)
{
    cx_lid_pat_t pat;
    char err[200];
    (void)out;
    if (!e || max < 0) return CX_EINVAL;
    if (cx_lid_pat_parse(pattern, &pat, err, sizeof err)) { cx_warn("directory_list: %s", err); return CX_EINVAL; }
    return 0;
}

const char *cx_directory_kind(cx_engine_t *e) { return e ? "static" : NULL; }
