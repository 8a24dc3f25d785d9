/* The etcd v3 directory, through etcd's JSON gateway over HTTP (libcurl).
 *
 * Our entry: key "/connex/lid/<model>|<stage>|<shard>|<replica>", value "<url> <incarnation hex>",
 * attached to a lease of cfg.lease_ms (whole seconds, at least 1). All network I/O runs on a
 * thread of its own, so the progress thread (heartbeats) never waits on etcd: it keeps the lease
 * alive at a third of its TTL, and a watch on the prefix streams every change with its
 * mod_revision (the entry's version) into the shared table (dir.c), which the progress thread
 * applies at its next tick. etcd going away: log, keep the table as it is, retry with backoff;
 * getting it back: register again (new lease), reread the prefix, watch from there. A lease that
 * ran out while we were paused (SIGSTOP) is noticed by the keep-alive and replaced the same way.
 * A clean close revokes the lease, which deletes our key, and only ours: if a newer process of
 * the same LID holds the key by now, its registration stays. */
#define CX_DL_CURL 1
#include "dir_impl.h"
#include "dl_libs.h"

#include "connex/log.h"
#include "json_lite.h"
#include "etcd_wire.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEY_END "/connex/lid0" /* '/' + 1: the end of the prefix range */
#define REQ_TIMEOUT_MS 1500L
#define RESP_MAX (8u << 20)

typedef struct etcd {
    cx_dir_t *d;
    char base[200]; /* http://host:port */
    char key_b64[256], val_b64[512], pfx_b64[32], end_b64[32];
    uint32_t ttl_s;
    uint64_t ttl_granted;
    uint64_t lease; /* 0: none */
    uint64_t rev;   /* the last revision seen: a watch resumes after it */
    CURL *req;
    struct curl_slist *hdr;
    char *rbuf;
    size_t rlen, rcap;
    CURLM *multi;
    CURL *watch; /* the streaming watch, NULL when not watching */
    char *wbuf;
    size_t wlen, wcap;
    int watch_broken; /* etcd cancelled the watch (compaction): resync */
    int bad_value_logged;
    atomic_int stop;
    pthread_t th;
    int th_started;
} etcd_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---------------------------------------------------------------- requests */

static size_t req_data(char *p, size_t sz, size_t nm, void *arg)
{
    etcd_t *x = arg;
    size_t n = sz * nm;
    if (x->rlen + n + 1 > RESP_MAX) return 0; /* abort: no sane answer is this big */
    if (x->rlen + n + 1 > x->rcap) {
        size_t nc = x->rcap ? x->rcap : 4096;
        while (nc < x->rlen + n + 1) nc *= 2;
        char *nb = realloc(x->rbuf, nc);
        if (!nb) return 0;
        x->rbuf = nb;
        x->rcap = nc;
    }
    memcpy(x->rbuf + x->rlen, p, n);
    x->rlen += n;
    x->rbuf[x->rlen] = 0;
    return n;
}

/* POSTs body to path; *out spans the JSON answer (valid until the next request). CX_EPEER when
 * etcd could not be reached, CX_ERR when it answered with an error. */
static int post(etcd_t *x, const char *path, const char *body, cx_js_t *out, char *why, size_t wn)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", x->base, path);
    x->rlen = 0;
    if (x->rbuf) x->rbuf[0] = 0;
    cx_curl.easy_setopt(x->req, CURLOPT_URL, url);
    cx_curl.easy_setopt(x->req, CURLOPT_POSTFIELDS, body);
    CURLcode cc = cx_curl.easy_perform(x->req);
    if (cc != CURLE_OK) {
        snprintf(why, wn, "%s", cx_curl.easy_strerror(cc));
        return CX_EPEER;
    }
    long code = 0;
    cx_curl.easy_getinfo(x->req, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200 || !x->rbuf) {
        snprintf(why, wn, "HTTP %ld on %s: %.200s", code, path, x->rbuf ? x->rbuf : "");
        return CX_ERR;
    }
    *out = (cx_js_t){ x->rbuf, x->rbuf + x->rlen };
    return CX_OK;
}

