/* Two network namespaces joined by a veth pair, created by the bench for the link-down fault
 * and always removed again (atexit and SIGINT/SIGTERM). Root only. */
#ifndef CX_BENCH_NETNS_H
#define CX_BENCH_NETNS_H

#include <stddef.h>

#define CX_BENCH_NS_IP_A "10.211.0.1" /* the survivor's side */
#define CX_BENCH_NS_IP_B "10.211.0.2" /* the peer's side */

typedef struct cx_bench_netns {
    char ns_a[32], ns_b[32];
    char veth_a[16]; /* the survivor's end */
    char veth_b[16]; /* the peer's end: taken down to cut it off */
} cx_bench_netns_t;

/* 0, or -1 with a reason in why (not root, no `ip`, creation failed). */
int cx_bench_netns_setup(cx_bench_netns_t *n, char *why, size_t len);
int cx_bench_netns_enter(const cx_bench_netns_t *n); /* this process into ns_a: 0 or -1 */
int cx_bench_netns_link(const cx_bench_netns_t *n, int up);
void cx_bench_netns_cleanup(void);

#endif
