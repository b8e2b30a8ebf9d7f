/* tls.c: the TLS transport, on the system's OpenSSL 3.
 *
 * A TLS connection is an ordinary struct conn whose c->tp is tls_transport and whose c->tp_data
 * is its SSL session, made on the socket itself (SSL_set_fd: OpenSSL's socket BIO reads and
 * writes the non-blocking fd, so no memory BIO copies the ciphertext once more). The protocol
 * above (HTTP/1, http1.c, or HTTP/2, http2.c) reads and writes through conn_read_once / conn_sendv /
 * conn_sendfile as over plain sockets; it never learns that TLS is there. The inline path is
 * for plain connections only (http1_inline.c checks c->tp): a TLS connection is always served
 * by its coroutine.
 *
 * The handshake runs in the connection's coroutine, before any protocol reads: the readiness of
 * the client's first bytes spawns the coroutine as for a plain connection, whose first step is
 * the transport's handshake (tls_start, conn_transport.handshake; tls_recv makes it too, should
 * a protocol read first), so that ALPN's choice (h2 or http/1.1) is known before HTTP/1 or
 * HTTP/2 reads a byte. It drives SSL_do_handshake, mapping SSL_ERROR_WANT_READ / WANT_WRITE to sched_io_wait on the
 * socket for EPOLLIN / EPOLLOUT, as the plain transport's -EAGAIN is mapped by conn.c. So a
 * worker never blocks on a handshake: a coroutine waiting for the client's next flight holds a
 * stack, not a thread. The whole handshake must end within header_timeout of its first byte (a
 * client that stalls in it is closed, as one that stalls in a request head gets 408; before its
 * first byte, the connection is idle under keepalive_timeout like any other). Before the
 * handshake, one peek at the first bytes tells a TLS record (0x16, a handshake) from a client
 * that speaks plain HTTP to the TLS port: that one is answered, in plain text, with a 400 that
 * says so (as nginx does), and closed; other garbage is closed at once.
 *
 * Reads. tls_recv reads records until the caller's space is full or OpenSSL reports
 * WANT_READ, that is until the socket itself said EAGAIN. So a short read means what it means
 * for a plain socket (nothing more to read until the next readiness), which conn.c's `drained`
 * and the edge-triggered epoll rely on: a request whose record arrived in the same segment as
 * the previous one is not left in OpenSSL's buffers while the connection goes idle. The cost is
 * one more recv (EAGAIN) per request than the plain path's short read.
 *
 * Writes. A response is written with as few SSL_write calls as possible: when the HTTP layer
 * hands over several pieces (head, body), those that fit one TLS record (16 KiB) are gathered
 * into a per-thread buffer and written with one SSL_write, so a small response is one record and
 * one write(2), as over plain TCP (one copy into the gather buffer; OpenSSL encrypts from there
 * into its record buffer, which it must do anyway). A piece of 16 KiB or more is handed to
 * SSL_write where it lies, without a copy of ours. SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER lets a
 * write that OpenSSL could not finish (WANT_WRITE, mapped to -EAGAIN) be retried from another
 * address: conn_sendv retries with the same pieces, and the gathering is the same again, so the
 * retry passes the same bytes OpenSSL expects. SSL_write writes one record per write(2) (MSG_MORE
 * has no use here: each record is whole).
 *
 * Files. There is no sendfile over TLS without kernel TLS, and this kernel offers no `tls` ULP, so
 * tls_sendfile is a bounded read-and-encrypt loop: each call preads at most TLS_FILE_CHUNK bytes
 * into a per-thread buffer and writes them with one SSL_write. The memory is bounded (one chunk
 * per thread, whatever the file's size), and a retry after WANT_WRITE reads the same range again
 * (the offset only advances once OpenSSL took the chunk). kTLS (SSL_sendfile) is not used.
 *
 * Thread-local buffers. A coroutine may move between threads at any scheduler call, so the
 * buffers are only used within one transport call, which never waits while it holds one.
 *
 * Errors. OpenSSL's error queue is per thread; every path that saw an error clears it, so that a
 * later call on this thread (another connection's) reads its own. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "conn.h"

/* One TLS record's plaintext at most: what one SSL_write of gathered pieces covers. */
#define TLS_GATHER 16384
/* A file is read and encrypted this much at a time (four records per call). */
#define TLS_FILE_CHUNK 65536
/* After the plaintext 400: how long the client's request is read and dropped before close. */
#define TLS_REJECT_LINGER_NS (200ull * 1000 * 1000)

