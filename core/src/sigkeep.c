#include "sigkeep.h"

#include "connex/log.h"

#include <stdio.h>
#include <string.h>

void cx_sigkeep_save(cx_sigkeep_t *k)
{
    memset(k, 0, sizeof *k);
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) k->ok[s] = sigaction(s, NULL, &k->sa[s]) == 0;
}

static int same(const struct sigaction *a, const struct sigaction *b)
{
    if ((a->sa_flags & SA_SIGINFO) != (b->sa_flags & SA_SIGINFO)) return 0;
    if (a->sa_flags & SA_SIGINFO) return a->sa_sigaction == b->sa_sigaction;
    return a->sa_handler == b->sa_handler;
}

int cx_sigkeep_restore(const cx_sigkeep_t *k, const char *who)
{
    char names[256] = "";
    size_t off = 0;
    int n = 0;
    for (int s = 1; s < NSIG; s++) {
        struct sigaction now;
        if (!k->ok[s] || sigaction(s, NULL, &now) || same(&now, &k->sa[s])) continue;
        if (sigaction(s, &k->sa[s], NULL)) continue;
        n++;
        int w = snprintf(names + off, sizeof names - off, "%sSIG%s", off ? ", " : "",
                         sigabbrev_np(s) ? sigabbrev_np(s) : "?");
        if (w > 0 && (size_t)w < sizeof names - off) off += (size_t)w;
    }
    if (n) cx_info("%s installed handlers for %s: the process's own dispositions are put back", who, names);
    return n;
}
