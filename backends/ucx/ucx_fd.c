/* UCX 1.13 opens its sockets, pipes and epoll sets without close-on-exec. A child that this
 * process forks and execs would inherit them, and a child holding a copy of a TCP socket hides
 * this process's death from its peers (no RST). So the fds that appear while UCX is open get
 * FD_CLOEXEC: after open, after each connect, and every CX_UCX_FD_SCAN_MS from progress (UCX
 * accepts connections on its own thread). An fd that existed before open is never touched; one
 * the application opens later without close-on-exec, on purpose, would be (documented). */
#include "ucx_int.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

static int cx_ucx_fd_known(const cx_ucx_t *b, int fd)
{
    return fd < b->fd_base_n && (b->fd_base[fd / 8] & (1u << (fd % 8)));
}

void cx_ucx_fd_baseline(cx_ucx_t *b)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int self = dirfd(d), max = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int fd = atoi(de->d_name);
        if (de->d_name[0] != '.' && fd != self && fd > max) max = fd;
    }
    b->fd_base_n = max + 1;
    b->fd_base = calloc((size_t)b->fd_base_n / 8 + 1, 1);
    if (!b->fd_base) b->fd_base_n = 0;
    rewinddir(d);
    while (b->fd_base && (de = readdir(d)) != NULL) {
        int fd = atoi(de->d_name);
        if (de->d_name[0] == '.' || fd == self || fd >= b->fd_base_n) continue;
        b->fd_base[fd / 8] |= (uint8_t)(1u << (fd % 8));
    }
    closedir(d);
}

void cx_ucx_fd_cloexec(cx_ucx_t *b)
{
    b->fd_scan_ns = cx_ucx_now_ns();
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int self = dirfd(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        int fd = atoi(de->d_name);
        if (fd == self || cx_ucx_fd_known(b, fd)) continue;
        int fl = fcntl(fd, F_GETFD);
        if (fl >= 0 && !(fl & FD_CLOEXEC)) (void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    }
    closedir(d);
}