struct tls_ctx {
    SSL_CTX *ssl;
    int http2; /* ALPN offers h2 */
};

static __thread char tls_gather_buf[TLS_GATHER];
static __thread char tls_file_buf[TLS_FILE_CHUNK];

/* ALPN: the protocols offered, in wire format (length-prefixed), in the server's order of
 * preference: h2 first when HTTP/2 is on (the first of them, without h2, when it is off). */
static const unsigned char tls_alpn_protos[] = "\x02h2\x08http/1.1";
#define TLS_ALPN_H2_LEN 3

int tls_looks_like_http(const char *b, size_t n)
{
    /* Every method HTTP/1 knows starts with an upper-case letter; a TLS record starts with its
     * content type (0x14..0x18), an SSLv2 hello with a byte of 0x80 or more. */
    return n >= 1 && b[0] >= 'A' && b[0] <= 'Z';
}

/* ---- the context ---- */

/* The key's password, given to OpenSSL's PEM reader. Without a password it returns 0, so an
 * encrypted key fails to load instead of OpenSSL prompting on the terminal. */
static int tls_password_cb(char *buf, int size, int rwflag, void *ud)
{
    const char *pw = ud;
    if (!pw)
        return 0;
    size_t n = strlen(pw);
    if (n > (size_t)size)
        return 0;
    memcpy(buf, pw, n);
    return (int)n;
}

static int tls_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                           const unsigned char *in, unsigned int inlen, void *ud)
{
    const struct tls_ctx *t = ud;
    const unsigned char *ours = t->http2 ? tls_alpn_protos : tls_alpn_protos + TLS_ALPN_H2_LEN;
    unsigned ours_len = sizeof(tls_alpn_protos) - 1 - (t->http2 ? 0 : TLS_ALPN_H2_LEN);
    unsigned char *sel;
    unsigned char sel_len;
    if (SSL_select_next_proto(&sel, &sel_len, ours, ours_len, in, inlen) != OPENSSL_NPN_NEGOTIATED)
        /* The client offers no protocol we speak: go on without ALPN (the client decides),
         * rather than fail the handshake. */
        return SSL_TLSEXT_ERR_NOACK;
    *out = sel;
    *outlen = sel_len;
    return SSL_TLSEXT_ERR_OK;
}

/* err = "<what> '<file>': <OpenSSL's reason>", the error queue cleared. The queue holds the
 * cause first and the layers that passed it on after it ("PEM lib", "system lib"): the first
 * entry with a reason is the one a person can act on. */
static void tls_error(char *err, size_t errlen, const char *what, const char *file, int have_pw)
{
    int sys = errno;
    char why[160] = "";
    int wrong_password = 0, no_password = 0, not_pem = 0;
    unsigned long e;
    while ((e = ERR_get_error()) != 0) {
        /* A system error (the file cannot be opened) carries errno as its reason. */
        const char *reason = ERR_SYSTEM_ERROR(e) ? strerror(ERR_GET_REASON(e))
                                                 : ERR_reason_error_string(e);
        if (!reason)
            continue;
        if (!why[0])
            snprintf(why, sizeof(why), "%s", reason);
        if (strstr(reason, "bad decrypt"))
            wrong_password = 1;
        if (strstr(reason, "bad password read") || strstr(reason, "interrupted or cancelled"))
            no_password = 1;
        if (strstr(reason, "no start line"))
            not_pem = 1;
    }
    if (!why[0])
        snprintf(why, sizeof(why), "%s", sys ? strerror(sys) : "unknown error");
    /* How a password problem shows: say what it most likely is. */
    if (wrong_password && !have_pw)
        no_password = 1;
    const char *hint = no_password      ? " (the key is encrypted: its password is needed)"
                       : wrong_password ? " (wrong password?)"
                       : not_pem        ? " (not a PEM file)"
                                        : "";
    if (file)
        snprintf(err, errlen, "%s '%s': %s%s", what, file, why, hint);
    else
        snprintf(err, errlen, "%s: %s%s", what, why, hint);
}

