/* Logging for the core and backends: stderr, level from CONNEX_LOG=error|warn|info|debug. */
#ifndef CONNEX_LOG_H
#define CONNEX_LOG_H

enum { CX_LOG_ERROR = 0, CX_LOG_WARN = 1, CX_LOG_INFO = 2, CX_LOG_DEBUG = 3 };

extern int cx_log_level; /* read without locking: a stale level for one line is harmless */
void cx_log_init(void);  /* reads CONNEX_LOG once; called by cx_engine_create */
void cx_log_write(int level, const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define cx_log(lvl, ...)                                                                 \
    do {                                                                                 \
        if ((lvl) <= cx_log_level) cx_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define cx_error(...) cx_log(CX_LOG_ERROR, __VA_ARGS__)
#define cx_warn(...) cx_log(CX_LOG_WARN, __VA_ARGS__)
#define cx_info(...) cx_log(CX_LOG_INFO, __VA_ARGS__)
#define cx_debug(...) cx_log(CX_LOG_DEBUG, __VA_ARGS__)

#endif