static void revoke(etcd_t *x, uint64_t lease)
{
    char body[64], why[256];
    cx_js_t r;
    snprintf(body, sizeof body, "{\"ID\":\"%" PRIu64 "\"}", lease);
    if (post(x, "/v3/lease/revoke", body, &r, why, sizeof why))
        cx_info("directory: etcd: revoking lease %" PRIx64 ": %s (it runs out by itself)", lease, why);
}

/* A new lease, and our key under it; the previous lease (if any) is revoked afterwards, when it
 * no longer holds the key. */
static int reg(etcd_t *x, char *why, size_t wn)
{
    char body[1024];
    cx_js_t r;
    snprintf(body, sizeof body, "{\"TTL\":\"%u\"}", x->ttl_s);
    int rc = post(x, "/v3/lease/grant", body, &r, why, wn);
    if (rc) return rc;
    uint64_t id = 0, ttl = 0;
    if (cx_js_u64(cx_js_get(r, "ID"), &id) || !id) {
        snprintf(why, wn, "lease grant answered without an ID: %.200s", x->rbuf);
        return CX_ERR;
    }
    if (cx_js_u64(cx_js_get(r, "TTL"), &ttl) || !ttl) ttl = x->ttl_s;
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRIu64 "\"}", x->key_b64, x->val_b64,
             id);
    rc = post(x, "/v3/kv/put", body, &r, why, wn);
    if (rc) {
        revoke(x, id);
        return rc;
    }
    uint64_t old = x->lease;
    x->lease = id;
    x->ttl_granted = ttl;
    if (old) revoke(x, old);
    return CX_OK;
}

/* 0: alive; 1: the lease is gone (expired while we could not renew it); <0: etcd unreachable. */
static int keepalive(etcd_t *x, char *why, size_t wn)
{
    char body[64];
    cx_js_t r;
    snprintf(body, sizeof body, "{\"ID\":\"%" PRIu64 "\"}", x->lease);
    int rc = post(x, "/v3/lease/keepalive", body, &r, why, wn);
    if (rc) return rc;
    uint64_t ttl = 0;
    cx_js_t res = cx_js_get(r, "result");
    if (cx_js_u64(cx_js_get(res.s ? res : r, "TTL"), &ttl) || ttl == 0) return 1;
    return 0;
}

/* ---------------------------------------------------------------- entries */

/* A kv of the prefix into an entry; -1 (logged once) when it is not one of ours. */
static int kv_entry(etcd_t *x, cx_js_t kv, int is_del, cx_dir_entry_t *ent)
{
    char err[200];
    if (cx_etcd_kv_entry(kv, is_del, ent, err, sizeof err) == CX_OK) return 0;
    if (!x->bad_value_logged++)
        cx_warn("directory: etcd: ignoring an entry under %s that is not ours (%s)", CX_ETCD_KEY_PREFIX, err);
    return -1;
}

/* Rereads the whole prefix: what appeared, moved or went while we were not watching. */
static int resync(etcd_t *x, char *why, size_t wn)
{
    char body[256];
    cx_js_t r;
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"range_end\":\"%s\"}", x->pfx_b64, x->end_b64);
    int rc = post(x, "/v3/kv/range", body, &r, why, wn);
    if (rc) return rc;
    uint64_t rev = 0;
    if (cx_js_u64(cx_js_get(cx_js_get(r, "header"), "revision"), &rev)) {
        snprintf(why, wn, "range answered without a revision");
        return CX_ERR;
    }
    cx_dir_entry_t *have;
    size_t nh;
    if (cx_dir_table_snapshot(x->d, &have, &nh)) return CX_ENOMEM;
    char *seen = calloc(nh ? nh : 1, 1);
    if (!seen) {
        free(have);
        return CX_ENOMEM;
    }
    cx_js_t it = { 0, 0 }, kv;
    while (cx_js_next(cx_js_get(r, "kvs"), &it, &kv)) {
        cx_dir_entry_t ent;
        if (kv_entry(x, kv, 0, &ent)) continue;
        for (size_t i = 0; i < nh; i++)
            if (!cx_lid_cmp(&have[i].lid, &ent.lid)) seen[i] = 1;
        cx_dir_table_apply(x->d, &ent, CX_DIR_PUT);
    }
    for (size_t i = 0; i < nh; i++) {
        if (seen[i]) continue;
        cx_dir_entry_t del = have[i];
        del.version = rev;
        cx_dir_table_apply(x->d, &del, CX_DIR_DEL);
    }
    free(seen);
    free(have);
    x->rev = rev;
    return CX_OK;
}

