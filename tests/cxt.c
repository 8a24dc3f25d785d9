#include "cxt.h"
#include "stable_port.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#ifndef CX_PEER_PATH
#define CX_PEER_PATH "./cx_peer"
#endif

void cxt_fill(void *buf, size_t len, uint32_t seed, uint64_t start)
{
    uint8_t *b = buf;
    for (size_t i = 0; i < len; i++) b[i] = cxt_pat(seed, start + i);
}

long long cxt_check(const void *buf, size_t len, uint32_t seed, uint64_t start)
{
    const uint8_t *b = buf;
    for (size_t i = 0; i < len; i++)
        if (b[i] != cxt_pat(seed, start + i)) return (long long)i;
    return -1;
}

uint64_t cxt_hash(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

uint64_t cxt_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int cxt_list_fds(int *out, int max)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int self = dirfd(d), n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        int fd = atoi(de->d_name);
        if (fd == self) continue;
        if (out && n < max) out[n] = fd;
        n++;
    }
    closedir(d);
    return n;
}

int cxt_count_fds(void)
{
    return cxt_list_fds(NULL, 0);
}

int cxt_fds_without_cloexec(const int *known, int nknown)
{
    int fds[1024];
    int n = cxt_list_fds(fds, 1024), bad = 0;
    if (n > 1024) n = 1024;
    for (int i = 0; i < n; i++) {
        if (fds[i] < 3) continue;
        int old = 0;
        for (int k = 0; k < nknown; k++) old |= known[k] == fds[i];
        if (old) continue;
        int fl = fcntl(fds[i], F_GETFD);
        if (fl >= 0 && !(fl & FD_CLOEXEC)) {
            char path[64], tgt[256] = "";
            snprintf(path, sizeof path, "/proc/self/fd/%d", fds[i]);
            ssize_t r = readlink(path, tgt, sizeof tgt - 1);
            if (r > 0) tgt[r] = 0;
            fprintf(stderr, "cxt: fd %d (%s) is not close-on-exec\n", fds[i], tgt);
            bad++;
        }
    }
    return bad;
}

/* "tcp 127.0.0.1:5000 -> 127.0.0.1:6000 st 01" for a TCP socket inode, from /proc/self/net. */
static int cxt_tcp_by_inode(unsigned long inode, char *out, size_t cap)
{
    static const char *const files[] = { "/proc/self/net/tcp", "/proc/self/net/tcp6" };
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (!fp) continue;
        char line[512];
        while (fgets(line, sizeof line, fp)) {
            char la[64], ra[64], st[8];
            unsigned long ino = 0;
            if (sscanf(line, "%*d: %63s %63s %7s %*s %*s %*s %*d %*d %lu", la, ra, st, &ino) != 4 || ino != inode)
                continue;
            const char *lp = strrchr(la, ':'), *rp = strrchr(ra, ':');
            snprintf(out, cap, "tcp port %lu -> port %lu, state %s", lp ? strtoul(lp + 1, NULL, 16) : 0,
                     rp ? strtoul(rp + 1, NULL, 16) : 0, st);
            fclose(fp);
            return 1;
        }
        fclose(fp);
    }
    return 0;
}

void cxt_fds_report(const int *known, int nknown, const char *why)
{
    int fds[1024];
    int n = cxt_list_fds(fds, 1024);
    if (n > 1024) n = 1024;
    for (int i = 0; i < n; i++) {
        int old = 0;
        for (int k = 0; k < nknown; k++) old |= known[k] == fds[i];
        if (old) continue;
        char path[64], tgt[256] = "";
        snprintf(path, sizeof path, "/proc/self/fd/%d", fds[i]);
        ssize_t r = readlink(path, tgt, sizeof tgt - 1);
        if (r > 0) tgt[r] = 0;
        char tcp[128] = "";
        unsigned long ino = 0;
        if (sscanf(tgt, "socket:[%lu]", &ino) == 1) cxt_tcp_by_inode(ino, tcp, sizeof tcp);
        fprintf(stderr, "cxt: %s: fd %d (%s%s%s) is new\n", why, fds[i], tgt, *tcp ? ", " : "", tcp);
    }
    for (int k = 0; k < nknown; k++) {
        int still = 0;
        for (int i = 0; i < n; i++) still |= known[k] == fds[i];
        if (!still) fprintf(stderr, "cxt: %s: fd %d is gone\n", why, known[k]);
    }
}

