/* Control-channel authentication: a shared token, proven by both sides over fresh nonces.
 *
 * With a token configured, a connection starts with four AUTH frames before any HELLO:
 *   1  dialler  -> acceptor  nonce_d (32 random bytes)
 *   2  acceptor -> dialler   nonce_a (32 random bytes)
 *   3  dialler  -> acceptor  HMAC-SHA256(token, "connex-auth-v1" 'D' nonce_d nonce_a)
 *   4  acceptor -> dialler   HMAC-SHA256(token, "connex-auth-v1" 'A' nonce_d nonce_a)
 * The dialler proves first, so a scanner that connects learns nothing but a nonce; the dialler
 * sends its HELLO (regions, keys, backend addresses) only after step 4 proved the acceptor, and
 * the acceptor accepts a HELLO (and answers with its own) only on a connection that passed
 * step 3. A recorded exchange does not replay: nonce_a is fresh per connection. A frame from the
 * other side carrying one of our own dialler nonces is refused (reflection). */
#ifndef CX_AUTH_H
#define CX_AUTH_H

#include "connex/options.h"

#include <stddef.h>
#include <stdint.h>

#define CX_AUTH_MAGIC 0x3141584eu /* "NXA1" */
#define CX_AUTH_NONCE 32
#define CX_AUTH_MAC 32
#define CX_AUTH_TOKEN_MAX 1024
#define CX_AUTH_BODY 37     /* u32 magic, u8 step, 32 bytes */
#define CX_AUTH_PRE_MAX 512 /* largest frame buffered before authentication (AUTH, REFUSE) */

typedef struct cx_auth { /* the engine's token; NULL engine->auth = authentication off */
    uint8_t key[CX_AUTH_TOKEN_MAX];
    size_t key_len;
    const char *source; /* "config", "CONNEX_AUTH_TOKEN", "CONNEX_AUTH_TOKEN_FILE" */
} cx_auth_t;

typedef struct cx_auth_conn { /* per control connection */
    uint8_t step;             /* the last step sent or received */
    uint8_t ok;               /* the other side proved the token */
    uint8_t nonce_d[CX_AUTH_NONCE], nonce_a[CX_AUTH_NONCE];
} cx_auth_conn_t;

typedef struct cx_auth_frame {
    uint8_t step;                /* 1..4 */
    uint8_t data[CX_AUTH_NONCE]; /* a nonce (steps 1, 2) or a proof (steps 3, 4) */
} cx_auth_frame_t;

/* The token from cfg_token, else CONNEX_AUTH_TOKEN, else the file named by
 * CONNEX_AUTH_TOKEN_FILE, both from the options table `o`. *out is NULL when none is set
 * (authentication off). CX_EINVAL (logged) for an empty, oversized or unreadable token. */
int cx_auth_load(const cx_opts_t *o, const char *cfg_token, cx_auth_t **out);
void cx_auth_free(cx_auth_t *a);

/* Wire form of an AUTH frame body: exactly CX_AUTH_BODY bytes. get: 0 or CX_EINVAL. */
void cx_auth_frame_put(uint8_t buf[CX_AUTH_BODY], const cx_auth_frame_t *f);
int cx_auth_frame_get(const uint8_t *body, size_t len, cx_auth_frame_t *f);

/* HMAC-SHA256(token, label role nonce_d nonce_a); role 'D' (dialler) or 'A' (acceptor). */
int cx_auth_proof(const cx_auth_t *a, uint8_t role, const uint8_t *nonce_d, const uint8_t *nonce_a,
                  uint8_t out[CX_AUTH_MAC]);
/* Constant-time proof check: 1 when they match. */
int cx_auth_proof_ok(const cx_auth_t *a, uint8_t role, const uint8_t *nonce_d, const uint8_t *nonce_a,
                     const uint8_t *proof);

/* "ip:port" of the other end of a socket, for log lines. */
void cx_auth_peer_name(int fd, char *buf, size_t n);

/* Progress thread. The engine and connection types come from engine.h. */
struct cx_engine;
struct cx_conn;
/* Dialler: queue step 1 on a new outgoing connection. */
int cx_auth_dial_start(struct cx_engine *e, struct cx_conn *c);
/* One AUTH frame: CX_AUTH_CONTINUE, CX_AUTH_SEND_HELLO (dialler: the acceptor is proven, send
 * HELLO now) or CX_EAUTH with the reason in why (the caller refuses/closes, counts and logs). */
enum { CX_AUTH_CONTINUE = 0, CX_AUTH_SEND_HELLO = 1 };
int cx_auth_on_frame(struct cx_engine *e, struct cx_conn *c, const uint8_t *body, size_t len, char *why, size_t whylen);

#endif
