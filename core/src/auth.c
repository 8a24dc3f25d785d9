/* Control-channel authentication (see auth.h for the exchange). HMAC-SHA256 comes from OpenSSL's
 * libcrypto, loaded when an engine first has a token (dl_libs.c): no cryptography is written
 * here. Secrets are wiped with explicit_bzero; proofs are compared in constant time. */
#include "auth.h"
#include "connex/options.h"

#include "engine.h"

#include "connex/log.h"

#include "dl_libs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static const char cx_auth_label[] = "connex-auth-v1";

/* ---------------------------------------------------------------- token */

static int read_token_file(const char *path, cx_auth_t *a)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cx_error("auth: CONNEX_AUTH_TOKEN_FILE=%s: %s", path, strerror(errno));
        return CX_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 0077))
        cx_warn("auth: token file %s is readable by group or others (mode %03o): chmod 600 it", path,
                (unsigned)(st.st_mode & 0777));
    /* One byte more than allowed, to tell "too long" from "exactly the limit". */
    uint8_t buf[CX_AUTH_TOKEN_MAX + 1];
    size_t n = 0;
    while (n < sizeof buf) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            cx_error("auth: reading %s: %s", path, strerror(errno));
            close(fd);
            explicit_bzero(buf, sizeof buf);
            return CX_EINVAL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    /* A trailing newline is how editors and `echo` write files; it is not part of the token. */
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
    if (n > CX_AUTH_TOKEN_MAX) {
        cx_error("auth: token in %s is longer than %d bytes", path, CX_AUTH_TOKEN_MAX);
        explicit_bzero(buf, sizeof buf);
        return CX_EINVAL;
    }
    memcpy(a->key, buf, n);
    a->key_len = n;
    explicit_bzero(buf, sizeof buf);
    return CX_OK;
}

int cx_auth_load(const cx_opts_t *o, const char *cfg_token, cx_auth_t **out)
{
    *out = NULL;
    const char *env = cx_opts_str(o, "CONNEX_AUTH_TOKEN"), *file = cx_opts_str(o, "CONNEX_AUTH_TOKEN_FILE");
    const char *tok = NULL, *src = NULL;
    if (cfg_token) {
        tok = cfg_token;
        src = "config";
    } else if (env && *env) {
        tok = env;
        src = "CONNEX_AUTH_TOKEN";
    } else if (file && *file)
        src = "CONNEX_AUTH_TOKEN_FILE";
    if (!src) return CX_OK;
    if (cx_crypto_load()) return CX_EUNSUPPORTED; /* logged: libcrypto is loaded only here */

    cx_auth_t *a = calloc(1, sizeof *a);
    if (!a) return CX_ENOMEM;
    a->source = src;
    if (tok) {
        size_t n = strlen(tok);
        if (n > CX_AUTH_TOKEN_MAX) {
            cx_error("auth: token (%s) is longer than %d bytes", src, CX_AUTH_TOKEN_MAX);
            cx_auth_free(a);
            return CX_EINVAL;
        }
        memcpy(a->key, tok, n);
        a->key_len = n;
    } else if (read_token_file(file, a)) {
        cx_auth_free(a);
        return CX_EINVAL;
    }
    if (a->key_len == 0) {
        /* An empty token would "authenticate" anyone who also forgot to set one. */
        cx_error("auth: the token (%s) is empty", src);
        cx_auth_free(a);
        return CX_EINVAL;
    }
    if (a->key_len < 16)
        cx_warn("auth: the token (%s) is only %zu bytes; use 32 random bytes (e.g. `openssl rand -hex 32`), "
                "a short one can be guessed offline from one recorded handshake",
                src, a->key_len);
    cx_info("auth: control connections require the shared token (from %s)", src);
    *out = a;
    return CX_OK;
}

void cx_auth_free(cx_auth_t *a)
{
    if (!a) return;
    explicit_bzero(a, sizeof *a);
    free(a);
}

/* ---------------------------------------------------------------- wire */

void cx_auth_frame_put(uint8_t buf[CX_AUTH_BODY], const cx_auth_frame_t *f)
{
    cx_wr_t w;
    cx_wr_init(&w, buf, CX_AUTH_BODY);
    cx_wr_u32(&w, CX_AUTH_MAGIC);
    cx_wr_u8(&w, f->step);
    cx_wr_bytes(&w, f->data, sizeof f->data);
}

int cx_auth_frame_get(const uint8_t *body, size_t len, cx_auth_frame_t *f)
{
    cx_rd_t r;
    cx_rd_init(&r, body, len);
    uint32_t magic = cx_rd_u32(&r);
    f->step = cx_rd_u8(&r);
    const uint8_t *d = cx_rd_bytes(&r, sizeof f->data);
    if (!cx_rd_done(&r) || magic != CX_AUTH_MAGIC || f->step < 1 || f->step > 4) {
        memset(f, 0, sizeof *f);
        return CX_EINVAL;
    }
    memcpy(f->data, d, sizeof f->data);
    return CX_OK;
}

/* ---------------------------------------------------------------- proofs */

int cx_auth_proof(const cx_auth_t *a, uint8_t role, const uint8_t *nonce_d, const uint8_t *nonce_a,
                  uint8_t out[CX_AUTH_MAC])
{
    uint8_t msg[sizeof cx_auth_label - 1 + 1 + 2 * CX_AUTH_NONCE];
    size_t n = 0;
    memcpy(msg, cx_auth_label, sizeof cx_auth_label - 1);
    n += sizeof cx_auth_label - 1;
    msg[n++] = role;
    memcpy(msg + n, nonce_d, CX_AUTH_NONCE);
    n += CX_AUTH_NONCE;
    memcpy(msg + n, nonce_a, CX_AUTH_NONCE);
    n += CX_AUTH_NONCE;
    if (cx_hmac_sha256(a->key, a->key_len, msg, n, out)) {
        cx_error("auth: HMAC-SHA256 failed (libcrypto)");
        return CX_ERR;
    }
    return CX_OK;
}

