/* See cxt_etcd.h. */
#include "cxt_etcd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The directory for scratch files: $TMPDIR, else the system's (P_tmpdir). */
static const char *tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : P_tmpdir;
}

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A port nobody listens on right now (etcd takes it a moment later; a clash makes the start fail
 * and the caller try other ports). */
static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof a;
    uint16_t p = 0;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &l))
        p = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return p;
}

/* GET /health answers {"health":"true"} once etcd serves requests. */
static int healthy(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct timeval tv = { 0, 300000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int ok = 0;
    if (!connect(fd, (struct sockaddr *)&a, sizeof a)) {
        static const char req[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
            char buf[1024];
            size_t n = 0;
            ssize_t r;
            while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
            buf[n] = 0;
            ok = strstr(buf, "\"health\":\"true\"") != NULL;
        }
    }
    close(fd);
    return ok;
}

static void print_log(const cxt_etcd_t *x)
{
    char path[160], line[512];
    snprintf(path, sizeof path, "%s/etcd.log", x->dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    int n = 0;
    while (fgets(line, sizeof line, f) && n++ < 40) fprintf(stderr, "etcd: %s", line);
    fclose(f);
}

static int start_once(cxt_etcd_t *x, int timeout_ms, int new_ports)
{
    if (new_ports) {
        x->client_port = free_port();
        x->peer_port = free_port();
    }
    if (!x->client_port || !x->peer_port || x->client_port == x->peer_port) return -1;
    snprintf(x->endpoint, sizeof x->endpoint, "etcd://127.0.0.1:%u", x->client_port);
    char curl[64], purl[64], cluster[96], logp[160], data[160];
    snprintf(curl, sizeof curl, "http://127.0.0.1:%u", x->client_port);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%u", x->peer_port);
    snprintf(cluster, sizeof cluster, "cxt=%s", purl);
    snprintf(logp, sizeof logp, "%s/etcd.log", x->dir);
    snprintf(data, sizeof data, "%s/data", x->dir);
    /* Short raft timers: a single member elects itself at once, and etcd's minimum lease TTL
     * (1.5 election timeouts) stays under the 1 s leases the tests use. */
    const char *argv[] = { CXT_ETCD_BIN, "--name",
                           "cxt",        "--data-dir",
                           data,         "--listen-client-urls",
                           curl,         "--advertise-client-urls",
                           curl,         "--listen-peer-urls",
                           purl,         "--initial-advertise-peer-urls",
                           purl,         "--initial-cluster",
                           cluster,      "--heartbeat-interval",
                           "25",         "--election-timeout",
                           "250",        NULL };
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies leaves no etcd behind */
        if (getppid() != parent) _exit(127);
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(CXT_ETCD_BIN, (char *const *)argv);
        _exit(127);
    }
    x->pid = pid;
    uint64_t deadline = ms_now() + (uint64_t)timeout_ms;
    while (ms_now() < deadline) {
        if (healthy(x->client_port)) return 0;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            x->pid = -1;
            break;
        }
        usleep(50000);
    }
    fprintf(stderr, "cxt_etcd: etcd on port %u did not answer within %d ms\n", x->client_port, timeout_ms);
    print_log(x);
    if (x->pid > 0) {
        kill(x->pid, SIGKILL);
        waitpid(x->pid, NULL, 0);
        x->pid = -1;
    }
    return -1;
}

int cxt_etcd_start(cxt_etcd_t *x, int timeout_ms)
{
    memset(x, 0, sizeof *x);
    x->pid = -1;
    if (access(CXT_ETCD_BIN, X_OK)) return 1;
    snprintf(x->dir, sizeof x->dir, "%s/cxt-etcd-XXXXXX", tmp_base());
    if (!mkdtemp(x->dir)) {
        x->dir[0] = 0;
        return -1;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/data'", x->dir);
        if (system(cmd)) { /* best effort */
        }
        if (start_once(x, timeout_ms, 1) == 0) return 0;
    }
    cxt_etcd_stop(x);
    return -1;
}

int cxt_etcd_restart(cxt_etcd_t *x, int up, int timeout_ms)
{
    if (!up) {
        if (x->pid > 0) {
            kill(x->pid, SIGKILL);
            waitpid(x->pid, NULL, 0);
            x->pid = -1;
        }
        return 0;
    }
    return x->pid > 0 ? 0 : start_once(x, timeout_ms, 0);
}

void cxt_etcd_stop(cxt_etcd_t *x)
{
    if (x->pid > 0) {
        kill(x->pid, SIGKILL);
        waitpid(x->pid, NULL, 0);
        x->pid = -1;
    }
    if (x->dir[0]) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", x->dir);
        if (system(cmd)) fprintf(stderr, "cxt_etcd: could not remove %s\n", x->dir);
        x->dir[0] = 0;
    }
}