int cxt_fds_settle(int want, int ms)
{
    uint64_t t0 = cxt_now_ns();
    int n = cxt_count_fds();
    while (n != want && cxt_ms_since(t0) < ms) {
        usleep(10000);
        n = cxt_count_fds();
    }
    return n;
}

/* Socket inodes of the TCP sockets (v4 and v6) with a local or remote port in ports[]. */
static int cxt_port_inodes(const uint16_t *ports, int nports, unsigned long *out, int max)
{
    static const char *const files[] = { "/proc/self/net/tcp", "/proc/self/net/tcp6" };
    int n = 0;
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (!fp) continue;
        char line[512];
        if (!fgets(line, sizeof line, fp)) {
            fclose(fp);
            continue;
        } /* header */
        while (fgets(line, sizeof line, fp)) {
            char la[64], ra[64];
            unsigned long inode = 0;
            if (sscanf(line, "%*d: %63s %63s %*x %*s %*s %*s %*d %*d %lu", la, ra, &inode) != 3) continue;
            const char *lp = strrchr(la, ':'), *rp = strrchr(ra, ':');
            if (!lp || !rp || !inode) continue;
            unsigned lport = (unsigned)strtoul(lp + 1, NULL, 16), rport = (unsigned)strtoul(rp + 1, NULL, 16);
            for (int i = 0; i < nports; i++)
                if ((lport == ports[i] || rport == ports[i]) && n < max) {
                    out[n++] = inode;
                    break;
                }
        }
        fclose(fp);
    }
    return n;
}

int cxt_sockets_without_cloexec(const uint16_t *ports, int nports, int *checked)
{
    unsigned long inodes[256];
    int ni = cxt_port_inodes(ports, nports, inodes, 256), bad = 0;
    int fds[1024];
    int n = cxt_list_fds(fds, 1024);
    if (n > 1024) n = 1024;
    *checked = 0;
    for (int i = 0; i < n; i++) {
        char path[64], tgt[256] = "";
        snprintf(path, sizeof path, "/proc/self/fd/%d", fds[i]);
        ssize_t r = readlink(path, tgt, sizeof tgt - 1);
        if (r <= 0) continue;
        tgt[r] = 0;
        unsigned long inode;
        if (sscanf(tgt, "socket:[%lu]", &inode) != 1) continue;
        int mine = 0;
        for (int k = 0; k < ni; k++) mine |= inodes[k] == inode;
        if (!mine) continue;
        (*checked)++;
        int fl = fcntl(fds[i], F_GETFD);
        if (fl >= 0 && !(fl & FD_CLOEXEC)) {
            fprintf(stderr, "cxt: control socket fd %d (%s) is not close-on-exec\n", fds[i], tgt);
            bad++;
        }
    }
    return bad;
}

long cxt_rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long size = 0, res = 0;
    int ok = fscanf(f, "%ld %ld", &size, &res) == 2;
    fclose(f);
    return ok ? res * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

uint16_t cxt_refusing_port(int *hold)
{
    *hold = -1;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return 0;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &al)) {
        close(s);
        return 0;
    }
    *hold = s;
    return ntohs(a.sin_port);
}

/* ---- events ---- */

