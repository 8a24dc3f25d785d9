/* shm provider hygiene (libfabric 1.17): the names of its shared regions.
 *
 * The provider names an endpoint's region "<pid>:<domain>:<ep>" in /dev/shm (16 MiB each) and
 * removes it only at a clean close or on a catchable signal: a SIGKILLed process leaves it
 * behind. A later process that is given the same pid then fails fi_enable with EBUSY (seen:
 * conformance_failure's restart of a killed peer, on a host that had run many), and /dev/shm
 * fills up. So connex names each region after its engine's pid and incarnation, unlinks a dead
 * peer's region when it closes the endpoint to it, and at open removes connex regions whose
 * process is gone. */
#include "fi_int.h"
#include "connex/options.h"

#include "connex/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define CX_FI_SHM_PREFIX "cx-fi-"

/* "cx-fi-<pid>-<16 hex digits of the incarnation>", and "-<generation>" after a rotation
 * (fi_rot.c); the first name of an engine has none. */
int cx_fi_shm_parse(const char *name, uint32_t *pid, uint64_t *inc, uint32_t *gen)
{
    unsigned p, g = 0;
    unsigned long long i;
    int n = 0, m = 0;
    if (sscanf(name, CX_FI_SHM_PREFIX "%u-%16llx%n", &p, &i, &n) != 2 || !p || n < 1) return -1;
    if (name[n] &&
        (name[n] != '-' || name[n + 1] < '1' || name[n + 1] > '9' || sscanf(name + n, "-%u%n", &g, &m) != 1 ||
         name[n + m]))
        return -1;
    *pid = p;
    *inc = i;
    *gen = g;
    return 0;
}

/* Regions of connex processes that no longer exist (ESRCH: a process of another user answers
 * EPERM and is left alone). */
static void cx_fi_shm_sweep(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < 4096; n++) {
        uint32_t pid, gen;
        uint64_t inc;
        if (cx_fi_shm_parse(de->d_name, &pid, &inc, &gen)) continue;
        if (kill((pid_t)pid, 0) == -1 && errno == ESRCH && !shm_unlink(de->d_name))
            cx_info("libfabric: shm: removed %s, left by a process that is gone", de->d_name);
    }
    closedir(d);
}

int cx_fi_shm_name(cx_backend_t *b, struct fid_ep *ep, uint32_t gen, char name[64])
{
    name[0] = 0;
    if (strcmp(b->prov, "shm")) return 0;
    if (!gen) cx_fi_shm_sweep();
    char n[64];
    if (gen)
        snprintf(n, sizeof n, CX_FI_SHM_PREFIX "%u-%016" PRIx64 "-%u", (unsigned)getpid(), b->inc, gen);
    else
        snprintf(n, sizeof n, CX_FI_SHM_PREFIX "%u-%016" PRIx64, (unsigned)getpid(), b->inc);
    int r = fi_setname(&ep->fid, n, strlen(n) + 1);
    if (!r)
        memcpy(name, n, sizeof n);
    else
        cx_warn("libfabric: shm: fi_setname %s: %s (the provider's own name is kept)", n, cx_fi_strerror(-r));
    return 0; /* the provider's default name still works, short of the hygiene */
}

void cx_fi_shm_remember(cx_bep_t *ep, const void *name, size_t len)
{
    ep->shm_name[0] = 0;
    if (len < 2 || len >= sizeof ep->shm_name || memchr(name, 0, len) != (const char *)name + len - 1) return;
    uint32_t pid, gen;
    uint64_t inc;
    if (cx_fi_shm_parse(name, &pid, &inc, &gen)) return; /* not a connex name: never unlink what connex did not name */
    memcpy(ep->shm_name, name, len);
}

static void cx_fi_shm_unlink(const char *name)
{
    if (!shm_unlink(name)) cx_info("libfabric: shm: removed %s, left by a dead peer", name);
}

/* The core fails a peer as soon as its death begins (the same-host watch sees it when the
 * kernel starts unmapping its memory); the core's exit fd turns readable only once it has
 * exited. So a
 * peer not yet dead at disconnect is watched for a while (it may also be alive: stopped, or cut
 * off by a timeout, and then its region stays). */
#define CX_FI_SHM_WAIT_NS 30000000000ull
#define CX_FI_SHM_CHECK_NS 20000000ull

