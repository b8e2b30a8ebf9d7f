/* tls.h: the TLS transport: connections whose bytes go through OpenSSL 3 (csrc/tls.c has the
 * design: where the handshake runs, how records are written, the sendfile fallback).
 *
 * Internal to the engine; error convention 0 or -errno (the context's constructor also fills a
 * message for a person). */
#ifndef CYSERVE_TLS_H
#define CYSERVE_TLS_H

#include <stddef.h>

struct conn_transport;

/* What a server's TLS context is made of. Strings are NUL-ended and only read during
 * tls_ctx_new(); NULL (or "") means not given. */
struct tls_options {
    const char *certfile; /* PEM: the certificate, then its chain (required) */
    const char *keyfile;  /* PEM private key; not given: it is in certfile */
    const char *password; /* of an encrypted keyfile; never prompted for on a terminal */
    const char *ciphers;  /* OpenSSL cipher list for TLS 1.2 ("ECDHE+AESGCM:..."); not given:
                           * OpenSSL's defaults. TLS 1.3 keeps its own suites. */
    const char *ca_certs; /* PEM: the CAs client certificates are verified against */
    int cert_reqs;        /* client certificates: 0 not asked for, 1 optional (verified when
                           * sent), 2 required (Python's ssl.CERT_NONE/OPTIONAL/REQUIRED) */
    int http2;            /* 1: ALPN offers h2 before http/1.1; 0: http/1.1 only */
};

/* One server's TLS state: the OpenSSL context (certificate, key, protocol versions 1.2 and 1.3,
 * the server's cipher preference, ALPN "h2" and "http/1.1", session tickets) shared by its connections. */
struct tls_ctx;

/* Make a context from o. 0 and *out set, or -errno with a one-line message in err (naming the
 * file that could not be used and why: "cannot load the private key from 'k.pem': bad decrypt
 * (wrong password?)"). Any thread; the caller frees it with tls_ctx_free after the server that
 * uses it is freed. */
int tls_ctx_new(const struct tls_options *o, struct tls_ctx **out, char *err, size_t errlen);

/* Free a context no connection uses any more. NULL is allowed. */
void tls_ctx_free(struct tls_ctx *t);

/* The transport of TLS connections (server_config.transport, with the struct tls_ctx as its
 * transport_ctx). Its calls follow struct conn_transport's contract (conn.h); the first recv
 * makes the handshake, waiting in the connection's coroutine. */
extern const struct conn_transport tls_transport;

/* Whether the first bytes a client sent (n >= 1 of them at b) look like a plaintext HTTP
 * request rather than a TLS record: an upper-case method's first letter. Pure. */
int tls_looks_like_http(const char *b, size_t n);

#endif
