/* UCX configuration: the user's UCX_* variables always win (ucp_config_read reads them); we only
 * fill in what the user left unset. */
#include "ucx_int.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An InfiniBand/RoCE port in state ACTIVE. Read from sysfs rather than by opening UCT resources:
 * the answer is needed before ucp_init, whose configuration it changes. */
static int cx_ucx_ib_port_active(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (!d) return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        for (int port = 1; port <= 4 && !found; port++) {
            char path[512], buf[64];
            snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/state", de->d_name,
                     port);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            if (fgets(buf, sizeof buf, f) && strstr(buf, "ACTIVE")) found = 1;
            fclose(f);
        }
    }
    closedir(d);
    return found;
}

/* RDMA is usable when a port is active and the user's UCX_TLS (if any) does not exclude it. */
int cx_ucx_rdma_usable(void)
{
    if (!cx_ucx_ib_port_active()) return 0;
    const char *tls = getenv("UCX_TLS");
    if (!tls || !*tls) return 1;
    static const char *const rdma[] = { "all", "ib", "rc", "dc", "ud", "mlx5" };
    for (size_t i = 0; i < sizeof rdma / sizeof rdma[0]; i++)
        if (strstr(tls, rdma[i])) return tls[0] != '^';
    return tls[0] == '^';   /* an exclusion list that names no RDMA transport keeps them */
}

static int cx_ucx_set(ucp_config_t *cfg, const char *name, const char *val)
{
    ucs_status_t st = ucp_config_modify(cfg, name, val);
    if (st != UCS_OK) {
        cx_warn("ucx: cannot set UCX_%s=%s: %s", name, val, ucs_status_string(st));
        return CX_ERR;
    }
    cx_info("ucx: UCX_%s=%s", name, val);
    return CX_OK;
}

int cx_ucx_config(ucp_config_t *cfg)
{
    const char *dev = getenv("CONNEX_NET_DEVICES");
    if (dev && *dev && !getenv("UCX_NET_DEVICES")) {
        if (cx_ucx_set(cfg, "NET_DEVICES", dev) != CX_OK) return CX_EINVAL;
    }
    /* UCX's tcp transport implements PUT zero-copy (used by rendezvous) with a protocol of its
     * own: the target writes the bytes at the address in the PUT header as they arrive and acks
     * the last one. On a connection that fails mid-PUT it went wrong twice: a survivor aborted
     * in uct_tcp_ep_handle_put_ack (tcp_ep.c:939, `ep->flags & UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK`)
     * after a peer was killed with kill -9 during transfers, and a canceled or destroyed endpoint
     * goes on writing PUT data that is still arriving into the buffer it names (fixed upstream
     * after 1.13, openucx/ucx#11917 and #11918), which a forced close must prevent. Off, rendezvous
     * over tcp sends its data as active messages: the same 1-16 MiB throughput over loopback
     * here (docs/backends.md). A user's UCX_TCP_PUT_ENABLE wins. The name is the field's in
     * UCT's tcp table (ucp_config_modify hands names it does not know to every transport's
     * table; tcp is the only one with PUT_ENABLE, and "TCP_PUT_ENABLE" matched none). */
    if (!getenv("UCX_TCP_PUT_ENABLE")) {
        ucs_status_t st = ucp_config_modify(cfg, "PUT_ENABLE", "n");
        if (st == UCS_OK) cx_info("ucx: UCX_TCP_PUT_ENABLE=n (tcp PUT zero-copy off)");
        else cx_warn("ucx: cannot turn tcp PUT zero-copy off: %s", ucs_status_string(st));
    }
    /* UCX before 1.16 runs put/get on CUDA memory through the v1 protocols, which pick
     * short/bcopy (a CPU memcpy on device memory) instead of GPUDirect zero-copy; the v2
     * protocol selection (UCX_PROTO_ENABLE=y) picks rc/dc zcopy. Newer UCX enables v2 by
     * default, and an explicit UCX_PROTO_ENABLE is the user's choice either way. */
    unsigned maj = 0, min = 0, rel = 0;
    ucp_get_version(&maj, &min, &rel);
    if (!getenv("UCX_PROTO_ENABLE") && (maj == 1 && min < 16) && cx_ucx_rdma_usable())
        (void)cx_ucx_set(cfg, "PROTO_ENABLE", "y");
    return CX_OK;
}

long cx_ucx_env_long(const char *name, long dflt, long max)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > max) {
        cx_warn("ucx: %s=%s is not a number in [0, %ld]; using %ld", name, s, max, dflt);
        return dflt;
    }
    return v;
}