int cxt_wait_event(cx_engine_t *e, const char *lid, cx_event_type_t type, int timeout_ms, cx_event_t *out,
                   unsigned *seen)
{
    uint64_t deadline = cxt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = cxt_now_ns();
        if (now >= deadline) return CX_ETIMEDOUT;
        int left = (int)((deadline - now + 999999) / 1000000);
        cx_event_t ev;
        int rc = cx_wait_event(e, &ev, left);
        if (rc == CX_ETIMEDOUT) return CX_ETIMEDOUT;
        if (rc != CX_OK) {
            fprintf(stderr, "cxt: cx_wait_event returned %d (%s)\n", rc, cx_strerror(rc));
            return rc;
        }
        char l[CX_URL_MAX];
        cx_lid_format(&ev.peer, l, sizeof l);
        fprintf(stderr, "cxt: event %s %s inc=%llx reason='%s'\n", cx_event_name(ev.type), l,
                (unsigned long long)ev.incarnation, ev.reason);
        int mine = !lid || strcmp(lid, l) == 0;
        if (mine && seen) *seen |= 1u << ev.type;
        if (mine && ev.type == type) {
            if (out) *out = ev;
            return CX_OK;
        }
    }
}

void cxt_drain_events(cx_engine_t *e)
{
    cx_event_t ev;
    for (int i = 0; i < 10000 && cx_wait_event(e, &ev, 0) == CX_OK; i++) {}
}

/* ---- peers ---- */

static int peer_reap(cxt_peer_t *p, int timeout_ms, pid_t *pid_out, int *timed_out);
static void close_fds(cxt_peer_t *p);

/* A peer that did not start: killed and reaped, its end said on stderr but not checked (the
 * caller may try another port; the start failing fails the test otherwise). */
static void peer_abandon(cxt_peer_t *p)
{
    pid_t pid;
    int timed_out;
    if (p->pid > 0) {
        kill(p->pid, SIGCONT);
        kill(p->pid, SIGKILL);
    }
    peer_reap(p, 5000, &pid, &timed_out);
    close_fds(p);
    int st = p->status;
    if (WIFEXITED(st))
        fprintf(stderr, "cxt: peer pid %d that did not start exited with status %d\n", (int)pid, WEXITSTATUS(st));
    else if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
        fprintf(stderr, "cxt: peer pid %d that did not start crashed with signal %d (%s)\n", (int)pid, WTERMSIG(st),
                strsignal(WTERMSIG(st)));
}