/* ---------------------------------------------------------------- the watch */

static void watch_message(etcd_t *x, const char *s, size_t n)
{
    cx_js_t root = { s, s + n };
    cx_js_t res = cx_js_get(root, "result");
    if (!res.s) {
        cx_warn("directory: etcd watch: unexpected message: %.200s", s);
        x->watch_broken = 1;
        return;
    }
    uint64_t v = 0;
    if (cx_js_bool(cx_js_get(res, "canceled")) || (!cx_js_u64(cx_js_get(res, "compact_revision"), &v) && v)) {
        cx_warn("directory: etcd cancelled the watch (compacted to revision %" PRIu64 "): reading it all again", v);
        x->watch_broken = 1;
        return;
    }
    cx_js_t it = { 0, 0 }, ev;
    while (cx_js_next(cx_js_get(res, "events"), &it, &ev)) {
        char type[16] = "PUT";
        cx_js_str(cx_js_get(ev, "type"), type, sizeof type);
        int del = !strcmp(type, "DELETE");
        cx_dir_entry_t ent;
        if (kv_entry(x, cx_js_get(ev, "kv"), del, &ent)) continue;
        cx_dir_table_apply(x->d, &ent, del ? CX_DIR_DEL : CX_DIR_PUT);
        if (ent.version > x->rev) x->rev = ent.version;
    }
    if (!cx_js_u64(cx_js_get(cx_js_get(res, "header"), "revision"), &v) && v > x->rev) x->rev = v;
}

static size_t watch_data(char *p, size_t sz, size_t nm, void *arg)
{
    etcd_t *x = arg;
    size_t n = sz * nm;
    if (x->wlen + n > RESP_MAX) return 0;
    if (x->wlen + n > x->wcap) {
        size_t nc = x->wcap ? x->wcap : 4096;
        while (nc < x->wlen + n) nc *= 2;
        char *nb = realloc(x->wbuf, nc);
        if (!nb) return 0;
        x->wbuf = nb;
        x->wcap = nc;
    }
    memcpy(x->wbuf + x->wlen, p, n);
    x->wlen += n;
    /* The gateway writes one JSON message per line. */
    size_t off = 0;
    for (;;) {
        char *nl = memchr(x->wbuf + off, '\n', x->wlen - off);
        if (!nl) break;
        size_t l = (size_t)(nl - (x->wbuf + off));
        *nl = 0;
        if (l) watch_message(x, x->wbuf + off, l);
        off += l + 1;
    }
    memmove(x->wbuf, x->wbuf + off, x->wlen - off);
    x->wlen -= off;
    return n;
}

static void watch_stop(etcd_t *x)
{
    if (!x->watch) return;
    cx_curl.multi_remove_handle(x->multi, x->watch);
    cx_curl.easy_cleanup(x->watch);
    x->watch = NULL;
    x->wlen = 0;
}

