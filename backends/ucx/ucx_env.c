/* UCX configuration: the user's UCX_* variables always win (ucp_config_read reads them); we only
 * fill in what the user left unset. */
#include "ucx_int.h"
#include "connex/options.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
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
            snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/state", de->d_name, port);
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
    return tls[0] == '^'; /* an exclusion list that names no RDMA transport keeps them */
}

static int cx_ucx_set(ucp_config_t *cfg, const char *name, const char *val)
{
    ucs_status_t st = cx_ucx_lib.ucp_config_modify(cfg, name, val);
    if (st != UCS_OK) {
        cx_warn("ucx: cannot set UCX_%s=%s: %s", name, val, cx_ucx_lib.ucs_status_string(st));
        return CX_ERR;
    }
    cx_info("ucx: UCX_%s=%s", name, val);
    return CX_OK;
}

/* The network interface that holds `ip` (its address, or its subnet for 127/8 and the like), in
 * out. 0 when found. */
static int cx_ucx_ip_ifname(const char *ip, char *out, size_t n)
{
    struct in_addr a4;
    struct in6_addr a6;
    int fam = inet_pton(AF_INET, ip, &a4) == 1 ? AF_INET : inet_pton(AF_INET6, ip, &a6) == 1 ? AF_INET6 : 0;
    if (!fam) return -1;
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs)) return -1;
    int found = -1, exact = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != fam || !(i->ifa_flags & IFF_UP)) continue;
        int same = 0, sub = 0;
        if (fam == AF_INET) {
            uint32_t x = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
            uint32_t m = i->ifa_netmask ? ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr : 0xffffffffu;
            same = x == a4.s_addr;
            sub = m && (x & m) == (a4.s_addr & m);
        } else {
            same = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &a6, sizeof a6);
        }
        if ((same && !exact) || (sub && found < 0)) {
            snprintf(out, n, "%s", i->ifa_name);
            found = 0;
            exact = same;
        }
    }
    freeifaddrs(ifs);
    return found;
}

/* Every RDMA port UCX may use ("mlx5_0:1,mlx5_1:1"), from sysfs; "" when none. */
static void cx_ucx_rdma_ports(char *out, size_t n)
{
    size_t len = 0;
    out[0] = 0;
    DIR *d = opendir("/sys/class/infiniband");
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        for (int port = 1; port <= 4; port++) {
            char path[512];
            snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d", de->d_name, port);
            DIR *pd = opendir(path);
            if (!pd) continue;
            closedir(pd);
            int w = snprintf(out + len, n - len, "%s%s:%d", len ? "," : "", de->d_name, port);
            if (w < 0 || (size_t)w >= n - len) { /* no room: keep the whole entries only */
                out[len] = 0;
                closedir(d);
                return;
            }
            len += (size_t)w;
        }
    }
    closedir(d);
}

/* Which network devices UCX may use. UCX's default is every one the host has, and a worker's
 * address then carries a tcp address per interface; an endpoint may pick any interface both
 * ends list, by UCX's own ranking. A host with an interface only some peers can reach (a
 * container bridge, a veth pair of a network namespace, an interface that goes away) then
 * gets endpoints whose connect is refused, and the pair's first op after a rejoin hung until
 * its timeout (the restarted peer's lanes went over a veth pair that had been removed). So tcp
 * goes over the interface of the engine's own control address, which peers demonstrably
 * reach; RDMA ports stay (they are what UCX is for). An engine listening on every interface
 * (0.0.0.0, ::) passes its advertised address here instead; a wildcard that still arrives
 * keeps UCX's default. The RDMA devices are the selection's plan's (the NICs of the GPUs, or every
 * active one); a build without select/ takes every RDMA port sysfs lists. CONNEX_NET_DEVICES as a
 * list of devices, or UCX_NET_DEVICES, replaces all of it. */
/* Multi-rail: UCX stripes a rendezvous transfer over up to UCX_MAX_RNDV_RAILS lanes of the
 * devices it is given (default 2; at most 4 in UCX 1.13, UCP_MAX_RAILS), picking by distance to
 * the memory for GPU buffers. With the plan's NICs (every NIC of the GPUs, or of the host) it
 * may use as many of them as there are, up to that limit. Eager messages stay on one lane
 * (UCX_MAX_EAGER_RAILS 1): they are small, and striping them only reorders. A user's value wins. */
