/* The CONNEX_* environment variables: one table (core/src/options.c) with each variable's type,
 * default, range and one line of doc. Every read of a CONNEX_* variable in the library goes
 * through it, so a bad value (not a number, out of range, not one of the allowed words) is
 * refused the same way everywhere: a log line naming the variable, its value and what is
 * allowed. cx_engine_create checks the whole table first and fails with CX_EINVAL on a bad value,
 * and hands the parsed table (cx_opts_t) to the selection and to every backend it opens. Code
 * that runs without an engine's table (connex-probe's entry points, gpu/, the log level) uses
 * the getters below, which read the environment at each call, log the same error and give the
 * default.
 *
 * Internal to libconnex (not exported); README.md's configuration table lists the same names
 * (unit_options checks that). */
#ifndef CONNEX_OPTIONS_H
#define CONNEX_OPTIONS_H

#include <stddef.h>

typedef enum {
    CX_OPT_BOOL,  /* 0|1 (also off|on, no|yes, false|true) */
    CX_OPT_UINT,  /* decimal digits, no sign */
    CX_OPT_MS,    /* milliseconds: as UINT */
    CX_OPT_US,    /* microseconds: as UINT */
    CX_OPT_BYTES, /* as UINT, with an optional K/M/G suffix (powers of 1024) */
    CX_OPT_FLOAT, /* a non-negative decimal number */
    CX_OPT_ENUM,  /* one of the words in 'allowed' ('|'-separated; '/' separates aliases) */
    CX_OPT_STRING /* any text */
} cx_opt_type_t;

typedef struct {
    const char *name; /* CONNEX_... */
    cx_opt_type_t type;
    const char *dflt;            /* the default as text; NULL: unset (the component decides) */
    unsigned long long min, max; /* UINT, MS, US, BYTES, FLOAT (whole numbers) */
    const char *allowed;         /* ENUM: "auto|0/off/no|1/on/yes"; the value is the word's index */
    const char *component;       /* core, ucx, libfabric, select, gpu */
    const char *doc;             /* one line */
    int secret;                  /* its value is never printed */
} cx_opt_def_t;

/* The table, in order; n entries. */
const cx_opt_def_t *cx_opt_table(size_t *n);
const cx_opt_def_t *cx_opt_find(const char *name);

/* A variable's value, checked against the table. Returns 1 when the environment set it, 0 when
 * it is unset or empty (*out gets the table's default: 0 / NULL where the default is NULL),
 * CX_EINVAL when the value is bad (logged with the variable, its value and what is allowed;
 * *out gets the default). BOOL and ENUM give 0/1 or the index of the word. */
int cx_opt_get_num(const char *name, unsigned long long *out);
int cx_opt_get_float(const char *name, double *out);
int cx_opt_get_str(const char *name, const char **out);

/* Parse one value of a table entry without reading the environment: CX_OK, or CX_EINVAL with a
 * message naming the variable, the value and what is allowed in err. */
int cx_opt_parse(const cx_opt_def_t *d, const char *s, unsigned long long *num, double *fnum, char *err, size_t errlen);

/* The whole table parsed at once: cx_engine_create loads it into the engine (engine.h) and
 * fails on a bad value; the engine, the selection and every backend (cx_backend_params_t.opts)
 * take their values from there, so a variable changed after create does not reach a running
 * engine. Text values are copied into the struct: they do not point into the environment. */
#define CX_OPT_MAX 64     /* entries the table may hold */
#define CX_OPT_TEXT 16384 /* bytes for every text value together */
typedef struct cx_opts {
    unsigned bad;                       /* variables with a bad value (each logged) */
    unsigned long long num[CX_OPT_MAX]; /* BOOL, ENUM, UINT, MS, US, BYTES: the value or default */
    double fnum[CX_OPT_MAX];            /* FLOAT */
    const char *str[CX_OPT_MAX];        /* the text: a copy of the environment's (a bad one too), the
                                           default, or NULL */
    unsigned char set[CX_OPT_MAX];      /* 1: the environment set it (a valid value) */
    unsigned char invalid[CX_OPT_MAX];  /* 1: the environment's value is bad (num: the default) */
    char text[CX_OPT_TEXT];             /* where str[] points for values the environment set */
} cx_opts_t;
int cx_opts_load(cx_opts_t *o); /* CX_OK, or CX_EINVAL when any value is bad */
/* A loaded value by name; *set (may be NULL) says whether the environment set it. */
unsigned long long cx_opts_num(const cx_opts_t *o, const char *name, int *set);
int cx_opts_bad(const cx_opts_t *o, const char *name); /* 1: the environment's value is bad */
const char *cx_opts_str(const cx_opts_t *o, const char *name);

#endif
