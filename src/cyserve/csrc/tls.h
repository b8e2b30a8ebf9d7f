/* tls.h: the TLS transport: connections whose bytes go through OpenSSL 3 (csrc/tls.c has the
 * design: where the handshake runs, how records are written, the sendfile fallback).
 *
 * Internal to the engine; error convention 0 or -errno (the context's constructor also fills a
 * message for a person). */
#ifndef CYSERVE_TLS_H
#define CYSERVE_TLS_H

#include <stddef.h>
#include <sys/types.h>

struct conn;
struct conn_transport;

/* The seconds a session ticket key is used for, when the options do not say. */
#define TLS_TICKET_PERIOD_DEFAULT 3600u

/* One more name served with a certificate of its own (SNI). */
struct tls_sni_option {
    const char *name;     /* "example.org", or "*.example.org" (one label in front) */
    const char *certfile; /* PEM: the certificate, then its chain */
    const char *keyfile;  /* PEM private key; not given: it is in certfile */
};

/* What a server's TLS context is made of. Strings are NUL-ended and only read during
 * tls_ctx_new() / tls_ctx_reload(); NULL (or "") means not given. */
struct tls_options {
    const char *certfile; /* PEM: the certificate, then its chain (required) */
    const char *keyfile;  /* PEM private key; not given: it is in certfile */
    const char *password; /* of an encrypted keyfile; never prompted for on a terminal */
    const char *ciphers;  /* OpenSSL cipher list for TLS 1.2 ("ECDHE+AESGCM:..."); not given:
                           * OpenSSL's defaults. TLS 1.3 keeps its own suites. */
    const char *ca_certs; /* PEM: the CAs client certificates are verified against */
    int cert_reqs;        /* client certificates: 0 not asked for, 1 optional (verified when
                           * sent), 2 required (Python's ssl.CERT_NONE/OPTIONAL/REQUIRED) */
    int http2;            /* 1: ALPN offers h2 before http/1.1; 0: http/1.1 only; 2: h2 only
                           * (a client offering other protocols only gets a fatal alert) */
    const struct tls_sni_option *sni; /* nsni more names, each with its certificate; a client
                                       * that names none of them (or no name) gets certfile's.
                                       * The password, CAs and ciphers are the same for all. */
    size_t nsni;
    const char *ocsp_file;    /* DER OCSP response stapled for certfile's certificate when the
                               * client asks (status_request) */
    unsigned ticket_period_s; /* session ticket keys change every this many seconds (0: the
                               * default); a ticket is accepted for two periods */
};

/* One server's TLS state: the OpenSSL context (certificate, key, protocol versions 1.2 and 1.3,
 * the server's cipher preference, ALPN "h2" and "http/1.1", session tickets) shared by its connections. */
struct tls_ctx;

/* Make a context from o. 0 and *out set, or -errno with a one-line message in err (naming the
 * file that could not be used and why: "cannot load the private key from 'k.pem': bad decrypt
 * (wrong password?)"). Any thread; the caller frees it with tls_ctx_free after the server that
 * uses it is freed. */
int tls_ctx_new(const struct tls_options *o, struct tls_ctx **out, char *err, size_t errlen);

/* Load the files of o again (o's http2 and ticket period are ignored: t keeps its own) and make
 * them what new handshakes use; connections already made keep the certificate they have. 0, or
 * -errno with the one-line message in err and t unchanged (the old certificates go on). Any
 * thread, while connections are served. */
int tls_ctx_reload(struct tls_ctx *t, const struct tls_options *o, char *err, size_t errlen);

/* Move the session ticket keys on by one period now, as the clock does every ticket_period_s
 * (tickets of the period before still resume). Any thread. */
void tls_ctx_rotate_ticket_keys(struct tls_ctx *t);

/* Free a context no connection uses any more. NULL is allowed. */
void tls_ctx_free(struct tls_ctx *t);

/* 1 when this process's connections use kernel TLS where they can (the kernel attaches the
 * `tls` ULP, probed on a loopback socket when the first context is made, and OpenSSL was built
 * with it): files are then sent with SSL_sendfile; 0: a read-and-encrypt loop sends them. */
int tls_kernel_tls(void);

/* What a handler may know of its connection's TLS session (tls_conn_info). The strings are
 * OpenSSL's or the session's, valid while the connection lives. */
struct tls_info {
    int version;              /* on the wire: 0x0303 TLS 1.2, 0x0304 TLS 1.3 */
    const char *version_name; /* "TLSv1.3" */
    int cipher;               /* the IANA number of the cipher suite (0x1301) */
    const char *cipher_name;  /* OpenSSL's name of it ("TLS_AES_128_GCM_SHA256") */
    int peer_cert;            /* 1: the client sent a certificate */
    long verify;              /* its verification: 0 (X509_V_OK) or OpenSSL's error number */
    const char *verify_text;  /* the error in words, NULL when it verified */
    const char *server_name;  /* the name the client asked for (SNI), or NULL */
};

/* Fill out for connection c. 0, or -ENOTCONN when c is not a TLS connection past its handshake.
 * Only reads what the handshake fixed, so the thread serving one of c's requests may call it
 * while c's coroutine reads or writes. */
int tls_conn_info(const struct conn *c, struct tls_info *out);

/* What tls_conn_text writes. */
#define TLS_TEXT_SERVER_CERT 0 /* the certificate the server sent, PEM */
#define TLS_TEXT_PEER_CHAIN 1  /* the client's certificate and the chain it sent, PEM, in order */
#define TLS_TEXT_PEER_NAME 2   /* the client certificate's subject, RFC 4514 string */

/* One text about c's session in a malloc'd NUL-ended buffer (the caller frees it), its length in
 * *len. 0, -ENOENT (no such certificate), -ENOTCONN (as tls_conn_info) or -ENOMEM. The same
 * threads as tls_conn_info. */
int tls_conn_text(const struct conn *c, int what, char **out, size_t *len);

/* The transport of TLS connections (server_config.transport, with the struct tls_ctx as its
 * transport_ctx). Its calls follow struct conn_transport's contract (conn.h); the first recv
 * makes the handshake, waiting in the connection's coroutine. */
extern const struct conn_transport tls_transport;

/* One read of c's application bytes (c past its handshake) without waiting, by a thread other
 * than c's coroutine while that coroutine waits for it (a handler's call reading a streamed
 * request body, body.c): bytes read (> 0), 0 when the client closed the session, -EAGAIN when
 * OpenSSL must wait for the socket (*events: POLLIN, or POLLOUT when a read has to write, as a
 * key update's answer may), or -errno. Never both threads at once: an SSL session is not safe
 * to share. */
ssize_t tls_recv_nowait(struct conn *c, void *buf, size_t len, short *events);

/* Whether the first bytes a client sent (n >= 1 of them at b) look like a plaintext HTTP
 * request rather than a TLS record: an upper-case method's first letter. Pure. */
int tls_looks_like_http(const char *b, size_t n);

#endif
