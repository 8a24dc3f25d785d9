/* shm only: doorbells, a wait object for a provider that has none.
 *
 * libfabric 1.17's shm CQ has no wait fd: a message a peer queued in our region is seen only
 * when we look. Looking continuously after any traffic (100 ms after each message, or while a
 * message of ours waited for its ack) kept the progress thread spinning on the transports' lock
 * through a caller's next op on a small host, so the caller handed the op off: 16 KiB writes
 * after a checking message 24-40 us with no op ended on its caller's thread, reads bimodal with
 * a p99 of 4-5 ms (two spinning progress threads and the caller on two CPUs), against 4-5 us
 * once the spinning stopped.
 *
 * So each shm backend binds a datagram socket in the abstract namespace, named after its
 * process and engine incarnation (what a peer's region name already carries, fi_shm.c), and
 * keeps it in its wait fd's epoll set. A sender rings the peer's bell (a one-byte sendto,
 * never blocking: a full queue means it is rung already) after every post the peer must serve:
 * messages and acks always, and without direct mode every post (its RMA are commands there). A
 * message says in its header that its sender rings (CX_FM_F_RUNG). A direct RMA needs no
 * service, but the provider still queues a notice of it in the target's command queue (1,024
 * entries), which only the target's progress empties: a full queue refuses the next RMA
 * (-FI_EAGAIN), seen as one read in 1,024 waiting for the target's next tick. So a sender rings
 * after each sixteenth of the queue's posts to a peer, and at once when a post is refused. A
 * receiver in direct mode with a bell then polls continuously only after traffic that came
 * unrung (a sender whose ring failed: another network namespace, a bell it could not reach), as
 * every receiver did before; the timer tick stays for what nobody rings. Abstract names vanish
 * with their process: nothing to sweep after a kill. */
#include "fi_int.h"

#include "connex/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* "\0cx-fi-bell-<pid>-<16 hex digits of the incarnation>" */
static socklen_t bell_addr(struct sockaddr_un *a, uint32_t pid, uint64_t inc)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cx-fi-bell-%u-%016" PRIx64, (unsigned)pid, inc);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

void cx_fi_bell_open(cx_backend_t *b)
{
    b->bell_fd = -1;
    if (strcmp(b->prov, "shm") || b->efd < 0) return;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        cx_info("libfabric: shm: no doorbell (socket: %s): polling after traffic", strerror(errno));
        return;
    }
    struct sockaddr_un a;
    socklen_t len = bell_addr(&a, (uint32_t)getpid(), b->inc);
    struct epoll_event ev = { .events = EPOLLIN };
    if (bind(fd, (struct sockaddr *)&a, len) || epoll_ctl(b->efd, EPOLL_CTL_ADD, fd, &ev)) {
        cx_info("libfabric: shm: no doorbell (%s): polling after traffic", strerror(errno));
        close(fd);
        return;
    }
    b->bell_fd = fd;
    size_t q = b->info && b->info->rx_attr ? b->info->rx_attr->size : 0;
    b->bell_every = q >= 256 ? (unsigned)(q / 16 > 1024 ? 1024 : q / 16) : 16;
}

void cx_fi_bell_close(cx_backend_t *b)
{
    if (b->bell_fd >= 0) close(b->bell_fd);
    b->bell_fd = -1;
}

void cx_fi_bell_peer(cx_bep_t *ep, uint32_t pid, uint64_t inc)
{
    ep->bell_len = ep->b->bell_fd >= 0 && pid ? bell_addr(&ep->bell, pid, inc) : 0;
}

void cx_fi_bell_ring(cx_backend_t *b, cx_bep_t *ep)
{
    if (!ep->bell_len || b->bell_fd < 0) return;
    static const char one = 1;
    if (sendto(b->bell_fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&ep->bell, ep->bell_len) == 1)
        return;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS)
        return; /* rung already and not read yet (a stopped peer), or a moment short of memory */
    /* Gone (the peer is dying: the core hears of it), or never bound where we can reach it:
     * what we send it from now on says so, and it polls after it (CX_FM_F_RUNG). */
    cx_info("libfabric: shm: peer process %u has no doorbell we can ring (%s)", ep->pid, strerror(errno));
    ep->bell_len = 0;
    cx_fi_bell_tick(b);
}

void cx_fi_bell_posted(cx_backend_t *b, cx_bep_t *ep, unsigned n)
{
    if (!ep->bell_len) return;
    ep->bell_posts += n;
    if (ep->bell_posts < b->bell_every) return;
    ep->bell_posts = 0;
    cx_fi_bell_ring(b, ep);
}

int cx_fi_bell_rings(const cx_bep_t *ep)
{
    return ep && ep->bell_len != 0;
}

void cx_fi_bell_drain(cx_backend_t *b)
{
    if (b->bell_fd < 0) return;
    char buf[64];
    struct mmsghdr m[16];
    struct iovec v[16];
    for (int i = 0; i < 16; i++) {
        v[i] = (struct iovec){ .iov_base = buf, .iov_len = sizeof buf };
        m[i] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &v[i], .msg_iovlen = 1 } };
    }
    /* Bounded: what rings meanwhile stays readable and calls us again. */
    for (int k = 0; k < 64; k++)
        if (recvmmsg(b->bell_fd, m, 16, MSG_DONTWAIT, NULL) < 16) return;
}

void cx_fi_bell_tick(cx_backend_t *b)
{
    if (b->tfd < 0 || b->busy_poll) return;
    int slow = b->bell_fd >= 0 && b->shm_direct;
    for (const cx_bep_t *ep = b->eps; ep && slow; ep = ep->next) slow = ep->bell_len != 0;
    if (slow == b->tick_slow) return;
    long us = slow ? CX_FI_BELL_TICK_US : b->poll_us;
    struct itimerspec it = { .it_interval = { us / 1000000, (us % 1000000) * 1000 },
                             .it_value = { us / 1000000, (us % 1000000) * 1000 } };
    if (timerfd_settime(b->tfd, 0, &it, NULL)) {
        cx_warn("libfabric: shm: polling tick: %s", strerror(errno));
        return;
    }
    b->tick_slow = slow;
}