int tls_ctx_new(const struct tls_options *o, struct tls_ctx **out, char *err, size_t errlen)
{
    const char *cert = o->certfile && *o->certfile ? o->certfile : NULL;
    const char *key = o->keyfile && *o->keyfile ? o->keyfile : cert;
    const char *pw = o->password && *o->password ? o->password : NULL;
    if (!cert) {
        snprintf(err, errlen, "a certificate file is required for TLS");
        return -EINVAL;
    }
    ERR_clear_error();
    struct tls_ctx *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_error(err, errlen, "cannot create the TLS context", NULL, 0);
        free(t);
        return -ENOMEM;
    }
    t->ssl = ctx;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* The server's cipher order wins; a peer that leaves without close_notify is an ordinary
     * end of stream for HTTP/1 (its framing tells truncation), not an error; no renegotiation
     * (a client could make the server redo handshakes at will). */
    SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF |
                                 SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    /* Moving write buffer: see "Writes" above. Release buffers: an idle keep-alive connection
     * keeps no 16 KiB read and write buffers, only its session. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    /* Session resumption: tickets (OpenSSL's default, keys made per context) and the session
     * cache, with an id context so that resumed sessions are accepted. */
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"cyserve", 7);
    SSL_CTX_set_default_passwd_cb(ctx, tls_password_cb);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *)pw);
    int rc = -EINVAL;
    errno = 0;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        tls_error(err, errlen, "cannot load the certificate from", cert, pw != NULL);
        goto fail;
    }
    errno = 0;
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        tls_error(err, errlen, "cannot load the private key from", key, pw != NULL);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "the private key in '%s' does not match the certificate in '%s'", key,
                 cert);
        goto fail;
    }
    /* The password is not needed after loading, and the caller's string is not kept. */
    SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
    if (o->ciphers && *o->ciphers && SSL_CTX_set_cipher_list(ctx, o->ciphers) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "no usable cipher in the cipher list '%s'", o->ciphers);
        goto fail;
    }
    const char *ca = o->ca_certs && *o->ca_certs ? o->ca_certs : NULL;
    if (o->cert_reqs < 0 || o->cert_reqs > 2) {
        snprintf(err, errlen,
                 "the client certificate mode must be 0 (none), 1 (optional) or 2 "
                 "(required), not %d",
                 o->cert_reqs);
        goto fail;
    }
    if (o->cert_reqs && !ca) {
        snprintf(err, errlen, "client certificates need the CA certificates to verify them");
        goto fail;
    }
    if (ca) {
        errno = 0;
        if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
            tls_error(err, errlen, "cannot load the CA certificates from", ca, 0);
            goto fail;
        }
        /* The CAs are named in the CertificateRequest, so that a client picks a matching
         * certificate. */
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
        ERR_clear_error();
    }
    if (o->cert_reqs)
        SSL_CTX_set_verify(
            ctx, SSL_VERIFY_PEER | (o->cert_reqs == 2 ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
    t->http2 = o->http2;
    SSL_CTX_set_alpn_select_cb(ctx, tls_alpn_select, t);
    *out = t;
    return 0;
fail:
    SSL_CTX_free(ctx);
    free(t);
    return rc;
}

void tls_ctx_free(struct tls_ctx *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ssl);
    free(t);
}

/* ---- the handshake ---- */

/* The client sent plain HTTP to the TLS port: answer 400 in plain text, as nginx does, then read
 * and drop what it sends for a moment so that the close does not reset the answer away.
 * Returns -EPROTO (the connection is to be closed). */
static ssize_t tls_reject_plain(struct conn *c)
{
    static const char answer[] = "HTTP/1.1 400 Bad Request\r\n"
                                 "Content-Type: text/plain; charset=utf-8\r\n"
                                 "Content-Length: 48\r\n"
                                 "Connection: close\r\n"
                                 "\r\n"
                                 "The plain HTTP request was sent to a TLS port.\r\n";
    int fd = c->io.fd;
    if (send(fd, answer, sizeof(answer) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        return -EPROTO;
    shutdown(fd, SHUT_WR);
    int64_t deadline = conn_deadline_after(TLS_REJECT_LINGER_NS);
    char sink[1024];
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN && sched_io_wait(&c->io, EPOLLIN | EPOLLRDHUP, deadline) > 0)
            continue;
        break;
    }
    return -EPROTO;
}