#define CX_UCX_RAILS_MAX 4
static void cx_ucx_rails(ucp_config_t *cfg, const char *rdma)
{
    if (getenv("UCX_MAX_RNDV_RAILS") || !rdma || !*rdma) return;
    int n = 1;
    for (const char *c = rdma; *c; c++) n += *c == ',';
    if (n < 2) return;
    char v[8];
    snprintf(v, sizeof v, "%d", n < CX_UCX_RAILS_MAX ? n : CX_UCX_RAILS_MAX);
    (void)cx_ucx_set(cfg, "MAX_RNDV_RAILS", v);
}

static int cx_ucx_net_devices(ucp_config_t *cfg, const cx_backend_params_t *prm, const char *listen_ip)
{
    const char *dev = NULL;
    if (getenv("UCX_NET_DEVICES")) return CX_OK;
    /* The selection's plan: its RDMA devices (CONNEX_NET_DEVICES "gpu0=mlx5_2" already turned
     * into device names), or the user's list as given. Without a plan: CONNEX_NET_DEVICES. */
    if (prm->net_devices) {
        if (prm->net_devices_exact) dev = prm->net_devices;
    } else {
        dev = cx_opts_str(prm->opts, "CONNEX_NET_DEVICES");
    }
    if (dev && *dev) {
        if (cx_ucx_set(cfg, "NET_DEVICES", dev) != CX_OK) return CX_EINVAL;
        cx_ucx_rails(cfg, dev);
        return CX_OK;
    }
    if (!listen_ip || !*listen_ip || !strcmp(listen_ip, "0.0.0.0") || !strcmp(listen_ip, "::")) return CX_OK;
    char ifn[IF_NAMESIZE + 1], rdma[512], list[600];
    if (cx_ucx_ip_ifname(listen_ip, ifn, sizeof ifn)) {
        cx_info("ucx: no interface holds %s; UCX picks its network devices itself", listen_ip);
        return CX_OK;
    }
    if (prm->net_devices)
        snprintf(rdma, sizeof rdma, "%s", prm->net_devices);
    else
        cx_ucx_rdma_ports(rdma, sizeof rdma);
    snprintf(list, sizeof list, "%s%s%s", ifn, rdma[0] ? "," : "", rdma);
    (void)cx_ucx_set(cfg, "NET_DEVICES", list);
    cx_ucx_rails(cfg, rdma);
    return CX_OK;
}

int cx_ucx_config(ucp_config_t *cfg, const cx_backend_params_t *prm, const char *listen_ip)
{
    if (cx_ucx_net_devices(cfg, prm, listen_ip) != CX_OK) return CX_EINVAL;
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
        ucs_status_t st = cx_ucx_lib.ucp_config_modify(cfg, "PUT_ENABLE", "n");
        if (st == UCS_OK)
            cx_info("ucx: UCX_TCP_PUT_ENABLE=n (tcp PUT zero-copy off)");
        else
            cx_warn("ucx: cannot turn tcp PUT zero-copy off: %s", cx_ucx_lib.ucs_status_string(st));
    }
    /* UCX's tcp transport connects with a blocking connect() by default (UCX_TCP_CONN_NB=n),
     * inside ucp_ep_create on our progress thread: to an address cut off by a partition that
     * held the engine (heartbeats, other peers, op timeouts) for the kernel's SYN retries, about
     * 12 s against a 600 ms op timeout. Non-blocking, the op times out on time. Same field
     * rule as above; a user's UCX_TCP_CONN_NB wins. */
    if (!getenv("UCX_TCP_CONN_NB")) {
        ucs_status_t st = cx_ucx_lib.ucp_config_modify(cfg, "CONN_NB", "y");
        if (st == UCS_OK)
            cx_info("ucx: UCX_TCP_CONN_NB=y (non-blocking tcp connect)");
        else
            cx_warn("ucx: cannot make tcp connects non-blocking: %s", cx_ucx_lib.ucs_status_string(st));
    }
    /* UCX before 1.16 runs put/get on CUDA memory through the v1 protocols, which pick
     * short/bcopy (a CPU memcpy on device memory) instead of GPUDirect zero-copy; the v2
     * protocol selection (UCX_PROTO_ENABLE=y) picks rc/dc zcopy. Newer UCX enables v2 by
     * default, and an explicit UCX_PROTO_ENABLE is the user's choice either way. */
    unsigned maj = 0, min = 0, rel = 0;
    cx_ucx_lib.ucp_get_version(&maj, &min, &rel);
    if (!getenv("UCX_PROTO_ENABLE") && (maj == 1 && min < 16) && cx_ucx_rdma_usable())
        (void)cx_ucx_set(cfg, "PROTO_ENABLE", "y");
    return CX_OK;
}

unsigned long long cx_ucx_opt(const cx_ucx_t *b, const char *name)
{
    return cx_opts_num(b->opts, name, NULL); /* the table's default when unset */
}
