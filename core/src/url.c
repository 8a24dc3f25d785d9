/* Identity URLs: `ip:port#model|stage|shard|replica`, IPv6 as `[addr]:port#...`.
 * Strict on purpose: a URL is an identity, and two spellings of one identity would split a peer
 * in two (so no hostnames, no signs, no spaces, no leading zeros). */
#include "connex/connex.h"
#include "mobility/mobility.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return CX_EINVAL;
}

static int model_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
        c == '-' || c == '/' || c == ':' || c == '+';
}

/* Parses a decimal in [lo, hi] from s[0..n): digits only, no leading zero unless "0". */
static int parse_dec(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (n == 0 || n > 10) return -1;
    if (n > 1 && s[0] == '0') return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cx_lid_parse(const char *s, cx_lid_t *out, char *err, size_t errlen)
{
    if (!s) return fail(err, errlen, "LID is NULL");
    if (!out) return fail(err, errlen, "no output LID");
    const char *p[4];
    size_t n[4];
    int k = 0;
    const char *start = s;
    for (const char *c = s;; c++) {
        if (*c == '|' || *c == 0) {
            if (k == 4) return fail(err, errlen, "LID '%.80s' has more than 4 fields (model|stage|shard|replica)", s);
            p[k] = start;
            n[k] = (size_t)(c - start);
            k++;
            if (*c == 0) break;
            start = c + 1;
        }
    }
    if (k != 4) return fail(err, errlen, "LID '%.80s' has %d field(s), expected model|stage|shard|replica", s, k);
    if (n[0] == 0) return fail(err, errlen, "LID '%.80s': empty model name", s);
    if (n[0] >= CX_MODEL_MAX)
        return fail(err, errlen, "LID '%.80s': model name longer than %d characters", s, CX_MODEL_MAX - 1);
    for (size_t i = 0; i < n[0]; i++)
        if (!model_char_ok(p[0][i]))
            return fail(err, errlen,
                        "LID '%.80s': character '%c' not allowed in a model name "
                        "(letters, digits, . _ - / : +)",
                        s, p[0][i] >= 32 && p[0][i] < 127 ? p[0][i] : '?');
    static const char *what[] = { "model", "stage", "shard", "replica" };
    uint64_t v[4] = { 0 };
    for (int i = 1; i < 4; i++)
        if (parse_dec(p[i], n[i], 0, UINT32_MAX, &v[i]))
            return fail(err, errlen, "LID '%.80s': %s '%.*s' is not a decimal number in 0..4294967295", s, what[i],
                        (int)(n[i] > 20 ? 20 : n[i]), p[i]);
    memset(out, 0, sizeof *out);
    memcpy(out->model, p[0], n[0]);
    out->stage = (uint32_t)v[1];
    out->shard = (uint32_t)v[2];
    out->replica = (uint32_t)v[3];
    return CX_OK;
}

int cx_url_parse(const char *s, cx_url_t *out, char *err, size_t errlen)
{
    if (!s) return fail(err, errlen, "URL is NULL");
    if (!out) return fail(err, errlen, "no output URL");
    if (strlen(s) >= CX_URL_MAX) return fail(err, errlen, "URL longer than %d characters", CX_URL_MAX - 1);
    const char *hash = strchr(s, '#');
    if (!hash) return fail(err, errlen, "URL '%s' has no '#': expected ip:port#model|stage|shard|replica", s);
    cx_url_t u;
    memset(&u, 0, sizeof u);
    const char *hs, *he, *ps;
    if (s[0] == '[') {
        hs = s + 1;
        he = memchr(hs, ']', (size_t)(hash - hs));
        if (!he) return fail(err, errlen, "URL '%s': '[' without ']' around the IPv6 address", s);
        if (he[1] != ':') return fail(err, errlen, "URL '%s': expected ':port' after ']'", s);
        ps = he + 2;
        u.is_ipv6 = 1;
    } else {
        int colons = 0;
        for (const char *c = s; c < hash; c++) colons += *c == ':';
        if (colons > 1) return fail(err, errlen, "URL '%s': IPv6 addresses go in brackets: [addr]:port#...", s);
        hs = s;
        he = NULL;
        for (const char *c = s; c < hash; c++)
            if (*c == ':') {
                he = c;
                break;
            }
        if (!he) return fail(err, errlen, "URL '%s': no ':port' before '#'", s);
        ps = he + 1;
    }
    size_t hn = (size_t)(he - hs);
    if (hn == 0) return fail(err, errlen, "URL '%s': empty address", s);
    if (hn >= sizeof u.host) return fail(err, errlen, "URL '%s': address too long", s);
    memcpy(u.host, hs, hn);
    u.host[hn] = 0;
    unsigned char bin[16];
    if (inet_pton(u.is_ipv6 ? AF_INET6 : AF_INET, u.host, bin) != 1) {
        if (!u.is_ipv6 && strchr(u.host, ':'))
            return fail(err, errlen, "URL '%s': IPv6 addresses go in brackets: [addr]:port", s);
        return fail(err, errlen, "URL '%s': '%s' is not a numeric %s address (no host names)", s, u.host,
                    u.is_ipv6 ? "IPv6" : "IPv4");
    }
    uint64_t port;
    if (parse_dec(ps, (size_t)(hash - ps), 1, 65535, &port))
        return fail(err, errlen, "URL '%s': port '%.*s' is not a number in 1..65535", s,
                    (int)((size_t)(hash - ps) > 12 ? 12 : (size_t)(hash - ps)), ps);
    u.port = (uint16_t)port;
    char lerr[200];
    if (cx_lid_parse(hash + 1, &u.lid, lerr, sizeof lerr)) return fail(err, errlen, "URL '%s': %s", s, lerr);
    *out = u;
    return CX_OK;
}

int cx_lid_format(const cx_lid_t *lid, char *buf, size_t len)
{
    if (!lid || !buf) return CX_EINVAL;
    int n = snprintf(buf, len, "%s|%u|%u|%u", lid->model, lid->stage, lid->shard, lid->replica);
    return n < 0 || (size_t)n >= len ? CX_EINVAL : CX_OK;
}

int cx_url_format(const cx_url_t *u, char *buf, size_t len)
{
    if (!u || !buf) return CX_EINVAL;
    int n = snprintf(buf, len, u->is_ipv6 ? "[%s]:%u#%s|%u|%u|%u" : "%s:%u#%s|%u|%u|%u", u->host, u->port, u->lid.model,
                     u->lid.stage, u->lid.shard, u->lid.replica);
    return n < 0 || (size_t)n >= len ? CX_EINVAL : CX_OK;
}

int cx_lid_cmp(const cx_lid_t *a, const cx_lid_t *b)
{
    int c = strncmp(a->model, b->model, CX_MODEL_MAX);
    if (c) return c < 0 ? -1 : 1;
    if (a->stage != b->stage) return a->stage < b->stage ? -1 : 1;
    if (a->shard != b->shard) return a->shard < b->shard ? -1 : 1;
    if (a->replica != b->replica) return a->replica < b->replica ? -1 : 1;
    return 0;
}

/* LID patterns: each field of model|stage|shard|replica may be "*". */
int cx_lid_pat_parse(const char *s, cx_lid_pat_t *out, char *err, size_t errlen)
{
    if (!s) return fail(err, errlen, "LID pattern is NULL");
    if (!out) return fail(err, errlen, "no output pattern");
    char buf[CX_MODEL_MAX + 48];
    if (strlen(s) >= sizeof buf) return fail(err, errlen, "LID pattern '%.80s' is too long", s);
    /* Replace each "*" field by a placeholder the strict parser accepts, and remember it. */
    static const char *dummy[] = { "x", "0", "0", "0" };
    unsigned wild = 0;
    size_t o = 0;
    int field = 0;
    const char *start = s;
    for (const char *c = s;; c++) {
        if (*c == '|' || *c == 0) {
            size_t n = (size_t)(c - start);
            const char *src = start;
            if (n == 1 && *start == '*' && field < 4) {
                wild |= 1u << field;
                src = dummy[field];
                n = strlen(src);
            }
            memcpy(buf + o, src, n);
            o += n;
            if (*c == 0) break;
            buf[o++] = '|';
            field++;
            start = c + 1;
        }
    }
    buf[o] = 0;
    char why[160];
    if (cx_lid_parse(buf, &out->lid, why, sizeof why))
        return fail(err, errlen, "LID pattern '%.80s' (fields may be '*'): %s", s, why);
    out->wild = wild;
    return CX_OK;
}

int cx_lid_pat_match(const cx_lid_pat_t *p, const cx_lid_t *lid)
{
    if (!(p->wild & 1u) && strcmp(p->lid.model, lid->model)) return 0;
    if (!(p->wild & 2u) && p->lid.stage != lid->stage) return 0;
    if (!(p->wild & 4u) && p->lid.shard != lid->shard) return 0;
    if (!(p->wild & 8u) && p->lid.replica != lid->replica) return 0;
    return 1;
}