int cx_auth_proof_ok(const cx_auth_t *a, uint8_t role, const uint8_t *nonce_d, const uint8_t *nonce_a,
                     const uint8_t *proof)
{
    uint8_t want[CX_AUTH_MAC];
    if (cx_auth_proof(a, role, nonce_d, nonce_a, want)) return 0;
    uint8_t diff = 0; /* constant time: every byte is compared */
    for (int i = 0; i < CX_AUTH_MAC; i++) diff |= (uint8_t)(want[i] ^ proof[i]);
    int ok = diff == 0;
    explicit_bzero(want, sizeof want);
    return ok;
}

/* ---------------------------------------------------------------- exchange */

static int fresh_nonce(uint8_t *n)
{
    size_t got = 0;
    while (got < CX_AUTH_NONCE) {
        ssize_t r = getrandom(n + got, CX_AUTH_NONCE - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            cx_error("auth: getrandom: %s", strerror(errno));
            return CX_ERR;
        }
        got += (size_t)r;
    }
    return CX_OK;
}

static void send_step(cx_engine_t *e, cx_conn_t *c, uint8_t step, const uint8_t *data)
{
    cx_auth_frame_t f;
    uint8_t body[CX_AUTH_BODY];
    f.step = step;
    memcpy(f.data, data, sizeof f.data);
    cx_auth_frame_put(body, &f);
    cx_conn_send(e, c, CX_CTL_AUTH, body, sizeof body);
    c->au.step = step;
}

int cx_auth_dial_start(cx_engine_t *e, cx_conn_t *c)
{
    memset(&c->au, 0, sizeof c->au);
    if (fresh_nonce(c->au.nonce_d)) return CX_ERR;
    send_step(e, c, 1, c->au.nonce_d);
    return CX_OK;
}

/* One of our own outgoing connections sent this nonce: someone is reflecting our challenge. */
static int own_dial_nonce(cx_engine_t *e, const uint8_t *nonce)
{
    for (cx_conn_t *o = e->conns; o; o = o->next)
        if (o->outgoing && o->au.step && !memcmp(o->au.nonce_d, nonce, CX_AUTH_NONCE)) return 1;
    return 0;
}

int cx_auth_on_frame(cx_engine_t *e, cx_conn_t *c, const uint8_t *body, size_t len, char *why, size_t whylen)
{
    cx_auth_frame_t f;
    if (!e->auth) {
        snprintf(why, whylen, "authentication requested, but no token is configured here");
        return CX_EAUTH;
    }
    if (cx_auth_frame_get(body, len, &f)) {
        snprintf(why, whylen, "malformed AUTH frame (%zu bytes)", len);
        return CX_EAUTH;
    }
    cx_auth_conn_t *au = &c->au;
    if (au->ok) {
        snprintf(why, whylen, "AUTH frame after authentication finished");
        return CX_EAUTH;
    }
    uint8_t proof[CX_AUTH_MAC];
    if (!c->outgoing) {
        if (au->step == 0 && f.step == 1) {
            if (own_dial_nonce(e, f.data)) {
                snprintf(why, whylen, "the dialler echoed one of our own nonces (reflection)");
                return CX_EAUTH;
            }
            memcpy(au->nonce_d, f.data, CX_AUTH_NONCE);
            if (fresh_nonce(au->nonce_a)) {
                snprintf(why, whylen, "no random nonce");
                return CX_EAUTH;
            }
            send_step(e, c, 2, au->nonce_a);
            return CX_AUTH_CONTINUE;
        }
        if (au->step == 2 && f.step == 3) {
            if (!cx_auth_proof_ok(e->auth, 'D', au->nonce_d, au->nonce_a, f.data)) {
                snprintf(why, whylen, "wrong token (the dialler's proof does not verify)");
                return CX_EAUTH;
            }
            if (cx_auth_proof(e->auth, 'A', au->nonce_d, au->nonce_a, proof)) {
                snprintf(why, whylen, "HMAC failed here");
                return CX_EAUTH;
            }
            send_step(e, c, 4, proof);
            au->ok = 1;
            return CX_AUTH_CONTINUE;
        }
    } else {
        if (au->step == 1 && f.step == 2) {
            memcpy(au->nonce_a, f.data, CX_AUTH_NONCE);
            if (cx_auth_proof(e->auth, 'D', au->nonce_d, au->nonce_a, proof)) {
                snprintf(why, whylen, "HMAC failed here");
                return CX_EAUTH;
            }
            send_step(e, c, 3, proof);
            return CX_AUTH_CONTINUE;
        }
        if (au->step == 3 && f.step == 4) {
            if (!cx_auth_proof_ok(e->auth, 'A', au->nonce_d, au->nonce_a, f.data)) {
                snprintf(why, whylen, "wrong token (the acceptor's proof does not verify)");
                return CX_EAUTH;
            }
            au->ok = 1;
            au->step = 4;
            return CX_AUTH_SEND_HELLO;
        }
    }
    snprintf(why, whylen, "AUTH step %u out of order (after step %u)", f.step, au->step);
    return CX_EAUTH;
}

void cx_auth_peer_name(int fd, char *buf, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host);
            port = ntohs(s4->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
            port = ntohs(s6->sin6_port);
        }
    }
    snprintf(buf, n, "%s:%u", host, port);
}
