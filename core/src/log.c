#include "connex/log.h"
#include "connex/options.h"
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
    /* error|warn|info|debug (or 0..3): the word's index is the level; a bad value is logged. */
    unsigned long long v;
    if (cx_opt_get_num("CONNEX_LOG", &v) == 1) cx_log_level = (int)v;
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
    fprintf(stderr, "[connex %ld.%06ld %d %s %s:%d] %s\n", (long)ts.tv_sec, ts.tv_nsec / 1000L, (int)getpid(),
            tag[level & 3], base ? base + 1 : file, line, msg);
}
