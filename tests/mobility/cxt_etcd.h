/* A real etcd for the mobility tests: started on 127.0.0.1 with free ports and a temporary data
 * directory, waited for until it answers, killed (and its directory removed) at the end. */
#ifndef CXT_ETCD_H
#define CXT_ETCD_H

#include <stdint.h>
#include <sys/types.h>

#define CXT_ETCD_BIN "/usr/bin/etcd"

typedef struct cxt_etcd {
    pid_t pid;     /* -1: not running */
    char dir[128]; /* data directory (and etcd.log) */
    uint16_t client_port, peer_port;
    char endpoint[64]; /* "etcd://127.0.0.1:<port>", what CONNEX_DIRECTORY takes */
} cxt_etcd_t;

/* 0 when etcd answers, 1 when there is no etcd binary (skip the test), -1 when it did not come
 * up within timeout_ms (its log is printed to stderr). */
int cxt_etcd_start(cxt_etcd_t *x, int timeout_ms);
/* up 0: kill -9 etcd, keeping its ports and data; up 1: start it again there. 0 or -1. */
int cxt_etcd_restart(cxt_etcd_t *x, int up, int timeout_ms);
/* SIGKILL, reap, remove the data directory. Safe to call twice. */
void cxt_etcd_stop(cxt_etcd_t *x);

#endif
