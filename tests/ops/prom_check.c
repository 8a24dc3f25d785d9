/* The exposition format checker of prom_check.h. */
#include "prom_check.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXF 512
#define MAXS 8192

static int name_ok(const char *s, size_t n, int label)
{
    if (!n) return 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        int ok = isalpha(c) || c == '_' || (!label && c == ':') || (i && isdigit(c));
        if (!ok) return 0;
    }
    return 1;
}

static const char *fail(char *err, size_t n, int line, const char *fmt, ...)
{
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(err, n, "line %d: %s", line, m);
    return err;
}

static int value_ok(const char *s, double *v)
{
    if (!strcmp(s, "+Inf")) {
        *v = INFINITY;
        return 1;
    }
    if (!strcmp(s, "-Inf")) {
        *v = -INFINITY;
        return 1;
    }
    if (!strcmp(s, "NaN")) {
        *v = NAN;
        return 1;
    }
    char *end;
    *v = strtod(s, &end);
    return *s && !*end && !isspace((unsigned char)*s);
}

/* The family a sample belongs to, given the declared types: name_bucket/_sum/_count of a
 * histogram belong to name. */
static void family_of(const char *name, char (*fam)[128], char (*types)[16], int nf, char *out)
{
    snprintf(out, 128, "%s", name);
    static const char *suf[] = { "_bucket", "_sum", "_count" };
    for (int k = 0; k < 3; k++) {
        size_t ln = strlen(name), ls = strlen(suf[k]);
        if (ln <= ls || strcmp(name + ln - ls, suf[k])) continue;
        for (int i = 0; i < nf; i++)
            if (strlen(fam[i]) == ln - ls && !strncmp(fam[i], name, ln - ls) && !strcmp(types[i], "histogram")) {
                snprintf(out, 128, "%s", fam[i]);
                return;
            }
    }
}