/* Make the session and the handshake, waiting in the coroutine. 1 when done, 0 when the client
 * left before it, or -errno (-ETIMEDOUT past header_timeout, -EPROTO for a failed handshake or a
 * client that does not speak TLS, -ECANCELED). */
static ssize_t tls_handshake(struct conn *c)
{
    struct server *s = c->home->srv;
    int64_t deadline = conn_deadline_after(s->cfg.header_timeout_ns);
    SSL *ssl = c->tp_data;
    if (!ssl) {
        char b[4];
        for (;;) {
            ssize_t n = recv(c->io.fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT);
            if (n > 0) {
                if (b[0] == 0x16)
                    break;
                if (tls_looks_like_http(b, (size_t)n))
                    return tls_reject_plain(c);
                return -EPROTO;
            }
            if (n == 0)
                return 0;
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                return -errno;
            int rc = sched_io_wait(&c->io, EPOLLIN | EPOLLRDHUP, deadline);
            if (rc < 0)
                return rc;
        }
        struct tls_ctx *t = s->cfg.transport_ctx;
        ssl = SSL_new(t->ssl);
        if (!ssl) {
            ERR_clear_error();
            return -ENOMEM;
        }
        if (SSL_set_fd(ssl, c->io.fd) != 1) {
            ERR_clear_error();
            SSL_free(ssl);
            return -ENOMEM;
        }
        SSL_set_accept_state(ssl);
        c->tp_data = ssl;
    }
    for (;;) {
        /* Each SSL call starts with an empty error queue: SSL_get_error reads it, and anything
         * left on this thread by other code (a Python extension using libcrypto runs on the
         * same threads) would make a healthy connection look failed. */
        ERR_clear_error();
        int r = SSL_do_handshake(ssl);
        if (r == 1)
            return 1;
        uint32_t ev;
        switch (SSL_get_error(ssl, r)) {
        case SSL_ERROR_WANT_READ:
            ev = EPOLLIN | EPOLLRDHUP;
            break;
        case SSL_ERROR_WANT_WRITE:
            ev = EPOLLOUT;
            break;
        case SSL_ERROR_ZERO_RETURN:
            ERR_clear_error();
            return 0;
        default:
            ERR_clear_error();
            return -EPROTO;
        }
        int rc = sched_io_wait(&c->io, ev, deadline);
        if (rc < 0)
            return rc;
    }
}

/* ---- the transport ---- */

/* What SSL_get_error says after a failed read or write, as this file's callers need it: -EAGAIN
 * (WANT_READ for reads, WANT_WRITE for writes: the caller waits), 1 (the other direction is
 * wanted: wait for it here), 0 (the peer closed the session), or -EPROTO / -errno. */
static int tls_failure(struct conn *c, int ret, int reading)
{
    int e = SSL_get_error(c->tp_data, ret);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        return reading ? -EAGAIN : 1;
    case SSL_ERROR_WANT_WRITE:
        return reading ? 1 : -EAGAIN;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL: {
        int err = errno;
        ERR_clear_error();
        return err ? -err : -EPIPE;
    }
    default:
        ERR_clear_error();
        return -EPROTO;
    }
}

/* OpenSSL wants the other direction (a key update during a read, a session ticket's write
 * during a write): wait for it within body_timeout. 0 or -errno. */
static int tls_wait_other(struct conn *c, int reading)
{
    int rc = sched_io_wait(&c->io, reading ? EPOLLOUT : (EPOLLIN | EPOLLRDHUP),
                           conn_deadline_after(c->home->srv->cfg.body_timeout_ns));
    return rc < 0 ? rc : 0;
}

static ssize_t tls_recv(struct conn *c, void *buf, size_t len)
{
    SSL *ssl = c->tp_data;
    if (UNLIKELY(!ssl || !SSL_is_init_finished(ssl))) {
        ssize_t rc = tls_handshake(c);
        if (rc <= 0)
            return rc;
        ssl = c->tp_data;
    }
    size_t got = 0;
    while (got < len) {
        size_t n;
        ERR_clear_error(); /* see tls_handshake */
        int r = SSL_read_ex(ssl, (char *)buf + got, len - got, &n);
        if (LIKELY(r == 1)) {
            got += n;
            continue;
        }
        int f = tls_failure(c, r, 1);
        if (f == 1) {
            if (got)
                break;
            int rc = tls_wait_other(c, 1);
            if (rc < 0)
                return rc;
            continue;
        }
        if (got)
            break; /* the bytes first; the end or the error shows again on the next call */
        return f;
    }
    return (ssize_t)got;
}

