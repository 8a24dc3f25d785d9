/* Network namespaces for the link-down fault: ns_a (the survivor, 10.211.0.1) and ns_b (the
 * peer, 10.211.0.2) joined by a veth pair. Taking the peer's end down cuts it off without a
 * reset, which is what a pulled cable or a partition looks like. The addresses exist only inside
 * these namespaces. Cleanup runs from atexit and from the SIGINT/SIGTERM handler, so it uses
 * only fork/execve/waitpid. */
#include "bench_netns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

static char ip_path[64];
static char del_a[32], del_b[32];
static volatile sig_atomic_t armed;
static pid_t owner; /* forked helpers inherit atexit; only the creator removes the namespaces */

static int run(const char *const argv[])
{
    pid_t p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) {
            dup2(dn, 1);
            dup2(dn, 2);
        }
        static char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        execve(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    int st;
    while (waitpid(p, &st, 0) < 0) {}
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

#define IP(...) run((const char *const[]){ ip_path, __VA_ARGS__, NULL })

void cx_bench_netns_cleanup(void)
{
    if (!armed || getpid() != owner) return;
    armed = 0;
    IP("netns", "del", del_a); /* takes the veth pair with it */
    IP("netns", "del", del_b);
}

static void on_signal(int sig)
{
    cx_bench_netns_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

int cx_bench_netns_setup(cx_bench_netns_t *n, char *why, size_t len)
{
    if (geteuid() != 0) {
        snprintf(why, len, "skipped: needs root (network namespaces)");
        return -1;
    }
    static const char *cands[] = { "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip" };
    ip_path[0] = 0;
    for (int i = 0; i < 4 && !ip_path[0]; i++)
        if (access(cands[i], X_OK) == 0) snprintf(ip_path, sizeof ip_path, "%s", cands[i]);
    if (!ip_path[0]) {
        snprintf(why, len, "skipped: no ip(8) (Debian: iproute2)");
        return -1;
    }
    int pid = (int)getpid();
    char *va = n->veth_a;
    snprintf(n->ns_a, sizeof n->ns_a, "cxb-a-%d", pid);
    snprintf(n->ns_b, sizeof n->ns_b, "cxb-b-%d", pid);
    snprintf(va, sizeof n->veth_a, "cxba%d", pid % 10000000);
    snprintf(n->veth_b, sizeof n->veth_b, "cxbb%d", pid % 10000000);
    snprintf(del_a, sizeof del_a, "%s", n->ns_a);
    snprintf(del_b, sizeof del_b, "%s", n->ns_b);
    owner = getpid();
    armed = 1;
    atexit(cx_bench_netns_cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (IP("netns", "add", n->ns_a) || IP("netns", "add", n->ns_b) ||
        IP("-n", n->ns_a, "link", "add", va, "type", "veth", "peer", "name", n->veth_b, "netns", n->ns_b) ||
        IP("-n", n->ns_a, "addr", "add", CX_BENCH_NS_IP_A "/24", "dev", va) ||
        IP("-n", n->ns_b, "addr", "add", CX_BENCH_NS_IP_B "/24", "dev", n->veth_b) ||
        IP("-n", n->ns_a, "link", "set", va, "up") || IP("-n", n->ns_b, "link", "set", n->veth_b, "up") ||
        IP("-n", n->ns_a, "link", "set", "lo", "up") || IP("-n", n->ns_b, "link", "set", "lo", "up")) {
        cx_bench_netns_cleanup();
        snprintf(why, len, "skipped: creating namespaces / veth failed (ip netns add ...)");
        return -1;
    }
    return 0;
}

/* Like `ip netns exec`: the network namespace, and a mount namespace of our own with that
 * network's /sys. UCX lists its TCP interfaces in /sys/class/net; with the host's /sys it would
 * advertise addresses this namespace does not have, and peers could not reach it. */
int cx_bench_netns_enter(const cx_bench_netns_t *n)
{
    char path[64];
    snprintf(path, sizeof path, "/run/netns/%s", n->ns_a);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    if (rc) return rc;
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL)) return -1;
    if (umount2("/sys", MNT_DETACH) && errno != EINVAL) return -1;
    return mount(n->ns_a, "/sys", "sysfs", 0, NULL);
}

/* 1 when `ip -n ns -o link show dev dev` says LOWER_UP. */
static int lower_up(const char *ns, const char *dev)
{
    char cmd[160], line[512];
    snprintf(cmd, sizeof cmd, "%s -n %s -o link show dev %s 2>/dev/null", ip_path, ns, dev);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    int up = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "LOWER_UP")) up = 1;
    pclose(f);
    return up;
}

int cx_bench_netns_link(const cx_bench_netns_t *n, int up)
{
    int rc = IP("-n", n->ns_b, "link", "set", n->veth_b, up ? "up" : "down");
    if (rc || !up) return rc;
    /* `ip link set up` returns before the veth has its carrier. UCX lists only interfaces that
     * are running: a peer started in that gap advertises no address on the veth and cannot be
     * reached (half the ucx_tcp link-down runs failed so). Wait, bounded, for both ends. */
    for (int i = 0; i < 300; i++) {
        if (lower_up(n->ns_a, n->veth_a) && lower_up(n->ns_b, n->veth_b)) return 0;
        usleep(10000);
    }
    fprintf(stderr, "connex-bench: the veth pair has no carrier 3 s after link up\n");
    return -1;
}
