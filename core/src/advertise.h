/* The address an engine advertises (its URL, HELLO, directory entry, the backends' address
 * blobs): the configured advertise address, else the listen address, else, for a wildcard
 * listen address (0.0.0.0, ::), the address of this host's default-route interface. */
#ifndef CX_ADVERTISE_H
#define CX_ADVERTISE_H

#include "connex/options.h"

#include <stddef.h>

#define CX_IP_MAX 48 /* a numeric address with its NUL, as cx_url_t's host */

/* One interface address, as getifaddrs and the routing table describe it. */
typedef struct cx_ifaddr {
    char name[32];
    char ip[CX_IP_MAX]; /* numeric */
    int family;         /* AF_INET or AF_INET6 */
    int up;             /* IFF_UP */
    int loopback;       /* IFF_LOOPBACK */
    int default_route;  /* the interface holds a default route of its family */
} cx_ifaddr_t;

/* 1 for NULL, "", "0.0.0.0" and "::". */
int cx_ip_is_wildcard(const char *ip);

/* The address to advertise for a wildcard listen address, from the host's interfaces (pure):
 * an UP, non-loopback interface with a default route, else the first UP non-loopback one, else
 * the loopback address. For "::" IPv6 addresses come first (link-local ones never: they need a
 * scope), then IPv4 (a socket on :: takes IPv4 too); for "0.0.0.0" IPv4 only. */
void cx_advertise_choose(const cx_ifaddr_t *ifs, int n, const char *listen_ip, char *out, size_t len);

/* The address to advertise: `want` (the config's advertise_ip; NULL: CONNEX_ADVERTISE_IP in the
 * engine's table `o`) when
 * set, else listen_ip, else cx_advertise_choose over this host's interfaces. CX_EINVAL, with a
 * log line naming the value and where it came from, when the wanted one is not a numeric
 * address, is a wildcard, or is of a family the listen address cannot serve. */
int cx_advertise_resolve(const cx_opts_t *o, const char *listen_ip, const char *want, char *out, size_t len);

#endif