static int peer_start_on(cxt_peer_t *p, const cxt_peer_opts_t *o, uint16_t port, int timeout_ms)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC)) return -1;
    if (pipe2(out, O_CLOEXEC)) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    char a[12][32];
    snprintf(a[0], 32, "%u", o->stage);
    snprintf(a[1], 32, "%u", o->shard);
    snprintf(a[2], 32, "%u", o->replica);
    snprintf(a[3], 32, "%u", port);
    snprintf(a[4], 32, "%u", o->hb_ms);
    snprintf(a[5], 32, "%u", o->hb_timeout_ms);
    snprintf(a[6], 32, "%u", o->op_timeout_ms);
    snprintf(a[7], 32, "%zu", o->region ? o->region : (size_t)1 << 20);
    snprintf(a[8], 32, "%u", o->seed);
    const char *argv[32] = { CX_PEER_PATH,   "--model",      o->model ? o->model : "peer",
                             "--stage",      a[0],           "--shard",
                             a[1],           "--replica",    a[2],
                             "--port",       a[3],           "--hb",
                             a[4],           "--hb-timeout", a[5],
                             "--op-timeout", a[6],           "--region",
                             a[7],           "--seed",       a[8] };
    int ac = 21;
    if (o->connect) {
        argv[ac++] = "--connect";
        argv[ac++] = o->connect;
    }
    if (o->listen_ip) {
        argv[ac++] = "--listen";
        argv[ac++] = o->listen_ip;
    }
    if (o->mem) {
        argv[ac++] = "--mem";
        argv[ac++] = o->mem;
    }
    if (o->host_id) {
        argv[ac++] = "--host-id";
        argv[ac++] = o->host_id;
    }
    char ballast[16];
    if (o->ballast_mib) {
        snprintf(ballast, sizeof ballast, "%u", o->ballast_mib);
        argv[ac++] = "--ballast";
        argv[ac++] = ballast;
    }
    argv[ac] = NULL;
    char devs[128];
    snprintf(devs, sizeof devs, "CONNEX_NET_DEVICES=%s", o->net_devices ? o->net_devices : "");
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* A test that dies must not leave peers behind holding ports. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(in[0], 0);
        dup2(out[1], 1);
        /* Prefixes through exec, not setenv: after fork in a threaded process only
         * async-signal-safe calls are. */
        const char *full[48];
        int n = 0;
        if (o->netns) {
            full[n++] = "ip";
            full[n++] = "netns";
            full[n++] = "exec";
            full[n++] = o->netns;
        }
        if (o->net_devices) {
            full[n++] = "env";
            full[n++] = devs;
        }
        for (int i = 0; i <= ac; i++) full[n + i] = argv[i];
        if (n) execvp(full[0], (char *const *)full);
        execv(CX_PEER_PATH, (char *const *)argv);
        static const char m[] = "cxt: exec " CX_PEER_PATH " failed\n";
        if (write(2, m, sizeof m - 1) < 0) _exit(126);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->pid = pid;
    p->in_fd = in[1];
    p->out_fd = out[0];
    p->seed = o->seed;
    char line[512];
    if (cxt_peer_expect(p, "READY ", timeout_ms, line, sizeof line)) {
        fprintf(stderr, "cxt: peer %d sent no READY within %d ms\n", (int)pid, timeout_ms);
        peer_abandon(p);
        return -1;
    }
    unsigned long long base = 0;
    size_t len = 0;
    if (sscanf(line, "READY %159s %llx %zu", p->url, &base, &len) != 3) {
        fprintf(stderr, "cxt: bad READY line '%s'\n", line);
        peer_abandon(p);
        return -1;
    }
    p->base = base;
    p->len = len;
    cx_url_t u;
    if (cx_url_parse(p->url, &u, NULL, 0) == CX_OK) {
        p->port = u.port;
        cx_lid_format(&u.lid, p->lid, sizeof p->lid);
    }
    return 0;
}

/* A peer asked for "any port" gets one outside the ephemeral range, because tests restart peers
 * on the port they first had: see bench/stable_port.h. Such a port can still be taken between our
 * check and the peer's bind by another test picking the same one; then try another. A peer in a
 * network namespace has that namespace's ports to itself. */
int cxt_peer_start(cxt_peer_t *p, const cxt_peer_opts_t *o, int timeout_ms)
{
    if (o->port || o->netns) return peer_start_on(p, o, o->port, timeout_ms);
    for (int i = 0; i < 3; i++) {
        const char *ip = o->listen_ip ? o->listen_ip : getenv("CONNEX_TEST_IP");
        uint16_t port = cx_bench_stable_port(ip && *ip ? ip : NULL);
        if (!port) break;
        if (peer_start_on(p, o, port, timeout_ms) == 0) return 0;
        fprintf(stderr, "cxt: peer did not start on port %u, trying another\n", port);
    }
    return peer_start_on(p, o, 0, timeout_ms);
}

/* Reads one line into line (without '\n') before the deadline. 0, or -1 on timeout/EOF. */
static int read_line(cxt_peer_t *p, uint64_t deadline, char *line, size_t n)
{
    for (;;) {
        char *nl = memchr(p->rbuf, '\n', p->rlen);
        if (nl) {
            size_t l = (size_t)(nl - p->rbuf);
            size_t c = l < n - 1 ? l : n - 1;
            memcpy(line, p->rbuf, c);
            line[c] = 0;
            memmove(p->rbuf, nl + 1, p->rlen - l - 1);
            p->rlen -= l + 1;
            return 0;
        }
        if (p->rlen == sizeof p->rbuf) p->rlen = 0; /* absurd line: drop it */
        uint64_t now = cxt_now_ns();
        if (now >= deadline || p->out_fd < 0) return -1;
        struct pollfd pf = { .fd = p->out_fd, .events = POLLIN };
        int r = poll(&pf, 1, (int)((deadline - now + 999999) / 1000000));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t k = read(p->out_fd, p->rbuf + p->rlen, sizeof p->rbuf - p->rlen);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            close(p->out_fd);
            p->out_fd = -1;
            return -1;
        }
        p->rlen += (size_t)k;
    }
}

