/* The process's signal dispositions, kept as they were across calls into libraries that install
 * handlers of their own (libfabric's shm provider sets SIGINT and SIGTERM handlers when it starts).
 * A library does not change its host process: what such a call changed is put back and logged. */
#ifndef CX_SIGKEEP_H
#define CX_SIGKEEP_H

#include <signal.h>

typedef struct cx_sigkeep {
    struct sigaction sa[NSIG];
    unsigned char ok[NSIG];
} cx_sigkeep_t;

void cx_sigkeep_save(cx_sigkeep_t *k);
/* Puts back every disposition that changed since the save; `who` names the calls in the log. */
int cx_sigkeep_restore(const cx_sigkeep_t *k, const char *who);

#endif