const char *prom_check(const char *text, char *err, size_t errlen)
{
    static char fam[MAXF][128], types[MAXF][16];
    static char *series[MAXS];
    int nf = 0, ns = 0, line = 0;
    char cur[128] = "";   /* the family whose samples come now */
    char done[MAXF][128]; /* families whose samples ended */
    int nd = 0;
    /* histogram state: the bucket series' labels without le, last count */
    char hkey[512] = "";
    double hlast = -1;
    int hinf = 0;
    const char *res = NULL;
    size_t tl = strlen(text);
    if (!tl || text[tl - 1] != '\n') return fail(err, errlen, 0, "the text does not end with a newline");
    for (const char *p = text; *p && !res;) {
        const char *eol = strchr(p, '\n');
        line++;
        char l[1024];
        size_t n = (size_t)(eol - p);
        if (n >= sizeof l) {
            res = fail(err, errlen, line, "line too long");
            break;
        }
        memcpy(l, p, n);
        l[n] = 0;
        p = eol + 1;
        if (!n) {
            res = fail(err, errlen, line, "empty line");
            break;
        }
        if (l[0] == '#') {
            char kw[16], name[128], rest[800] = "";
            int k = sscanf(l, "# %15s %127s %799[^\n]", kw, name, rest);
            if (k < 2 || (strcmp(kw, "HELP") && strcmp(kw, "TYPE"))) {
                res = fail(err, errlen, line, "a comment that is neither HELP nor TYPE: %s", l);
                break;
            }
            if (!name_ok(name, strlen(name), 0)) {
                res = fail(err, errlen, line, "bad metric name %s", name);
                break;
            }
            if (!strcmp(kw, "TYPE")) {
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
                    strcmp(rest, "summary") && strcmp(rest, "untyped")) {
                    res = fail(err, errlen, line, "bad type '%s'", rest);
                    break;
                }
                for (int i = 0; i < nf; i++)
                    if (!strcmp(fam[i], name)) {
                        res = fail(err, errlen, line, "TYPE of %s twice", name);
                        break;
                    }
                if (res) break;
                if (nf == MAXF) {
                    res = fail(err, errlen, line, "too many families");
                    break;
                }
                snprintf(fam[nf], sizeof fam[nf], "%s", name);
                snprintf(types[nf], sizeof types[nf], "%s", rest);
                nf++;
            } else if (!rest[0]) {
                res = fail(err, errlen, line, "HELP of %s without text", name);
            }
            continue;
        }
        /* a sample: name[{labels}] value */
        size_t i = 0;
        while (l[i] && l[i] != '{' && l[i] != ' ') i++;
        char name[128];
        if (i >= sizeof name || !name_ok(l, i, 0)) {
            res = fail(err, errlen, line, "bad sample name: %s", l);
            break;
        }
        memcpy(name, l, i);
        name[i] = 0;
        char labels[800] = "", le[64] = "";
        size_t lo = 0;
        if (l[i] == '{') {
            i++;
            int first = 1;
            while (l[i] != '}') {
                if (!first) {
                    if (l[i] != ',') {
                        res = fail(err, errlen, line, "labels not comma separated");
                        break;
                    }
                    i++;
                }
                first = 0;
                size_t ns0 = i;
                while (l[i] && l[i] != '=') i++;
                if (!name_ok(l + ns0, i - ns0, 1) || l[i] != '=' || l[i + 1] != '"') {
                    res = fail(err, errlen, line, "bad label: %s", l + ns0);
                    break;
                }
                char lname[64];
                snprintf(lname, sizeof lname, "%.*s", (int)(i - ns0), l + ns0);
                i += 2;
                size_t vs = i;
                while (l[i] && l[i] != '"') {
                    if (l[i] == '\\') {
                        if (l[i + 1] != '\\' && l[i + 1] != '"' && l[i + 1] != 'n') {
                            res = fail(err, errlen, line, "bad escape in a label value");
                            break;
                        }
                        i++;
                    }
                    i++;
                }
                if (res) break;
                if (l[i] != '"') {
                    res = fail(err, errlen, line, "unterminated label value");
                    break;
                }
                if (!strcmp(lname, "le"))
                    snprintf(le, sizeof le, "%.*s", (int)(i - vs), l + vs);
                else
                    lo += (size_t)snprintf(labels + lo, sizeof labels - lo, "%s%.*s", lo ? "," : "", (int)(i - ns0 + 1),
                                           l + ns0);
                i++;
                if (lo >= sizeof labels) {
                    res = fail(err, errlen, line, "labels too long");
                    break;
                }
            }
            if (res) break;
            i++;
        }
        if (l[i] != ' ') {
            res = fail(err, errlen, line, "no space before the value");
            break;
        }
        double v;
        if (!value_ok(l + i + 1, &v)) {
            res = fail(err, errlen, line, "bad value '%s'", l + i + 1);
            break;
        }
        /* family bookkeeping */
        char f[128];
        family_of(name, fam, types, nf, f);
        int typed = -1;
        for (int k = 0; k < nf; k++)
            if (!strcmp(fam[k], f)) typed = k;
        if (typed < 0) {
            res = fail(err, errlen, line, "sample of %s before its TYPE", name);
            break;
        }
        if (strcmp(cur, f)) {
            for (int k = 0; k < nd; k++)
                if (!strcmp(done[k], f)) {
                    res = fail(err, errlen, line, "samples of %s not contiguous", f);
                    break;
                }
            if (res) break;
            if (cur[0] && nd < MAXF) snprintf(done[nd++], sizeof done[0], "%s", cur);
            snprintf(cur, sizeof cur, "%s", f);
        }
        /* duplicates */
        char key[1024];
        snprintf(key, sizeof key, "%s{%s}le=%s", name, labels, le);
        for (int k = 0; k < ns; k++)
            if (!strcmp(series[k], key)) {
                res = fail(err, errlen, line, "series twice: %s", key);
                break;
            }
        if (res) break;
        if (ns < MAXS) series[ns++] = strdup(key);
        /* histograms */
        if (!strcmp(types[typed], "histogram")) {
            size_t fl = strlen(f);
            const char *suf = name + fl;
            char hk[512];
            snprintf(hk, sizeof hk, "%s{%s}", f, labels);
            if (!strcmp(suf, "_bucket")) {
                double b;
                if (!le[0] || !value_ok(le, &b)) {
                    res = fail(err, errlen, line, "bucket without a valid le");
                    break;
                }
                if (strcmp(hk, hkey)) {
                    if (hkey[0] && !hinf) {
                        res = fail(err, errlen, line, "%s: no +Inf bucket", hkey);
                        break;
                    }
                    snprintf(hkey, sizeof hkey, "%s", hk);
                    hlast = -1;
                    hinf = 0;
                }
                if (v < hlast) {
                    res = fail(err, errlen, line, "buckets not cumulative");
                    break;
                }
                hlast = v;
                hinf = isinf(b) != 0;
            } else if (!strcmp(suf, "_count")) {
                if (strcmp(hk, hkey) || !hinf) {
                    res = fail(err, errlen, line, "_count without its +Inf bucket");
                    break;
                }
                if (v != hlast) {
                    res = fail(err, errlen, line, "_count %g != +Inf bucket %g", v, hlast);
                    break;
                }
            } else if (strcmp(suf, "_sum")) {
                res = fail(err, errlen, line, "histogram sample %s", name);
                break;
            }
        } else if (le[0]) {
            res = fail(err, errlen, line, "le label outside a histogram");
        }
    }
    for (int k = 0; k < ns; k++) free(series[k]);
    return res;
}

int prom_value(const char *text, const char *series, double *v)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, series, n) && p[n] == ' ') {
            *v = strtod(p + n + 1, NULL);
            return 0;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return -1;
}

double prom_sum(const char *text, const char *name, const char *with)
{
    double s = 0;
    size_t n = strlen(name);
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        if (!strncmp(p, name, n) && (p[n] == '{' || p[n] == ' ')) {
            const char *sp = memchr(p, '}', (size_t)(eol - p));
            sp = sp ? sp + 1 : p + n;
            int hit = 1;
            if (with) {
                char l[1024];
                snprintf(l, sizeof l, "%.*s", (int)(sp - p), p);
                hit = strstr(l, with) != NULL;
            }
            if (hit) s += strtod(sp + 1, NULL);
        }
        p = eol ? eol + 1 : NULL;
    }
    return s;
}