/* One SSL_write of n bytes at p: bytes written, or -errno / -EAGAIN. */
static ssize_t tls_write(struct conn *c, const void *p, size_t n)
{
    for (;;) {
        size_t w;
        ERR_clear_error(); /* see tls_handshake */
        int r = SSL_write_ex(c->tp_data, p, n, &w);
        if (LIKELY(r == 1))
            return (ssize_t)w;
        int f = tls_failure(c, r, 0);
        if (f == 1) {
            int rc = tls_wait_other(c, 0);
            if (rc < 0)
                return rc;
            continue;
        }
        return f == 0 ? -EPIPE : f;
    }
}

static ssize_t tls_sendv(struct conn *c, struct iovec *iov, int cnt, int flags)
{
    if (UNLIKELY(!c->tp_data))
        return -ENOTCONN;
    if (cnt == 1 || iov[0].iov_len >= TLS_GATHER)
        return tls_write(c, iov[0].iov_base, iov[0].iov_len);
    /* Gather the leading pieces into one record's worth. The same iovecs give the same bytes, so
     * a retry after -EAGAIN writes what OpenSSL expects (see "Writes"). */
    char *g = tls_gather_buf;
    size_t used = 0;
    for (int i = 0; i < cnt && used < TLS_GATHER; i++) {
        size_t take = iov[i].iov_len;
        if (take > TLS_GATHER - used)
            take = TLS_GATHER - used;
        memcpy(g + used, iov[i].iov_base, take);
        used += take;
    }
    return tls_write(c, g, used);
}

static ssize_t tls_sendfile(struct conn *c, int fd, off_t *off, size_t count)
{
    if (UNLIKELY(!c->tp_data))
        return -ENOTCONN;
    size_t want = count < TLS_FILE_CHUNK ? count : TLS_FILE_CHUNK;
    char *b = tls_file_buf;
    ssize_t got;
    do
        got = pread(fd, b, want, *off);
    while (got < 0 && errno == EINTR);
    if (got <= 0)
        return got < 0 ? -errno : 0; /* 0: the file shrank (conn_sendfile says -EIO) */
    ssize_t n = tls_write(c, b, (size_t)got);
    if (n > 0)
        *off += n;
    return n;
}

static int tls_shutdown(struct conn *c, int how)
{
    SSL *ssl = c->tp_data;
    if (ssl && SSL_is_init_finished(ssl) && (how == SHUT_WR || how == SHUT_RDWR)) {
        /* close_notify, once, without waiting for the client's: it goes out before the FIN. */
        ERR_clear_error();
        if (SSL_shutdown(ssl) < 0)
            ERR_clear_error();
    }
    return shutdown(c->io.fd, how) < 0 ? -errno : 0;
}

/* conn_transport.handshake: the handshake, then what ALPN chose. */
static int tls_start(struct conn *c)
{
    SSL *ssl = c->tp_data;
    if (!ssl || !SSL_is_init_finished(ssl)) {
        ssize_t rc = tls_handshake(c);
        if (rc <= 0)
            return (int)rc;
        ssl = c->tp_data;
    }
    const unsigned char *p;
    unsigned len;
    SSL_get0_alpn_selected(ssl, &p, &len);
    return len == 2 && memcmp(p, "h2", 2) == 0 ? CONN_ALPN_H2 : CONN_ALPN_HTTP1;
}

static void tls_close(struct conn *c)
{
    SSL *ssl = c->tp_data;
    /* Every close after a finished handshake says close_notify first (once; never waiting
     * for the client's): without it a client cannot tell our close from a truncation by
     * someone on the path, which matters for a body that ends at the close (HTTP/1.0 without a
     * length), and strict OpenSSL 3 clients report "unexpected eof". A socket that cannot
     * take the record now (full, or reset) just goes without it. */
    if (ssl && SSL_is_init_finished(ssl) && !(SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN)) {
        ERR_clear_error();
        if (SSL_shutdown(ssl) < 0)
            ERR_clear_error();
    }
    SSL_free(c->tp_data);
    c->tp_data = NULL;
}

const struct conn_transport tls_transport = {tls_recv,     tls_sendv, tls_sendfile,
                                             tls_shutdown, tls_close, tls_start};
