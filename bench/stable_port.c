/* Why a restartable process needs a port outside the ephemeral range: see stable_port.h. */
#include "stable_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Where the kernel allocates ephemeral ports; Linux's default when the file cannot be read. */
static void ephemeral_range(unsigned *lo, unsigned *hi)
{
    *lo = 32768;
    *hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (!f) return;
    unsigned a, b;
    if (fscanf(f, "%u %u", &a, &b) == 2 && a <= b && b <= 65535) {
        *lo = a;
        *hi = b;
    }
    fclose(f);
}

static int bindable(const char *ip, uint16_t port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
        sl = sizeof *s4;
    } else if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        sl = sizeof *s6;
    } else {
        return 0;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    /* The same options the engine's listener uses, so a port in TIME_WAIT counts as free. */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int ok = bind(fd, (struct sockaddr *)&ss, sl) == 0;
    close(fd);
    return ok;
}

uint16_t cx_bench_stable_port(const char *ip)
{
    if (!ip) ip = "127.0.0.1";
    unsigned lo, hi;
    ephemeral_range(&lo, &hi);
    /* Below the range from 10000 (clear of registered services), else above it. */
    unsigned from = 10000, to = lo > 0 ? lo - 1 : 0;
    if (to < from + 1000) {
        from = hi + 1;
        to = 65535;
    }
    if (to < from) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)ts.tv_nsec;
    for (int i = 0; i < 64; i++) {
        unsigned port = from + (unsigned)rand_r(&seed) % (to - from + 1);
        if (bindable(ip, (uint16_t)port)) return (uint16_t)port;
    }
    return 0;
}