static void stash(cxt_peer_t *p, const char *line)
{
    if (p->nstash == CXT_STASH) { /* keep the newest: drop the oldest */
        free(p->stash[0]);
        memmove(p->stash, p->stash + 1, (CXT_STASH - 1) * sizeof p->stash[0]);
        p->nstash--;
    }
    p->stash[p->nstash++] = strdup(line);
}

int cxt_peer_expect(cxt_peer_t *p, const char *prefix, int timeout_ms, char *line, size_t n)
{
    size_t pl = strlen(prefix);
    for (int i = 0; i < p->nstash; i++) {
        if (strncmp(p->stash[i], prefix, pl) == 0) {
            snprintf(line, n, "%s", p->stash[i]);
            free(p->stash[i]);
            memmove(p->stash + i, p->stash + i + 1, (size_t)(p->nstash - i - 1) * sizeof p->stash[0]);
            p->nstash--;
            return 0;
        }
    }
    uint64_t deadline = cxt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    char buf[1024];
    while (read_line(p, deadline, buf, sizeof buf) == 0) {
        if (strncmp(buf, prefix, pl) == 0) {
            snprintf(line, n, "%s", buf);
            return 0;
        }
        stash(p, buf);
    }
    return CX_ETIMEDOUT;
}

static int peer_vsend(cxt_peer_t *p, char *cmd, size_t cap, const char *fmt, va_list ap)
{
    int l = vsnprintf(cmd, cap - 1, fmt, ap);
    if (l < 0 || (size_t)l >= cap - 1) return -1;
    cmd[l++] = '\n';
    if (p->in_fd < 0 || write(p->in_fd, cmd, (size_t)l) != l) return -1;
    cmd[l - 1] = 0;
    return l - 1;
}