void cx_fi_shm_reap(cx_bep_t *ep)
{
    if (!ep->shm_name[0]) return;
    if (cx_fi_peer_dead(ep)) {
        cx_fi_shm_unlink(ep->shm_name);
        return;
    }
    cx_backend_t *b = ep->b;
    if (ep->exit_fd < 0 || b->shm_nwait == CX_FI_SHM_WAITS) return; /* the next open's sweep removes it */
    cx_fi_shm_wait_t *w = &b->shm_wait[b->shm_nwait++];
    w->exit_fd = ep->exit_fd;
    ep->exit_fd = -1; /* now the wait's */
    w->until_ns = cx_fi_now_ns() + CX_FI_SHM_WAIT_NS;
    memcpy(w->name, ep->shm_name, sizeof w->name);
}

void cx_fi_shm_progress(cx_backend_t *b, int closing)
{
    if (!b->shm_nwait) return;
    uint64_t now = cx_fi_now_ns();
    if (!closing && now < b->shm_next_ns) return;
    b->shm_next_ns = now + CX_FI_SHM_CHECK_NS;
    for (int i = 0; i < b->shm_nwait;) {
        cx_fi_shm_wait_t *w = &b->shm_wait[i];
        struct pollfd p = { .fd = w->exit_fd, .events = POLLIN };
        int gone = poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP));
        if (!gone && !closing && now < w->until_ns) {
            i++;
            continue;
        }
        if (gone) cx_fi_shm_unlink(w->name);
        close(w->exit_fd);
        *w = b->shm_wait[--b->shm_nwait];
    }
}

/* libfabric 1.17 shm unmaps a peer's region in fi_av_remove, and its progress reads the region
 * of every peer that has a command or an answer in our queues (the peer table's region pointer,
 * inside fi_cq_read). A peer killed with something of it still queued at us, removed at once,
 * made our next fi_cq_read touch its unmapped region: a SIGSEGV of the survivor in about one
 * kill in a few hundred under `connex-bench soak` (4 threads of ops to the peer). So a dropped
 * shm peer stays in the address vector (its region mapped) for CX_FI_AV_LATER_NS, while
 * progress drains what it had queued; nothing is posted to it meanwhile (its endpoint is gone),
 * and its mapping keeps only memory that is ours to read. */
void cx_fi_av_remove_later(cx_backend_t *b, fi_addr_t fa)
{
    if (b->n_av_later == CX_FI_AV_LATER) { /* full: the oldest goes now */
        fi_av_remove(b->av, &b->av_later[0], 1, 0);
        memmove(&b->av_later[0], &b->av_later[1], (CX_FI_AV_LATER - 1) * sizeof b->av_later[0]);
        memmove(&b->av_later_ns[0], &b->av_later_ns[1], (CX_FI_AV_LATER - 1) * sizeof b->av_later_ns[0]);
        b->n_av_later--;
    }
    b->av_later[b->n_av_later] = fa;
    b->av_later_ns[b->n_av_later] = cx_fi_now_ns() + CX_FI_AV_LATER_NS;
    b->n_av_later++;
}

/* libfabric 1.17 shm sends our name to a peer once per address-vector slot: the first post to
 * it sets name_sent in our region's peer data for the slot, and every post gets -FI_EAGAIN until
 * the peer answers with its id for us. fi_av_remove does not clear name_sent, and the next
 * address inserted gets the lowest free slot from where the provider's cursor stands, usually
 * the one just freed. So a peer killed after our first post and before its answer spoilt its
 * slot: the next peer given it never got our name, and every post to it was refused until its
 * ops timed out (conformance_gpu_libfabric_shm, a peer killed at its first staged chunk: a
 * 64 MiB write to the next peer stalled 60 s, the provider answering -FI_EAGAIN 1.2 million
 * times, in 5 of 11 runs).
 * Such a peer (a post tried, none ever accepted) keeps its slot until close: its address stays
 * in the address vector, unused. At most CX_FI_AV_HELD; past that the oldest is removed (its
 * slot may stall one later peer, as before). Costs a slot of 256 and the dead peer's region
 * mapping, and only when a peer dies inside its first exchange with us. */
void cx_fi_av_hold(cx_backend_t *b, fi_addr_t fa)
{
    if (b->n_av_held == CX_FI_AV_HELD) {
        cx_info("libfabric: shm: %d slots held out of reuse: freeing the oldest", CX_FI_AV_HELD);
        fi_av_remove(b->av, &b->av_held[0], 1, 0);
        memmove(&b->av_held[0], &b->av_held[1], (CX_FI_AV_HELD - 1) * sizeof b->av_held[0]);
        b->n_av_held--;
    }
    cx_info("libfabric: shm: a peer dropped before it answered our first post: its address-vector "
            "slot is kept out of reuse");
    b->av_held[b->n_av_held++] = fa;
}