static int watch_start(etcd_t *x)
{
    watch_stop(x);
    x->watch_broken = 0;
    CURL *w = cx_curl.easy_init();
    if (!w) return CX_ENOMEM;
    char url[256], body[512];
    snprintf(url, sizeof url, "%s/v3/watch", x->base);
    snprintf(body, sizeof body,
             "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\",\"start_revision\":\"%" PRIu64 "\"}}",
             x->pfx_b64, x->end_b64, x->rev + 1);
    cx_curl.easy_setopt(w, CURLOPT_URL, url);
    cx_curl.easy_setopt(w, CURLOPT_COPYPOSTFIELDS, body);
    cx_curl.easy_setopt(w, CURLOPT_HTTPHEADER, x->hdr);
    cx_curl.easy_setopt(w, CURLOPT_WRITEFUNCTION, watch_data);
    cx_curl.easy_setopt(w, CURLOPT_WRITEDATA, x);
    cx_curl.easy_setopt(w, CURLOPT_NOSIGNAL, 1L);
    cx_curl.easy_setopt(w, CURLOPT_CONNECTTIMEOUT_MS, REQ_TIMEOUT_MS);
    /* A dead etcd host (no RST) is found by TCP keep-alive and by our lease keep-alive. */
    cx_curl.easy_setopt(w, CURLOPT_TCP_KEEPALIVE, 1L);
    if (cx_curl.multi_add_handle(x->multi, w) != CURLM_OK) {
        cx_curl.easy_cleanup(w);
        return CX_ERR;
    }
    x->watch = w;
    return CX_OK;
}

/* ---------------------------------------------------------------- the thread */

/* Register, reread, watch: what start-up does, and what every reconnect does again. */
static int connect_all(etcd_t *x, char *why, size_t wn)
{
    int rc = reg(x, why, wn);
    if (!rc) rc = resync(x, why, wn);
    if (!rc) rc = watch_start(x);
    return rc;
}

static void *etcd_main(void *arg)
{
    etcd_t *x = arg;
    int up = 1;
    uint32_t backoff = 100;
    uint64_t t = now_ms(), retry_at = 0, next_ka = t + x->ttl_granted * 1000 / 3;
    char why[512];
    while (!atomic_load(&x->stop)) {
        t = now_ms();
        if (!up && t >= retry_at) {
            if (connect_all(x, why, sizeof why) == CX_OK) {
                cx_warn("directory: etcd at %s is back: registered again (lease %" PRIx64 ")", x->base, x->lease);
                up = 1;
                backoff = 100;
                next_ka = now_ms() + x->ttl_granted * 1000 / 3;
            } else {
                retry_at = now_ms() + backoff;
                backoff = backoff < 1000 ? backoff * 2 : 2000;
                cx_debug("directory: etcd at %s: %s (retrying in %u ms)", x->base, why, backoff);
            }
        } else if (up && t >= next_ka) {
            int k = keepalive(x, why, sizeof why);
            if (k == 1) {
                cx_warn("directory: etcd lease %" PRIx64 " ran out (this process was paused or cut off "
                        "longer than %" PRIu64 " s): registering again",
                        x->lease, x->ttl_granted);
                x->lease = 0;
                k = reg(x, why, sizeof why);
            }
            if (k < 0) {
                cx_warn("directory: etcd at %s unreachable (%s): keeping the entries known, retrying", x->base, why);
                watch_stop(x);
                up = 0;
                retry_at = now_ms() + backoff;
            }
            next_ka = now_ms() + x->ttl_granted * 1000 / 3;
        }
        if (up) {
            int running = 0;
            cx_curl.multi_perform(x->multi, &running);
            int left;
            CURLMsg *m;
            while ((m = cx_curl.multi_info_read(x->multi, &left)))
                if (m->msg == CURLMSG_DONE && m->easy_handle == x->watch) {
                    cx_warn("directory: etcd watch at %s ended (%s): keeping the entries known, reconnecting", x->base,
                            cx_curl.easy_strerror(m->data.result));
                    x->watch_broken = 1;
                }
            if (x->watch_broken) {
                watch_stop(x);
                up = 0;
                retry_at = now_ms() + backoff;
            }
        }
        t = now_ms();
        uint64_t until = up ? next_ka : retry_at;
        int wait = until > t ? (int)(until - t) : 0;
        if (wait > 1000) wait = 1000;
        cx_curl.multi_poll(x->multi, NULL, 0, wait, NULL);
    }
    return NULL;
}

/* ---------------------------------------------------------------- open / close */

static void etcd_free(etcd_t *x)
{
    watch_stop(x);
    if (x->multi) cx_curl.multi_cleanup(x->multi);
    if (x->req) cx_curl.easy_cleanup(x->req);
    cx_curl.slist_free_all(x->hdr);
    free(x->rbuf);
    free(x->wbuf);
    free(x);
}