int cxt_peer_send(cxt_peer_t *p, const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    int l = peer_vsend(p, cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return l < 0 ? CX_ERR : 0;
}

int cxt_peer_reply(cxt_peer_t *p, int timeout_ms, char *reply, size_t n)
{
    uint64_t deadline = cxt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    char buf[1024];
    while (read_line(p, deadline, buf, sizeof buf) == 0) {
        if (strncmp(buf, "OK", 2) == 0 || strncmp(buf, "ERR", 3) == 0) {
            if (reply) snprintf(reply, n, "%s", buf);
            if (buf[0] == 'O') return 0;
            int rc = CX_ERR;
            sscanf(buf, "ERR %d", &rc);
            return rc ? rc : CX_ERR;
        }
        stash(p, buf);
    }
    if (reply && n) reply[0] = 0;
    return CX_ETIMEDOUT;
}

int cxt_peer_cmd(cxt_peer_t *p, int timeout_ms, char *reply, size_t n, const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    int l = peer_vsend(p, cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (l < 0) return CX_ERR;
    int rc = cxt_peer_reply(p, timeout_ms, reply, n);
    if (rc == CX_ETIMEDOUT)
        fprintf(stderr, "cxt: no reply from peer %d to '%s' within %d ms\n", (int)p->pid, cmd, timeout_ms);
    return rc;
}

void cxt_peer_drain(cxt_peer_t *p, int ms)
{
    uint64_t deadline = cxt_now_ns() + (uint64_t)ms * 1000000ull;
    char buf[1024];
    while (read_line(p, deadline, buf, sizeof buf) == 0) {}
}

/* Failures found off the test's thread (a peer reaped by a worker), reported at exit. */
static int g_peer_failures;

/* A peer that went (pid, wait status st; timed_out: we SIGKILLed it at the deadline) must have
 * exited 0 unless the test killed it. */
static void peer_check_exit(const cxt_peer_t *p, pid_t pid, int st, int timed_out, int timeout_ms)
{
    char msg[CX_URL_MAX + 128];
    const char *name = p->lid[0] ? p->lid : "(starting)";
    if (p->killed) { /* exempt, unless it had died some other way before the SIGKILL came */
        if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
            snprintf(msg, sizeof msg, "cxt: peer %s pid %d crashed with signal %d (%s) before it was killed", name,
                     (int)pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
        else if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
            snprintf(msg, sizeof msg, "cxt: peer %s pid %d exited with status %d before it was killed", name, (int)pid,
                     WEXITSTATUS(st));
        else
            return;
    } else if (timed_out)
        snprintf(msg, sizeof msg, "cxt: peer %s pid %d did not exit within %d ms (killed)", name, (int)pid, timeout_ms);
    else if (WIFSIGNALED(st))
        snprintf(msg, sizeof msg, "cxt: peer %s pid %d crashed with signal %d (%s)", name, (int)pid, WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    else if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
        snprintf(msg, sizeof msg, "cxt: peer %s pid %d exited with status %d", name, (int)pid, WEXITSTATUS(st));
    else
        return;
    fprintf(stderr, "%s\n", msg);
    if (syscall(SYS_gettid) != getpid()) { /* cmocka's failure jumps: only on the test's thread */
        __atomic_add_fetch(&g_peer_failures, 1, __ATOMIC_SEQ_CST);
        return;
    }
    fail_msg("%s", msg);
}

void cxt_peer_signal(cxt_peer_t *p, int sig)
{
    if (p->pid <= 0) return;
    if (sig == SIGKILL) p->killed = 1;
    kill(p->pid, sig);
    if (sig != SIGSTOP) return;
    /* kill() returns before the peer has stopped, and a request sent at once may still be
     * served. We are its parent: wait (2 s at most) until the whole process has stopped. */
    uint64_t deadline = cxt_now_ns() + 2000000000ull;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(p->pid, &st, WUNTRACED | WNOHANG);
        if (r == p->pid) {
            if (!WIFSTOPPED(st)) { /* it died instead: keep its status for the test */
                p->status = st;
                p->pid = -1;
                peer_check_exit(p, r, st, 0, 0);
            }
            return;
        }
        if ((r < 0 && errno != EINTR) || cxt_now_ns() >= deadline) return;
        usleep(200);
    }
}

/* Reaps the peer; *pid_out, *timed_out: what peer_check_exit needs. */
static int peer_reap(cxt_peer_t *p, int timeout_ms, pid_t *pid_out, int *timed_out)
{
    *pid_out = p->pid;
    *timed_out = 0;
    if (p->pid <= 0) return 0;
    uint64_t deadline = cxt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int st = 0, clean = 1;
    for (;;) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid || (r < 0 && errno != EINTR)) break;
        if (cxt_now_ns() >= deadline) {
            fprintf(stderr, "cxt: peer %d did not exit within %d ms, killing it\n", (int)p->pid, timeout_ms);
            kill(p->pid, SIGKILL);
            clean = 0;
            waitpid(p->pid, &st, 0);
            break;
        }
        usleep(2000);
    }
    p->status = st;
    p->pid = -1;
    *timed_out = !clean;
    return clean ? 0 : -1;
}

int cxt_peer_reap(cxt_peer_t *p, int timeout_ms)
{
    pid_t pid;
    int timed_out;
    if (p->pid <= 0) return 0;
    int rc = peer_reap(p, timeout_ms, &pid, &timed_out);
    peer_check_exit(p, pid, p->status, timed_out, timeout_ms);
    return rc;
}

static void close_fds(cxt_peer_t *p)
{
    if (p->in_fd >= 0) close(p->in_fd);
    if (p->out_fd >= 0) close(p->out_fd);
    p->in_fd = p->out_fd = -1;
    for (int i = 0; i < p->nstash; i++) free(p->stash[i]);
    p->nstash = 0;
    p->rlen = 0;
}

void cxt_peer_stop(cxt_peer_t *p)
{
    if (p->in_fd >= 0) {
        close(p->in_fd);
        p->in_fd = -1;
    }
    pid_t pid;
    int timed_out;
    int was = p->pid > 0;
    peer_reap(p, 5000, &pid, &timed_out);
    close_fds(p); /* before the check, which may end the test */
    if (was) peer_check_exit(p, pid, p->status, timed_out, 5000);
}

void cxt_peer_crash(cxt_peer_t *p)
{
    if (p->pid > 0) {
        p->killed = 1;
        kill(p->pid, SIGCONT); /* a stopped process dies on SIGKILL too, but be explicit */
        kill(p->pid, SIGKILL);
    }
    cxt_peer_reap(p, 5000);
    close_fds(p);
}

/* ---- skips and the exit status ---- */

static int g_skipped;

int cxt_required(const char *cap)
{
    const char *req = getenv("CONNEX_TEST_REQUIRE");
    size_t cl = strlen(cap);
    for (const char *q = req; q && *q;) {
        size_t l = strcspn(q, ", ");
        if (l == cl && strncmp(q, cap, l) == 0) return 1;
        q += l;
        q += strspn(q, ", ");
    }
    return 0;
}

static int g_logfd = -1, g_stderr = -1;
static char g_logpath[512], g_logtag[64];

void cxt_log_capture(const char *tag)
{
    const char *t = getenv("TMPDIR");
    snprintf(g_logtag, sizeof g_logtag, "%s", tag);
    snprintf(g_logpath, sizeof g_logpath, "%s/cx_%s.%d.log", t && *t ? t : P_tmpdir, tag, (int)getpid());
    g_logfd = open(g_logpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(g_logfd >= 0);
    g_stderr = dup(2);
    assert_true(g_stderr >= 0);
    assert_int_equal(dup2(g_logfd, 2), 2);
}

static int log_restore(void)
{
    if (g_stderr < 0) return 0;
    fflush(stderr);
    dup2(g_stderr, 2);
    close(g_stderr);
    g_stderr = -1;
    return 1;
}

static void log_done(int keep)
{
    close(g_logfd);
    g_logfd = -1;
    if (keep)
        fprintf(stderr, "%s: the whole log is in %s\n", g_logtag, g_logpath);
    else
        unlink(g_logpath);
}

void cxt_log_release(void (*line)(const char *text, void *arg), void *arg)
{
    if (!log_restore()) return;
    FILE *f = fopen(g_logpath, "r");
    if (f) {
        char l[1024];
        while (fgets(l, sizeof l, f)) line(l, arg);
        fclose(f);
    }
    log_done(0);
}

void cxt_log_abort(void)
{
    if (!log_restore()) return;
    char cmd[sizeof g_logpath + 32];
    snprintf(cmd, sizeof cmd, "tail -n 80 %s >&2", g_logpath);
    if (system(cmd) != 0) fprintf(stderr, "(no log)\n");
    log_done(getenv("CXT_KEEP_LOG") != NULL);
}

void cxt_skip_note(const char *cap, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (cxt_required(cap)) {
        fprintf(stderr, "cxt: required capability %s missing: %s (CONNEX_TEST_REQUIRE)\n", cap, why);
        fail_msg("cxt: required capability %s missing: %s", cap, why);
    }
    fprintf(stderr, "cxt: SKIPPED: needs %s: %s\n", cap, why);
    g_skipped++;
}

int cxt_selected(const void *tests, size_t n, size_t size)
{
    (void)size;
    const struct CMUnitTest *t = tests;
    const char *filter = getenv("CXT_FILTER");
    if (!filter || !*filter) return (int)n;
    cmocka_set_test_filter(filter);
    int k = 0;
    for (size_t i = 0; i < n; i++) k += fnmatch(filter, t[i].name, 0) == 0;
    return k;
}

int cxt_exit_status(int failed, int selected)
{
    int peers = __atomic_load_n(&g_peer_failures, __ATOMIC_SEQ_CST);
    if (peers) fprintf(stderr, "cxt: %d peer(s) failed off the test's thread (see the cxt: peer lines)\n", peers);
    if (failed == 0 && peers == 0 && g_skipped > 0 && g_skipped >= selected) {
        fprintf(stderr, "cxt: every case (%d) was skipped: exit %d (skipped)\n", selected, CXT_SKIP_EXIT);
        return CXT_SKIP_EXIT;
    }
    int rc = failed + peers;
    return rc == CXT_SKIP_EXIT ? rc + 1 : rc; /* 77 failures must not read as a skip */
}

static void watchdog_fired(int sig)
{
    (void)sig;
    static const char m[] = "\ncxt: WATCHDOG: this test is still running after its time limit: "
                            "an engine call is hung (see the [ RUN ] line above)\n";
    if (write(2, m, sizeof m - 1) < 0) _exit(3);
    _exit(3);
}

int cxt_watchdog_setup(void **state)
{
    (void)state;
    const char *s = getenv("CXT_WATCHDOG_S");
    unsigned sec = s && atoi(s) > 0 ? (unsigned)atoi(s) : 120;
    signal(SIGALRM, watchdog_fired);
    alarm(sec);
    return 0;
}

int cxt_watchdog_teardown(void **state)
{
    (void)state;
    alarm(0);
    return 0;
}

int cxt_may_be_one_sided(void)
{
    const char *b = getenv("CONNEX_BACKEND"), *tls = getenv("UCX_TLS"), *prov = getenv("CONNEX_FI_PROVIDER");
    if (getenv("CONNEX_TEST_TLS") && *getenv("CONNEX_TEST_TLS")) tls = getenv("CONNEX_TEST_TLS");
    if (!b || !*b) return 1; /* auto-selection: a same-host pair may get shared memory */
    if (!strcmp(b, "libfabric")) return !prov || strstr(prov, "shm") != NULL;
    if (!strcmp(b, "ucx"))
        return !tls || !*tls || strstr(tls, "posix") || strstr(tls, "cma") || strstr(tls, "sysv") ||
            strstr(tls, "shm") || strstr(tls, "sm") || strstr(tls, "all");
    return 0;
}

void cxt_apply_test_env(cx_config_t *c)
{
    const char *tls = getenv("CONNEX_TEST_TLS"), *ip = getenv("CONNEX_TEST_IP");
    /* before the engine opens UCX; peers started later inherit it */
    if (tls && *tls) setenv("UCX_TLS", tls, 1);
    if (ip && *ip && !c->listen_ip) c->listen_ip = ip;
}

int cxt_engine(cx_engine_t **e, const char *model, uint32_t replica, uint32_t hb_ms, uint32_t hb_timeout_ms,
               uint32_t op_timeout_ms)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = model;
    c.replica = replica;
    c.heartbeat_ms = hb_ms;
    c.heartbeat_timeout_ms = hb_timeout_ms;
    c.op_timeout_ms = op_timeout_ms;
    cxt_apply_test_env(&c);
    int rc = cx_engine_create(&c, e);
    if (rc)
        fprintf(stderr, "cxt: cx_engine_create: %d (%s)\n", rc, cx_strerror(rc));
    else
        fprintf(stderr, "cxt: engine %s backends %s\n", cx_engine_local_url(*e), cx_engine_backends(*e));
    return rc;
}

int cxt_sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc) fprintf(stderr, "cxt: `%s` failed (%d)\n", cmd, rc);
    return rc;
}

const char *cxt_netns_why_skip(const char **cap)
{
    *cap = "root";
    if (geteuid() != 0) return "not root (creating network namespaces needs CAP_NET_ADMIN)";
    *cap = "netns";
    if (system("ip -V >/dev/null 2>&1")) return "no `ip` (iproute2) on PATH";
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip netns add cxt-probe-%d 2>/dev/null && ip netns del cxt-probe-%d", (int)getpid(),
             (int)getpid());
    if (system(cmd)) return "`ip netns add` fails here (a container without CAP_SYS_ADMIN?)";
    return NULL;
}
