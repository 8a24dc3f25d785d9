/* UCX's own log lines, routed into connex's log.
 *
 * UCX prints its warnings and errors to stdout unless UCX_LOG_FILE names another place. A
 * process whose stdout carries data (a pipe protocol between processes, a CSV, the tests' peer
 * protocol) gets UCX's lines in the middle of it. So the first UCX backend to open pushes a UCS
 * log handler that hands each line to cx_log_write (stderr, filtered by CONNEX_LOG) and tells UCX
 * not to print it. A user who set UCX_LOG_FILE keeps UCX's own output. */
#include "ucx_int.h"

#include "connex/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucs/debug/log_def.h>

static ucs_log_func_rc_t to_connex(const char *file, unsigned line, const char *function, ucs_log_level_t level,
                                   const ucs_log_component_config_t *comp, const char *message, va_list ap)
{
    (void)function;
    (void)comp;
    /* UCX's errors are often what connex handles next (an endpoint that cannot reach a peer
     * makes it try the next backend): warnings to us. */
    int lvl = level <= UCS_LOG_LEVEL_WARN ? CX_LOG_WARN : level <= UCS_LOG_LEVEL_INFO ? CX_LOG_INFO : CX_LOG_DEBUG;
    if (lvl <= cx_log_level) {
        char buf[512];
        vsnprintf(buf, sizeof buf, message, ap);
        const char *base = strrchr(file, '/');
        cx_log_write(lvl, base ? base + 1 : file, (int)line, "ucx (library): %s", buf);
    }
    return UCS_LOG_FUNC_RC_STOP;
}

static void install(void)
{
    const char *f = getenv("UCX_LOG_FILE");
    if (f && *f) return;
    cx_ucx_lib.ucs_log_push_handler(to_connex);
}

void cx_ucx_log_route(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}
