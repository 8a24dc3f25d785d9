/* The directory's inside (dir.c, dir_static.c, dir_etcd.c): one ops table per implementation,
 * and the table of entries they share with the engine. The table and the change queue are
 * guarded by a mutex: an implementation's own thread (etcd) writes them, the progress thread
 * applies the queued changes in cx_dir_tick, and caller threads read the table
 * (cx_directory_list). */
#ifndef CX_DIR_IMPL_H
#define CX_DIR_IMPL_H

#include "mobility.h"

#include <pthread.h>

typedef struct cx_dir cx_dir_t;

typedef struct cx_dir_ops {
    const char *name; /* "static", "etcd" */
    /* Caller thread, at engine create: open, register this engine, fill the table. spec: what
     * follows "etcd://" (NULL for static). A failure logs why and returns a CX_* code. */
    int (*open)(cx_dir_t *d, const char *spec);
    /* Engine destroy, after the progress thread ended: delete our entry, stop, free impl. */
    void (*close)(cx_dir_t *d);
} cx_dir_ops_t;

extern const cx_dir_ops_t cx_dir_static_ops;
extern const cx_dir_ops_t cx_dir_etcd_ops;

typedef struct cx_dir_row {
    cx_dir_entry_t ent;
    int deleted; /* a tombstone: keeps the version so an older PUT stays ignored */
} cx_dir_row_t;

typedef struct cx_dir_chg {
    cx_dir_entry_t ent;
    int kind; /* CX_DIR_PUT, CX_DIR_DEL */
} cx_dir_chg_t;

struct cx_dir {
    const cx_dir_ops_t *ops;
    void *impl;
    /* this engine, copied at create so other threads never read the engine */
    cx_lid_t lid;
    char url[CX_URL_MAX];
    uint64_t incarnation;
    uint32_t lease_ms;
    const char *peers; /* static: the configured list (cfg.peers or CONNEX_PEERS) */

    pthread_mutex_t mu;
    cx_dir_row_t *rows;
    size_t n, cap;
    cx_dir_chg_t *q; /* changes the progress thread has not applied yet */
    size_t qn, qcap;
};

/* Any thread: record a change if it is news (a PUT newer than what is held, a DEL of a live
 * entry not older than it). Returns 1 when applied (and queued for the progress thread), 0 when
 * stale or no change, CX_ENOMEM. */
int cx_dir_table_apply(cx_dir_t *d, const cx_dir_entry_t *ent, int kind);
/* The live entries' LIDs and versions, for a resync (etcd): caller frees *out. */
int cx_dir_table_snapshot(cx_dir_t *d, cx_dir_entry_t **out, size_t *n);

/* A HELLO showed a known LID at a new URL (peer/hello.c): the static directory follows it. */
void cx_dir_seen_at(cx_engine_t *e, const cx_lid_t *lid, const char *url);

#endif
