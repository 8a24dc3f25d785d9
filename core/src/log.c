#include "connex/log.h"
#include "connex/connex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int cx_log_level = CX_LOG_WARN;

void cx_log_init(void)
{
    const char *s = getenv("CONNEX_LOG");
    if (!s || !*s) return;
    static const char *names[] = { "error", "warn", "info", "debug" };
    for (int i = 0; i < 4; i++)
        if (!strcasecmp(s, names[i])) { cx_log_level = i; return; }
    if (s[0] >= '0' && s[0] <= '3' && !s[1]) { cx_log_level = s[0] - '0'; return; }
    fprintf(stderr, "connex: CONNEX_LOG=%s not understood (error|warn|info|debug), using warn\n", s);
}

void cx_log_set_level(int level)
{
    cx_log_level = level < 0 ? 0 : level > 3 ? 3 : level;
}

void cx_log_write(int level, const char *file, int line, const char *fmt, ...)
{
    static const char *tag[] = { "ERROR", "WARN", "INFO", "DEBUG" };
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const char *base = strrchr(file, '/');
    /* One fprintf per line so that lines from several threads do not interleave. */
    fprintf(stderr, "[connex %ld.%06ld %d %s %s:%d] %s\n", (long)ts.tv_sec, ts.tv_nsec / 1000L,
            (int)getpid(), tag[level & 3], base ? base + 1 : file, line, msg);
}