void cx_fi_av_later_cancel(cx_backend_t *b, fi_addr_t fa)
{
    for (int i = 0; i < b->n_av_held; i++) {
        if (b->av_held[i] != fa) continue;
        memmove(&b->av_held[i], &b->av_held[i + 1], (size_t)(b->n_av_held - i - 1) * sizeof b->av_held[0]);
        b->n_av_held--;
        break;
    }
    for (int i = 0; i < b->n_av_later; i++) {
        if (b->av_later[i] != fa) continue;
        memmove(&b->av_later[i], &b->av_later[i + 1], (size_t)(b->n_av_later - i - 1) * sizeof b->av_later[0]);
        memmove(&b->av_later_ns[i], &b->av_later_ns[i + 1], (size_t)(b->n_av_later - i - 1) * sizeof b->av_later_ns[0]);
        b->n_av_later--;
        return;
    }
}

/* From progress, after the CQ was drained: the addresses whose grace passed. Closing: nothing
 * is removed (the endpoint and the AV close next, and progress no longer runs). */
void cx_fi_av_later_run(cx_backend_t *b, int closing)
{
    if (closing) {
        b->n_av_later = 0;
        b->n_av_held = 0;
        return;
    }
    uint64_t now = cx_fi_now_ns();
    int k = 0;
    while (k < b->n_av_later && b->av_later_ns[k] <= now) {
        int r = fi_av_remove(b->av, &b->av_later[k], 1, 0);
        if (r) cx_info("libfabric: shm: fi_av_remove of a dropped peer: %s", cx_fi_strerror(-r));
        k++;
    }
    if (k) {
        memmove(&b->av_later[0], &b->av_later[k], (size_t)(b->n_av_later - k) * sizeof b->av_later[0]);
        memmove(&b->av_later_ns[0], &b->av_later_ns[k], (size_t)(b->n_av_later - k) * sizeof b->av_later_ns[0]);
        b->n_av_later -= k;
    }
}

/* Direct mode (libfabric 1.17 shm, "fast RMA"): with FI_MR_VIRT_ADDR, no RMA ordering asked of
 * the transmit side and CMA between the processes, the provider copies an fi_read or a plain
 * fi_write with process_vm_readv/writev inside the post itself and completes it there.
 * Everything else (a delivery-complete write, a message above the inject size) is a command
 * the target must progress, answered in our region's response queue, which the provider
 * drains in order: one stopped peer's pending answer held up every other peer's completions
 * (conformance_hol: 3 of 11 writes to a live peer timed out while another was SIGSTOPped), a
 * killed peer's for ever (conformance_gpu), and a peer removed from the address vector with an
 * answer pending made the next progress touch its unmapped region (SIGSEGV, conformance_hol,
 * 3 runs in 4). So in direct mode writes are plain (their completion still means the bytes
 * are in the target's memory) and messages above the inject size go by rendezvous (the
 * target pulls them with fi_read, itself direct): no op waits on another process. */
int cx_fi_shm_direct(cx_backend_t *b)
{
    if (strcmp(b->prov, "shm")) return 0;
    unsigned long long mode = cx_opts_num(b->opts, "CONNEX_FI_SHM_DIRECT", NULL); /* auto|0|1 */
    if (mode) return mode == 2;
    const uint64_t rma_order = FI_ORDER_RAR | FI_ORDER_RAW | FI_ORDER_RAS | FI_ORDER_WAR | FI_ORDER_WAW | FI_ORDER_WAS |
        FI_ORDER_SAR | FI_ORDER_SAW;
    const char *nocma = getenv("FI_SHM_DISABLE_CMA");
    int cma_off = nocma &&
        (!strcmp(nocma, "1") || !strcasecmp(nocma, "yes") || !strcasecmp(nocma, "true") || !strcasecmp(nocma, "on"));
    /* Yama's ptrace_scope 1 and up keeps CMA from reaching processes that are not our
     * descendants: the provider then falls back to commands for every op. */
    int yama = 0;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f) {
        if (fscanf(f, "%d", &yama) != 1) yama = 0;
        fclose(f);
    }
    int ok = !b->hmem && (b->mr_mode & FI_MR_VIRT_ADDR) && !(b->info->tx_attr->msg_order & rma_order) && !cma_off &&
        yama < 1;
    if (!ok)
        cx_info("libfabric: shm: direct mode off (%s): a stopped or killed peer can hold up "
                "the others' completions",
                b->hmem         ? "FI_HMEM"
                    : cma_off   ? "FI_SHM_DISABLE_CMA"
                    : yama >= 1 ? "Yama ptrace_scope"
                                : "the provider's modes");
    return ok;
}