static int etcd_open(cx_dir_t *d, const char *spec)
{
    /* etcd://host:port, one endpoint; a path or a list is a mistake worth saying. */
    if (!spec || !*spec || strlen(spec) > 150 || strpbrk(spec, "/,@?# ") || !strchr(spec, ':')) {
        cx_error("directory: 'etcd://%.150s': expected etcd://host:port (one endpoint)", spec ? spec : "");
        return CX_EINVAL;
    }
    if (cx_curl_load()) return CX_EUNSUPPORTED; /* logged: libcurl is loaded only here */
    etcd_t *x = calloc(1, sizeof *x);
    if (!x) return CX_ENOMEM;
    x->d = d;
    snprintf(x->base, sizeof x->base, "http://%s", spec);
    x->ttl_s = (d->lease_ms + 999) / 1000;
    if (x->ttl_s < 1) x->ttl_s = 1;
    char lid[96], key[160], val[CX_URL_MAX + 32];
    cx_lid_format(&d->lid, lid, sizeof lid);
    snprintf(key, sizeof key, CX_ETCD_KEY_PREFIX "%s", lid);
    snprintf(val, sizeof val, "%s %016" PRIx64, d->url, d->incarnation);
    cx_b64_enc(key, strlen(key), x->key_b64);
    cx_b64_enc(val, strlen(val), x->val_b64);
    cx_b64_enc(CX_ETCD_KEY_PREFIX, strlen(CX_ETCD_KEY_PREFIX), x->pfx_b64);
    cx_b64_enc(KEY_END, strlen(KEY_END), x->end_b64);
    x->req = cx_curl.easy_init();
    x->multi = cx_curl.multi_init();
    x->hdr = cx_curl.slist_append(NULL, "Content-Type: application/json");
    if (!x->req || !x->multi || !x->hdr) {
        etcd_free(x);
        return CX_ENOMEM;
    }
    cx_curl.easy_setopt(x->req, CURLOPT_HTTPHEADER, x->hdr);
    cx_curl.easy_setopt(x->req, CURLOPT_WRITEFUNCTION, req_data);
    cx_curl.easy_setopt(x->req, CURLOPT_WRITEDATA, x);
    cx_curl.easy_setopt(x->req, CURLOPT_NOSIGNAL, 1L);
    cx_curl.easy_setopt(x->req, CURLOPT_TIMEOUT_MS, REQ_TIMEOUT_MS);
    cx_curl.easy_setopt(x->req, CURLOPT_CONNECTTIMEOUT_MS, REQ_TIMEOUT_MS);
    char why[512];
    int rc = connect_all(x, why, sizeof why);
    if (rc) {
        cx_error("directory: etcd at %s: %s: cannot register this engine", x->base, why);
        if (x->lease) revoke(x, x->lease);
        etcd_free(x);
        return rc == CX_ENOMEM ? rc : CX_EPEER;
    }
    d->impl = x;
    if (pthread_create(&x->th, NULL, etcd_main, x)) {
        cx_error("directory: cannot start the etcd thread");
        revoke(x, x->lease);
        etcd_free(x);
        d->impl = NULL;
        return CX_ERR;
    }
    x->th_started = 1;
    cx_info("directory: etcd at %s, lease %" PRIx64 " (TTL %" PRIu64 " s), revision %" PRIu64, x->base, x->lease,
            x->ttl_granted, x->rev);
    return CX_OK;
}

static void etcd_close(cx_dir_t *d)
{
    etcd_t *x = d->impl;
    if (!x) return;
    atomic_store(&x->stop, 1);
    cx_curl.multi_wakeup(x->multi);
    if (x->th_started) pthread_join(x->th, NULL);
    watch_stop(x);
    /* The clean close: the entry goes now, not when the lease runs out. */
    if (x->lease) revoke(x, x->lease);
    etcd_free(x);
    d->impl = NULL;
}

const cx_dir_ops_t cx_dir_etcd_ops = { "etcd", etcd_open, etcd_close };
