/* The advertised address (advertise.h): what peers are told to connect to. */
#include "advertise.h"

#include "connex/connex.h"
#include "connex/log.h"
#include "connex/options.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CX_MAX_IFADDRS 64

int cx_ip_is_wildcard(const char *ip)
{
    return !ip || !*ip || !strcmp(ip, "0.0.0.0") || !strcmp(ip, "::");
}

static int usable(const cx_ifaddr_t *a, int family)
{
    if (a->family != family || !a->up || a->loopback) return 0;
    if (family == AF_INET6) {
        struct in6_addr x;
        if (inet_pton(AF_INET6, a->ip, &x) != 1 || IN6_IS_ADDR_LINKLOCAL(&x) || IN6_IS_ADDR_LOOPBACK(&x)) return 0;
    }
    return 1;
}

/* The default-route interface's address of that family, else the first usable one; NULL. */
static const char *pick(const cx_ifaddr_t *ifs, int n, int family)
{
    for (int i = 0; i < n; i++)
        if (usable(&ifs[i], family) && ifs[i].default_route) return ifs[i].ip;
    for (int i = 0; i < n; i++)
        if (usable(&ifs[i], family)) return ifs[i].ip;
    return NULL;
}

void cx_advertise_choose(const cx_ifaddr_t *ifs, int n, const char *listen_ip, char *out, size_t len)
{
    int v6 = listen_ip && strchr(listen_ip, ':') != NULL;
    const char *ip = v6 ? pick(ifs, n, AF_INET6) : NULL;
    if (!ip) ip = pick(ifs, n, AF_INET);
    if (!ip) ip = v6 ? "::1" : "127.0.0.1";
    snprintf(out, len, "%s", ip);
}

/* ---- the host's interfaces (the thin part: getifaddrs and the kernel's routing tables) ---- */

/* 1 when the routing table at path names ifname with a default route. /proc/net/route: a
 * header, then "Iface Destination(hex) ..."; /proc/net/ipv6_route: "dest plen src slen next
 * metric refcnt use flags iface". */
static int has_default_route(const char *ifname, int family)
{
    FILE *f = fopen(family == AF_INET ? "/proc/net/route" : "/proc/net/ipv6_route", "r");
    if (!f) return 0;
    char line[512];
    int found = 0;
    for (int i = 0; i < 4096 && !found && fgets(line, sizeof line, f); i++) {
        char a[64], b[64], c[64], d[64], e[64], g[64], h[64], k[64], l[64], ifn[64];
        if (family == AF_INET) {
            if (sscanf(line, "%63s %63s", ifn, a) == 2 && !strcmp(a, "00000000") && !strcmp(ifn, ifname)) found = 1;
        } else if (sscanf(line, "%63s %63s %63s %63s %63s %63s %63s %63s %63s %63s", a, b, c, d, e, g, h, k, l, ifn) ==
                       10 &&
                   !strcmp(a, "00000000000000000000000000000000") && !strcmp(b, "00") && !strcmp(ifn, ifname)) {
            found = 1;
        }
    }
    fclose(f);
    return found;
}

static int host_ifaddrs(cx_ifaddr_t *out, int max)
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs)) return 0;
    int n = 0;
    for (struct ifaddrs *i = ifs; i && n < max; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
        cx_ifaddr_t *a = &out[n];
        memset(a, 0, sizeof *a);
        a->family = i->ifa_addr->sa_family;
        const void *src = a->family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                               : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (!inet_ntop(a->family, src, a->ip, sizeof a->ip)) continue;
        snprintf(a->name, sizeof a->name, "%s", i->ifa_name);
        a->up = (i->ifa_flags & IFF_UP) != 0;
        a->loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
        a->default_route = has_default_route(a->name, a->family);
        n++;
    }
    freeifaddrs(ifs);
    return n;
}

int cx_advertise_resolve(const cx_opts_t *o, const char *listen_ip, const char *want, char *out, size_t len)
{
    const char *from = "config.advertise_ip";
    if (!want || !*want) {
        want = cx_opts_str(o, "CONNEX_ADVERTISE_IP");
        from = "CONNEX_ADVERTISE_IP";
    }
    if (want && *want) {
        struct in6_addr a;
        int v4 = inet_pton(AF_INET, want, &a) == 1, v6 = !v4 && inet_pton(AF_INET6, want, &a) == 1;
        int listen_v6 = listen_ip && strchr(listen_ip, ':') != NULL;
        const char *why = NULL;
        if (!v4 && !v6)
            why = "not a numeric IPv4/IPv6 address";
        else if (cx_ip_is_wildcard(want))
            why = "a wildcard address, which no peer can connect to";
        else if (v6 && !listen_v6)
            why = "an IPv6 address, and the engine listens on IPv4";
        else if (v4 && listen_v6 && !cx_ip_is_wildcard(listen_ip))
            why = "an IPv4 address, and the engine listens on one IPv6 address";
        if (why || strlen(want) >= len) {
            cx_error("engine: %s='%s' is %s", from, want, why ? why : "too long");
            return CX_EINVAL;
        }
        snprintf(out, len, "%s", want);
        return CX_OK;
    }
    if (!cx_ip_is_wildcard(listen_ip)) {
        snprintf(out, len, "%s", listen_ip);
        return CX_OK;
    }
    cx_ifaddr_t ifs[CX_MAX_IFADDRS];
    int n = host_ifaddrs(ifs, CX_MAX_IFADDRS);
    cx_advertise_choose(ifs, n, listen_ip, out, len);
    cx_info("engine: listening on %s, advertising %s (CONNEX_ADVERTISE_IP chooses another)", listen_ip, out);
    return CX_OK;
}
