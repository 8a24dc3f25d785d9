/* Close-on-exec for libfabric's own descriptors.
 *
 * libfabric 1.17 (tcp, rxm, util) opens its sockets, socketpairs and epoll sets without
 * O_CLOEXEC. A child that inherits a copy of a data socket keeps the connection open after this
 * process dies, hiding the death from peers. Two sweeps fix that without touching anyone else's
 * descriptors: at open, every descriptor that appeared during the open; afterwards (connections
 * made and accepted later), every descriptor reachable from the CQ's epoll set, read from
 * /proc/self/fdinfo. */
#include "fi_int.h"

#include "connex/log.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void cx_fi_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0 && !(fl & FD_CLOEXEC)) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

static int cx_fi_cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The open descriptors, sorted; NULL (and *n = 0) when /proc is unavailable. */
int *cx_fi_fd_list(size_t *n)
{
    *n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return NULL;
    size_t cap = 64;
    int *v = malloc(cap * sizeof *v);
    struct dirent *de;
    int self = dirfd(d);
    while (v && (de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        int fd = atoi(de->d_name);
        if (fd == self) continue;
        if (*n == cap) {
            int *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                v = NULL;
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[(*n)++] = fd;
    }
    closedir(d);
    if (!v) {
        *n = 0;
        return NULL;
    }
    qsort(v, *n, sizeof *v, cx_fi_cmp_int);
    return v;
}

void cx_fi_fd_cloexec_new(const int *before, size_t nbefore)
{
    size_t n;
    int *now = cx_fi_fd_list(&n);
    for (size_t i = 0; i < n; i++)
        if (!before || !bsearch(&now[i], before, nbefore, sizeof *before, cx_fi_cmp_int)) cx_fi_cloexec(now[i]);
    free(now);
}

static int cx_fi_is_epoll(int fd)
{
    char p[64], l[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(p, l, sizeof l - 1);
    if (k <= 0) return 0;
    l[k] = 0;
    return strstr(l, "eventpoll") != NULL;
}

static void cx_fi_walk(int epfd, int depth)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/self/fdinfo/%d", epfd);
    FILE *f = fopen(p, "re");
    if (!f) return;
    int kids[64], nk = 0;
    while (fgets(line, sizeof line, f)) {
        int fd;
        if (sscanf(line, "tfd: %d", &fd) == 1 && fd >= 0) {
            cx_fi_cloexec(fd);
            if (nk < 64) kids[nk++] = fd;
        }
    }
    fclose(f);
    if (depth < 4)
        for (int i = 0; i < nk; i++)
            if (cx_fi_is_epoll(kids[i])) cx_fi_walk(kids[i], depth + 1);
}

void cx_fi_fd_sweep(cx_backend_t *b)
{
    if (b->cq_fd >= 0) {
        cx_fi_cloexec(b->cq_fd);
        cx_fi_walk(b->cq_fd, 0);
    }
}
