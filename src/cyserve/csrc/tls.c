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
 * one more recv (EAGAIN) per request than the plain path's short read. OpenSSL reads ahead
 * (SSL_CTX_set_read_ahead): one recv takes what the socket holds, several records or a record's
 * header with its body, instead of a recv for each header and each body. What it read ahead is
 * still OpenSSL's until SSL_read has returned it, and SSL_read reports WANT_READ only once it
 * needs the socket and the socket said EAGAIN: then what it holds is at most part of a record,
 * whose rest will make the socket readable again. So reading until WANT_READ still drains.
 * The recv that meets EAGAIN is spared when an earlier one already said the same: a callback on
 * the socket BIO (tls_bio_cb) notes whether OpenSSL's last recv returned fewer bytes than it
 * asked for (a TCP recv returns less only when the socket's queue is empty, as the plain
 * transport's short read), and when that recv brought the bytes just returned and OpenSSL holds
 * nothing more (SSL_has_pending), tls_recv returns short: the socket is drained, any byte that
 * arrives later makes it readable again, and the request costs the one recv that plain TCP's
 * does.
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
 * Files. Where the kernel attaches the `tls` ULP (probed once per process on a loopback socket,
 * tls_ktls_probe) and OpenSSL was built with kernel TLS, the contexts ask for it
 * (SSL_OP_ENABLE_KTLS) and a session whose sending side OpenSSL handed to the kernel sends files
 * with SSL_sendfile: no copy and no encryption in user space. Elsewhere (a kernel without the
 * module, as on the machine this was written on, or a cipher the kernel lacks) tls_sendfile is a
 * bounded read-and-encrypt loop: each call preads at most TLS_FILE_CHUNK bytes into a per-thread
 * buffer and writes them with one SSL_write. The memory is bounded (one chunk per thread,
 * whatever the file's size), and a retry after WANT_WRITE reads the same range again (the offset
 * only advances once OpenSSL took the chunk).
 *
 * Certificates. A server's struct tls_ctx holds the current "load" of its files: a default
 * SSL_CTX (its certificate) that owns a struct tls_load (the SNI names with an SSL_CTX each, and
 * the stapled OCSP response). The SNI callback moves a handshake to its name's context
 * (SSL_set_SSL_CTX); every context is made alike (tls_ctx_make), since OpenSSL then reads ALPN,
 * verification and tickets from the one chosen. tls_ctx_reload makes a new load and swaps it in
 * under a mutex that tls_session_new takes only to reference the current one: a connection
 * holds its context by reference, so a reload never touches an open connection, and the old load
 * is freed with the last connection made on it.
 *
 * Handlers. tls_conn_info and tls_conn_text read what the handshake fixed (version, cipher, the
 * certificates), from the thread serving a request while the connection's coroutine may be in
 * SSL_read: renegotiation is off and a TLS 1.3 server sends its tickets within the handshake,
 * so nothing they read changes after it.
 *
 * Thread-local buffers. A coroutine may move between threads at any scheduler call, so the
 * buffers are only used within one transport call, which never waits while it holds one.
 *
 * Errors. OpenSSL's error queue is per thread; every path that saw an error clears it, so that a
 * later call on this thread (another connection's) reads its own, and each SSL call whose failure
 * SSL_get_error reads is preceded by tls_err_reset, which empties the queue only when it holds
 * something (what other code on the thread left there). */
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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <strings.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ocsp.h>
#include <openssl/params.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "conn.h"
#include "request.h"
#include "server.h"

/* One TLS record's plaintext at most: what one SSL_write of gathered pieces covers. */
#define TLS_GATHER 16384
/* A file is read and encrypted this much at a time (four records per call). */
#define TLS_FILE_CHUNK 65536
/* After the plaintext 400: how long the client's request is read and dropped before close. */
#define TLS_REJECT_LINGER_NS (200ull * 1000 * 1000)

struct tls_ctx {
    pthread_mutex_t lock;         /* guards cur against a reload's swap */
    SSL_CTX *cur;                 /* the current load's default context (a reference of ours) */
    int http2;                    /* ALPN offers h2 */
    uint64_t ticket_period;       /* seconds per ticket key */
    _Atomic int64_t ticket_shift; /* periods added by tls_ctx_rotate_ticket_keys */
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

/* Before an SSL call whose failure SSL_get_error will read: make the thread's error queue empty,
 * so that an entry left by other code on this thread (a Python extension using libcrypto runs
 * on the same threads) does not make a healthy connection look failed. SSL_get_error only looks
 * at ERR_peek_error, so when that says 0 the queue is already as good as empty, and the peek
 * costs a small part of ERR_clear_error, which resets all sixteen slots (32 free(NULL)s, about
 * 840 instructions in OpenSSL 3.0): that was three times per keep-alive request. */
static inline void tls_err_reset(void)
{
    if (UNLIKELY(ERR_peek_error() != 0))
        ERR_clear_error();
}

/* Whether the socket BIO's last recv on this thread returned fewer bytes than OpenSSL asked for:
 * the socket's queue was empty then. tls_recv clears it before each SSL_read_ex and reads it
 * right after, on the same thread, with no wait in between (see "Reads"). */
static __thread int tls_read_short;

/* The socket BIO's callback (BIO_set_callback_ex), called around each of its operations: after a
 * read, it notes whether the read was short. It changes no result. */
static long tls_bio_cb(BIO *b, int oper, const char *argp, size_t len, int argi, long argl, int ret,
                       size_t *processed)
{
    (void)b;
    (void)argp;
    (void)argi;
    (void)argl;
    if (oper == (BIO_CB_READ | BIO_CB_RETURN))
        tls_read_short = ret > 0 && *processed < len;
    return ret;
}

/* ---- the context: callbacks and errors ---- */

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
    /* Our list: h2 then http/1.1 (auto), http/1.1 alone (HTTP/2 off), h2 alone (HTTP/2 only). */
    const unsigned char *ours = t->http2 ? tls_alpn_protos : tls_alpn_protos + TLS_ALPN_H2_LEN;
    unsigned ours_len = sizeof(tls_alpn_protos) - 1 - (t->http2 ? 0 : TLS_ALPN_H2_LEN);
    if (t->http2 == 2)
        ours_len = TLS_ALPN_H2_LEN;
    unsigned char *sel;
    unsigned char sel_len;
    if (SSL_select_next_proto(&sel, &sel_len, ours, ours_len, in, inlen) != OPENSSL_NPN_NEGOTIATED)
        /* The client offers no protocol we speak: go on without ALPN (the client decides),
         * rather than fail the handshake; except with HTTP/2 only, where a client that offers
         * protocols but not h2 cannot be served at all, and RFC 7301 3.2's no_application_protocol
         * alert (what OpenSSL sends for a fatal answer here) says so at once. */
        return t->http2 == 2 ? SSL_TLSEXT_ERR_ALERT_FATAL : SSL_TLSEXT_ERR_NOACK;
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
    int wrong_password = 0, no_password = 0, not_pem = 0, no_key = 0, mismatch = 0;
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
        /* OpenSSL 3's decoders find no key in a PEM file of other things (a certificate
         * alone: --ssl-keyfile left out with a key kept apart) and say only "unsupported". */
        if (ERR_GET_LIB(e) == ERR_LIB_OSSL_DECODER && ERR_GET_REASON(e) == ERR_R_UNSUPPORTED)
            no_key = 1;
        /* Setting a key checks it against the certificate already set. */
        if (strstr(reason, "key values mismatch"))
            mismatch = 1;
    }
    if (!why[0])
        snprintf(why, sizeof(why), "%s", sys ? strerror(sys) : "unknown error");
    /* How a password problem shows: say what it most likely is. */
    if (wrong_password && !have_pw)
        no_password = 1;
    const char *hint = no_password      ? " (the key is encrypted: its password is needed)"
                       : wrong_password ? " (wrong password?)"
                       : not_pem        ? " (not a PEM file)"
                       : mismatch       ? " (it is not the certificate's key)"
                       : no_key         ? " (no private key in it)"
                                        : "";
    if (file)
        snprintf(err, errlen, "%s '%s': %s%s", what, file, why, hint);
    else
        snprintf(err, errlen, "%s: %s%s", what, why, hint);
}

/* ---- session tickets ---- */

/* Ticket keys are not random per context but derived from one secret per process and the
 * number of the current period (the wall clock divided by the rotation period): key(e) =
 * HMAC-SHA256(secret, label || e) for its name, its AES key and its HMAC key. So rotation needs
 * no timer thread and no lock (each ticket operation computes the period it is in), the worker
 * processes a supervisor forks after it made its first context share the secret and rotate
 * together (a client resumes on whichever process accepts it), and a reload of the
 * certificates keeps the keys. A ticket made in period e is accepted in e and e + 1 (then
 * renewed with the current key), so resumption survives one rotation and no ticket lives
 * longer than two periods. */
static unsigned char tls_ticket_secret[32];
static int tls_ticket_secret_ok;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_ex_server = -1; /* every SSL_CTX of ours: its struct tls_ctx (borrowed) */
static int tls_ex_load = -1;   /* a default SSL_CTX: its struct tls_load (owned) */
static int tls_ktls_ok;        /* the kernel attaches the tls ULP (tls_ktls_probe) */

#define TLS_TK_NAME 16
#define TLS_TK_KEY 32

static void tls_ticket_derive(int64_t epoch, char label, unsigned char out[32])
{
    unsigned char msg[19 + 1 + 8];
    memcpy(msg, "cyserve ticket key ", 19);
    msg[19] = (unsigned char)label;
    for (int i = 0; i < 8; i++)
        msg[20 + i] = (unsigned char)((uint64_t)epoch >> (56 - 8 * i));
    unsigned len = 32;
    if (!HMAC(EVP_sha256(), tls_ticket_secret, sizeof(tls_ticket_secret), msg, sizeof(msg), out,
              &len))
        memset(out, 0, 32); /* never: HMAC-SHA256 of a buffer does not fail */
}

static int64_t tls_ticket_epoch(struct tls_ctx *t)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)((uint64_t)ts.tv_sec / t->ticket_period) +
           atomic_load_explicit(&t->ticket_shift, memory_order_relaxed);
}

/* One period's keys, derived once per thread: the HMACs of tls_ticket_derive cost more than
 * the rest of the ticket callback (about 10,000 instructions each, six per resumed handshake:
 * the ticket read and the new one sent), and a period lasts an hour by default. Two slots (by
 * the period's parity), since a ticket of the previous period is still read. Per thread, so no
 * lock; what they hold is no more secret than tls_ticket_secret, which the process keeps for
 * its life anyway. */
struct tls_tk {
    int64_t epoch;
    int ok;
    unsigned char name[TLS_TK_NAME], aes[TLS_TK_KEY], hmac[TLS_TK_KEY];
};
static __thread struct tls_tk tls_tk_cache[2];

static const struct tls_tk *tls_ticket_keys(int64_t epoch)
{
    struct tls_tk *k = &tls_tk_cache[epoch & 1];
    if (!k->ok || k->epoch != epoch) {
        unsigned char n[32];
        tls_ticket_derive(epoch, 'n', n);
        memcpy(k->name, n, TLS_TK_NAME);
        tls_ticket_derive(epoch, 'a', k->aes);
        tls_ticket_derive(epoch, 'h', k->hmac);
        k->epoch = epoch;
        k->ok = 1;
    }
    return k;
}

static int tls_ticket_init(EVP_MAC_CTX *hctx, const struct tls_tk *k)
{
    OSSL_PARAM params[3];
    params[0] = OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, (void *)k->hmac,
                                                  sizeof(k->hmac));
    params[1] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0);
    params[2] = OSSL_PARAM_construct_end();
    return EVP_MAC_CTX_set_params(hctx, params);
}

/* The ticket cipher, fetched once (tls_init_once): EVP_aes_256_cbc() is a name that
 * EVP_EncryptInit_ex looks up in the provider's method store at every call (about 2,600
 * instructions a ticket, two tickets a new handshake). NULL if the fetch failed: then the
 * lookup per call. Never freed: one object for the process's life. */
static EVP_CIPHER *tls_ticket_cipher;

/* Random IVs for new tickets, drawn from OpenSSL's DRBG TLS_IV_BATCH at a time per thread: one
 * RAND_bytes call costs about 6,600 instructions whatever its length up to a few KiB (the DRBG's
 * locking, reseed check and per-call setup), and each new ticket needs 16 bytes. The IVs are the
 * DRBG's bytes as before, each used once; they are public (sent in the ticket), so holding the
 * next ones in memory reveals nothing a reader of that memory could not get from the keys
 * themselves. A forked child must not reuse its parent's unused IVs under the same keys (every
 * worker process shares them), so fork bumps tls_iv_gen and a thread's batch made in another
 * generation is thrown away. */
#define TLS_IV_LEN 16
#define TLS_IV_BATCH 64
struct tls_iv_pool {
    unsigned gen;  /* tls_iv_gen when filled */
    unsigned left; /* unused IVs at the end of b */
    unsigned char b[TLS_IV_BATCH * TLS_IV_LEN];
};
static __thread struct tls_iv_pool tls_iv_pool;
static _Atomic unsigned tls_iv_gen = 1; /* 0 never: a thread's zeroed pool is stale */

static void tls_iv_atfork_child(void)
{
    atomic_fetch_add_explicit(&tls_iv_gen, 1, memory_order_relaxed);
}

/* 16 fresh random bytes at iv. 0, or -1 when the DRBG fails (then nothing is kept). */
static int tls_ticket_iv(unsigned char *iv)
{
    struct tls_iv_pool *p = &tls_iv_pool;
    unsigned gen = atomic_load_explicit(&tls_iv_gen, memory_order_relaxed);
    if (p->gen != gen || p->left == 0) {
        p->left = 0;
        if (RAND_bytes(p->b, sizeof(p->b)) != 1)
            return -1;
        p->gen = gen;
        p->left = TLS_IV_BATCH;
    }
    p->left--;
    unsigned char *src = p->b + (size_t)p->left * TLS_IV_LEN;
    memcpy(iv, src, TLS_IV_LEN);
    OPENSSL_cleanse(src, TLS_IV_LEN); /* used: never handed out twice */
    return 0;
}

/* OpenSSL's ticket key callback (SSL_CTX_set_tlsext_ticket_key_evp_cb): enc 1, choose the key
 * and IV of a new ticket (1); enc 0, find the key of the ticket named `name` (1: current, 2:
 * the previous period's, to be renewed; 0: unknown or too old, a full handshake). */
static int tls_ticket_cb(SSL *s, unsigned char *name, unsigned char *iv, EVP_CIPHER_CTX *ectx,
                         EVP_MAC_CTX *hctx, int enc)
{
    struct tls_ctx *t = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(s), tls_ex_server);
    if (!t)
        return -1;
    int64_t now = tls_ticket_epoch(t);
    if (enc) {
        const struct tls_tk *k = tls_ticket_keys(now);
        memcpy(name, k->name, TLS_TK_NAME);
        if (tls_ticket_iv(iv) != 0) /* AES-CBC's IV */
            return -1;
        const EVP_CIPHER *ciph = tls_ticket_cipher ? tls_ticket_cipher : EVP_aes_256_cbc();
        int ok = EVP_EncryptInit_ex(ectx, ciph, NULL, k->aes, iv) == 1 &&
                 tls_ticket_init(hctx, k) == 1;
        return ok ? 1 : -1;
    }
    for (int back = 0; back < 2; back++) {
        const struct tls_tk *k = tls_ticket_keys(now - back);
        if (CRYPTO_memcmp(name, k->name, TLS_TK_NAME) != 0)
            continue;
        const EVP_CIPHER *ciph = tls_ticket_cipher ? tls_ticket_cipher : EVP_aes_256_cbc();
        int ok = EVP_DecryptInit_ex(ectx, ciph, NULL, k->aes, iv) == 1 &&
                 tls_ticket_init(hctx, k) == 1;
        return ok ? (back ? 2 : 1) : -1;
    }
    return 0;
}

/* ---- kernel TLS ---- */

/* Whether this process can attach the kernel's `tls` ULP to a TCP socket (the module is
 * loaded, or loads for a process allowed to): made on a loopback connection, once. */
static int tls_ktls_probe(void)
{
    int ok = 0;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    if (l >= 0 && c >= 0 && bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(l, 1) == 0 &&
        getsockname(l, (struct sockaddr *)&a, &alen) == 0 &&
        connect(c, (struct sockaddr *)&a, sizeof(a)) == 0)
        ok = setsockopt(c, IPPROTO_TCP, TCP_ULP, "tls", sizeof("tls")) == 0;
    if (c >= 0)
        close(c);
    if (l >= 0)
        close(l);
    return ok;
}

int tls_kernel_tls(void)
{
#ifdef OPENSSL_NO_KTLS
    return 0;
#else
    return tls_ktls_ok;
#endif
}

/* ---- the context ---- */

/* A name served with its own certificate (SNI), and the context that holds it. */
struct tls_sni {
    char *name; /* lower case; "*.example.org" matches one label in front of example.org */
    SSL_CTX *ctx;
};

/* One load of the certificate files: what the default context's callbacks read. Owned by the
 * default SSL_CTX (freed with it, ex_data tls_ex_load), so it lives as long as any connection
 * whose handshake began on it, across reloads. */
struct tls_load {
    struct tls_sni *sni;
    size_t nsni;
    unsigned char *ocsp; /* the DER OCSP response stapled for the default certificate */
    size_t ocsp_len;
};

static void tls_load_free(struct tls_load *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->nsni; i++) {
        free(l->sni[i].name);
        SSL_CTX_free(l->sni[i].ctx);
    }
    free(l->sni);
    free(l->ocsp);
    free(l);
}

static void tls_load_ex_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                             void *argp)
{
    (void)parent, (void)ad, (void)idx, (void)argl, (void)argp;
    tls_load_free(ptr);
}

static void tls_init_once(void)
{
    tls_ex_server = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    tls_ex_load = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, tls_load_ex_free);
    tls_ticket_secret_ok = RAND_bytes(tls_ticket_secret, sizeof(tls_ticket_secret)) == 1;
    tls_ticket_cipher = EVP_CIPHER_fetch(NULL, "AES-256-CBC", NULL);
    pthread_atfork(NULL, NULL, tls_iv_atfork_child);
    tls_ktls_ok = tls_ktls_probe();
    ERR_clear_error();
}

/* The name the client asked for (SNI) picks its certificate's context; no name, or one we do
 * not serve, keeps the default certificate (never an alert: a client that sends an IP address or
 * nothing still gets an answer). */
static int tls_sni_cb(SSL *s, int *alert, void *arg)
{
    (void)alert;
    const struct tls_load *l = arg;
    const char *name = SSL_get_servername(s, TLSEXT_NAMETYPE_host_name);
    if (!name || !l)
        return SSL_TLSEXT_ERR_OK;
    const char *dot = strchr(name, '.');
    SSL_CTX *wild = NULL;
    for (size_t i = 0; i < l->nsni; i++) {
        const char *n = l->sni[i].name;
        if (strcasecmp(n, name) == 0) {
            SSL_set_SSL_CTX(s, l->sni[i].ctx);
            return SSL_TLSEXT_ERR_OK;
        }
        if (!wild && n[0] == '*' && dot && dot != name && strcasecmp(n + 1, dot) == 0)
            wild = l->sni[i].ctx;
    }
    if (wild)
        SSL_set_SSL_CTX(s, wild);
    return SSL_TLSEXT_ERR_OK;
}

/* The client asked for the certificate's status (status_request): staple the OCSP response. */
static int tls_status_cb(SSL *s, void *arg)
{
    const struct tls_load *l = arg;
    if (!l || !l->ocsp)
        return SSL_TLSEXT_ERR_NOACK;
    unsigned char *copy = OPENSSL_memdup(l->ocsp, l->ocsp_len); /* OpenSSL frees it */
    if (!copy)
        return SSL_TLSEXT_ERR_NOACK;
    if (SSL_set_tlsext_status_ocsp_resp(s, copy, (long)l->ocsp_len) != 1) {
        OPENSSL_free(copy);
        return SSL_TLSEXT_ERR_NOACK;
    }
    return SSL_TLSEXT_ERR_OK;
}

/* One SSL_CTX serving certfile/keyfile with every other setting of o; every context of a
 * server (the default one and each SNI name's) is made alike, since after SNI switches a
 * connection to another context OpenSSL reads the verify store, ALPN and tickets from it. 0
 * and *out, or -EINVAL with err filled. */
static int tls_ctx_make(struct tls_ctx *t, const struct tls_options *o, const char *cert,
                        const char *key, SSL_CTX **out, char *err, size_t errlen)
{
    const char *pw = o->password && *o->password ? o->password : NULL;
    if (!key)
        key = cert;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_error(err, errlen, "cannot create the TLS context", NULL, 0);
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* The server's cipher order wins; a peer that leaves without close_notify is an ordinary
     * end of stream for HTTP/1 (its framing tells truncation), not an error; no renegotiation
     * (a client could make the server redo handshakes at will). */
    SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF |
                                 SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    /* TLS 1.3's suites, in the server's order (which wins, above): AES-128-GCM with SHA-256
     * first, where OpenSSL's default order puts AES-256-GCM with SHA-384 first. Every TLS 1.3
     * suite is strong; this one is the protocol's mandatory suite (RFC 8446, 9.1), the first
     * choice of the clients that state one (browsers, Go) and the one nginx negotiates with
     * them (it follows the client), and its SHA-256 key schedule and transcript cost less per
     * new handshake than SHA-384's (docs/benchmarks.md, "Session 17"). TLS 1.2's list is
     * --ssl-ciphers. */
    if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                      "TLS_CHACHA20_POLY1305_SHA256") != 1)
        ERR_clear_error(); /* never with these names; OpenSSL's default order stays */
#ifndef OPENSSL_NO_KTLS
    /* Kernel TLS only where the kernel has it (see "Files" above). */
    if (tls_ktls_ok)
        SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
#endif
    /* Moving write buffer: see "Writes" above. Release buffers: an idle keep-alive connection
     * keeps no 16 KiB read and write buffers, only its session. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    /* Read ahead: OpenSSL reads what the socket holds (up to its record buffer) in one recv,
     * rather than each record's 5-byte header and then its body in two; see "Reads" above for
     * why nothing it holds is left behind when the connection goes idle. */
    SSL_CTX_set_read_ahead(ctx, 1);
    /* Session resumption: tickets (keys from tls_ticket_cb, rotated) and the session cache, with
     * an id context so that resumed sessions are accepted. A session lives two ticket
     * periods, as its ticket's key does. */
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"cyserve", 7);
    SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, tls_ticket_cb);
    SSL_CTX_set_timeout(ctx, (long)(2 * t->ticket_period));
    SSL_CTX_set_ex_data(ctx, tls_ex_server, t);
    SSL_CTX_set_default_passwd_cb(ctx, tls_password_cb);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *)pw);
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
    SSL_CTX_set_alpn_select_cb(ctx, tls_alpn_select, t);
    *out = ctx;
    return 0;
fail:
    SSL_CTX_free(ctx);
    return -EINVAL;
}

/* The whole file at path into a malloc'd buffer (*len bytes), or -errno. */
static int tls_read_file(const char *path, unsigned char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    unsigned char *b = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= (1u << 20)) { /* an OCSP response is a few KiB */
                free(b);
                fclose(f);
                return -EFBIG;
            }
            cap = cap ? cap * 2 : 4096;
            unsigned char *nb = realloc(b, cap);
            if (!nb) {
                free(b);
                fclose(f);
                return -ENOMEM;
            }
            b = nb;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return -EIO;
    }
    *out = b;
    *len = n;
    return 0;
}

/* A name of o->sni as the SNI table keeps it: a host name, or "*." and one, in lower case. */
static int tls_sni_name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 253)
        return 0;
    const char *p = n[0] == '*' ? n + 1 : n;
    if (n[0] == '*' && (p[0] != '.' || !p[1]))
        return 0;
    for (; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '.'))
            return 0;
    return 1;
}

/* Load every file of o: the default context (its reference to the caller, owning the load that
 * SNI and stapling read) in *out. 0, or -errno with err filled and nothing kept. */
static int tls_load_new(struct tls_ctx *t, const struct tls_options *o, SSL_CTX **out, char *err,
                        size_t errlen)
{
    const char *cert = o->certfile && *o->certfile ? o->certfile : NULL;
    const char *key = o->keyfile && *o->keyfile ? o->keyfile : NULL;
    if (!cert) {
        snprintf(err, errlen, "a certificate file is required for TLS");
        return -EINVAL;
    }
    if (o->cert_reqs < 0 || o->cert_reqs > 2) {
        snprintf(err, errlen,
                 "the client certificate mode must be 0 (none), 1 (optional) or 2 "
                 "(required), not %d",
                 o->cert_reqs);
        return -EINVAL;
    }
    if (o->cert_reqs && !(o->ca_certs && *o->ca_certs)) {
        snprintf(err, errlen, "client certificates need the CA certificates to verify them");
        return -EINVAL;
    }
    SSL_CTX *def;
    int rc = tls_ctx_make(t, o, cert, key, &def, err, errlen);
    if (rc < 0)
        return rc;
    struct tls_load *l = calloc(1, sizeof(*l));
    if (!l || SSL_CTX_set_ex_data(def, tls_ex_load, l) != 1) {
        free(l);
        SSL_CTX_free(def);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* From here the load is the default context's: freeing def frees it. */
    rc = -ENOMEM;
    if (o->nsni) {
        l->sni = calloc(o->nsni, sizeof(*l->sni));
        if (!l->sni) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    for (size_t i = 0; i < o->nsni; i++) {
        const struct tls_sni_option *so = &o->sni[i];
        if (!so->name || !tls_sni_name_ok(so->name)) {
            snprintf(err, errlen,
                     "'%s' is not a host name to serve a certificate for (a name, or *. and "
                     "one)",
                     so->name ? so->name : "");
            rc = -EINVAL;
            goto fail;
        }
        for (size_t j = 0; j < l->nsni; j++)
            if (strcasecmp(l->sni[j].name, so->name) == 0) {
                snprintf(err, errlen, "the name '%s' is given two certificates", so->name);
                rc = -EINVAL;
                goto fail;
            }
        SSL_CTX *ctx;
        rc = tls_ctx_make(t, o, so->certfile && *so->certfile ? so->certfile : cert,
                          so->keyfile && *so->keyfile ? so->keyfile : NULL, &ctx, err, errlen);
        if (rc < 0)
            goto fail;
        char *name = strdup(so->name);
        if (!name) {
            SSL_CTX_free(ctx);
            snprintf(err, errlen, "out of memory");
            rc = -ENOMEM;
            goto fail;
        }
        for (char *p = name; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
        l->sni[l->nsni].name = name;
        l->sni[l->nsni].ctx = ctx;
        l->nsni++;
    }
    if (l->nsni) {
        SSL_CTX_set_tlsext_servername_callback(def, tls_sni_cb);
        SSL_CTX_set_tlsext_servername_arg(def, l);
    }
    if (o->ocsp_file && *o->ocsp_file) {
        rc = tls_read_file(o->ocsp_file, &l->ocsp, &l->ocsp_len);
        if (rc < 0) {
            snprintf(err, errlen, "cannot read the OCSP response from '%s': %s", o->ocsp_file,
                     strerror(-rc));
            goto fail;
        }
        const unsigned char *p = l->ocsp;
        OCSP_RESPONSE *r = d2i_OCSP_RESPONSE(NULL, &p, (long)l->ocsp_len);
        int whole = r && p == l->ocsp + l->ocsp_len;
        OCSP_RESPONSE_free(r);
        ERR_clear_error();
        if (!whole) {
            snprintf(err, errlen,
                     "'%s' is not an OCSP response (DER, as `openssl ocsp -respout` "
                     "writes it)",
                     o->ocsp_file);
            rc = -EINVAL;
            goto fail;
        }
        SSL_CTX_set_tlsext_status_cb(def, tls_status_cb);
        SSL_CTX_set_tlsext_status_arg(def, l);
    }
    *out = def;
    return 0;
fail:
    SSL_CTX_free(def);
    return rc;
}

int tls_ctx_new(const struct tls_options *o, struct tls_ctx **out, char *err, size_t errlen)
{
    pthread_once(&tls_once, tls_init_once);
    if (tls_ex_server < 0 || tls_ex_load < 0 || !tls_ticket_secret_ok) {
        snprintf(err, errlen, "OpenSSL could not be initialised (no random bytes?)");
        return -ENOMEM;
    }
    if (o->ticket_period_s > (1u << 30)) {
        snprintf(err, errlen, "the ticket key period must be at most 2**30 seconds, not %u",
                 o->ticket_period_s);
        return -EINVAL;
    }
    struct tls_ctx *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    t->http2 = o->http2;
    t->ticket_period = o->ticket_period_s ? o->ticket_period_s : TLS_TICKET_PERIOD_DEFAULT;
    atomic_init(&t->ticket_shift, 0);
    pthread_mutex_init(&t->lock, NULL);
    int rc = tls_load_new(t, o, &t->cur, err, errlen);
    if (rc < 0) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tls_ctx_reload(struct tls_ctx *t, const struct tls_options *o, char *err, size_t errlen)
{
    SSL_CTX *fresh;
    int rc = tls_load_new(t, o, &fresh, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&t->lock);
    SSL_CTX *old = t->cur;
    t->cur = fresh;
    pthread_mutex_unlock(&t->lock);
    /* Connections made on the old load hold references of their own (SSL_new's): it is freed
     * with the last of them. */
    SSL_CTX_free(old);
    return 0;
}

void tls_ctx_rotate_ticket_keys(struct tls_ctx *t)
{
    atomic_fetch_add_explicit(&t->ticket_shift, 1, memory_order_relaxed);
}

void tls_ctx_free(struct tls_ctx *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->cur);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* A new session on the current load's default context (a reload may swap it meanwhile: the
 * reference is taken under the lock, so the context cannot be freed between the read and
 * SSL_new's own reference). */
static SSL *tls_session_new(struct tls_ctx *t)
{
    pthread_mutex_lock(&t->lock);
    SSL_CTX *ctx = t->cur;
    SSL_CTX_up_ref(ctx);
    pthread_mutex_unlock(&t->lock);
    SSL *ssl = SSL_new(ctx);
    SSL_CTX_free(ctx);
    return ssl;
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
        ssl = tls_session_new(s->cfg.transport_ctx);
        if (!ssl) {
            ERR_clear_error();
            return -ENOMEM;
        }
        if (SSL_set_fd(ssl, c->io.fd) != 1) {
            ERR_clear_error();
            SSL_free(ssl);
            return -ENOMEM;
        }
        BIO_set_callback_ex(SSL_get_rbio(ssl), tls_bio_cb); /* see "Reads" above */
        SSL_set_accept_state(ssl);
        c->tp_data = ssl;
    }
    for (;;) {
        /* Each SSL call starts with an empty error queue (tls_err_reset). */
        tls_err_reset();
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
        tls_err_reset(); /* see tls_handshake */
        tls_read_short = 0;
        int r = SSL_read_ex(ssl, (char *)buf + got, len - got, &n);
        if (LIKELY(r == 1)) {
            got += n;
            /* The recv that brought these bytes found the socket empty, and OpenSSL holds no
             * more: drained, without a recv to meet EAGAIN (see "Reads"). Not where the kernel
             * decrypts (kernel TLS's receive side returns one record per recv, short or not). */
            if (tls_read_short && !SSL_has_pending(ssl) &&
                !(tls_ktls_ok && BIO_get_ktls_recv(SSL_get_rbio(ssl))))
                break;
            continue;
        }
        int f = tls_failure(c, r, 1);
        if (f == 1) {
            /* OpenSSL 3 with this file's options never writes inside a read (a KeyUpdate that
             * asks for one back is answered on the next write; a renegotiation is refused with
             * an alert sent then too; tests/c/test_tls.c holds both), so this is not reached
             * after some bytes: were it, the short return would read as a drained socket. */
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

ssize_t tls_recv_nowait(struct conn *c, void *buf, size_t len, short *events)
{
    SSL *ssl = c->tp_data;
    if (UNLIKELY(!ssl || !SSL_is_init_finished(ssl)))
        return -ENOTCONN;
    size_t n;
    tls_err_reset(); /* see tls_handshake */
    int r = SSL_read_ex(ssl, buf, len, &n);
    if (r == 1)
        return (ssize_t)n;
    int f = tls_failure(c, r, 1);
    if (f == -EAGAIN || f == 1) {
        *events = f == 1 ? POLLOUT : POLLIN;
        return -EAGAIN;
    }
    return f;
}

/* One SSL_write of n bytes at p: bytes written, or -errno / -EAGAIN. */
static ssize_t tls_write(struct conn *c, const void *p, size_t n)
{
    for (;;) {
        size_t w;
        tls_err_reset(); /* see tls_handshake */
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

/* conn_transport.send_nowait: one SSL_write without waiting, as tls_close's close_notify is
 * written. The socket is non-blocking, so a full one is WANT_WRITE (-EAGAIN), and OpenSSL keeps
 * the record to finish on a later write; a session that must read first (a key update) is
 * -EAGAIN too, as nothing may wait here. */
static ssize_t tls_send_nowait(struct conn *c, const void *buf, size_t len)
{
    SSL *ssl = c->tp_data;
    if (UNLIKELY(!ssl || !SSL_is_init_finished(ssl)))
        return -ENOTCONN;
    size_t w;
    tls_err_reset(); /* see tls_handshake */
    int r = SSL_write_ex(ssl, buf, len, &w);
    if (r == 1)
        return (ssize_t)w;
    int f = tls_failure(c, r, 0);
    return f == 1 ? -EAGAIN : f == 0 ? -EPIPE : f;
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
#ifndef OPENSSL_NO_KTLS
    if (tls_ktls_ok && BIO_get_ktls_send(SSL_get_wbio(c->tp_data))) {
        /* Kernel TLS sends this session's records: the kernel encrypts the file's pages as
         * sendfile(2) sends them, with no copy here. */
        for (;;) {
            tls_err_reset(); /* see tls_handshake */
            ossl_ssize_t n = SSL_sendfile(c->tp_data, fd, *off, count, 0);
            if (n > 0) {
                *off += n;
                return n;
            }
            int f = tls_failure(c, (int)n, 0);
            if (f == 1) {
                int rc = tls_wait_other(c, 0);
                if (rc < 0)
                    return rc;
                continue;
            }
            return f == 0 ? -EPIPE : f;
        }
    }
#endif
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
        tls_err_reset();
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
        tls_err_reset();
        if (SSL_shutdown(ssl) < 0)
            ERR_clear_error();
    }
    SSL_free(c->tp_data);
    c->tp_data = NULL;
}

/* ---- what handlers see ---- */

int tls_conn_info(const struct conn *c, struct tls_info *out)
{
    SSL *ssl = c->tp == &tls_transport ? c->tp_data : NULL;
    if (!ssl || !SSL_is_init_finished(ssl))
        return -ENOTCONN;
    const SSL_CIPHER *ci = SSL_get_current_cipher(ssl);
    out->version = SSL_version(ssl);
    out->version_name = SSL_get_version(ssl);
    out->cipher = ci ? (int)(SSL_CIPHER_get_id(ci) & 0xffff) : 0;
    out->cipher_name = ci ? SSL_CIPHER_get_name(ci) : NULL;
    out->peer_cert = SSL_get0_peer_certificate(ssl) != NULL;
    out->verify = out->peer_cert ? SSL_get_verify_result(ssl) : 0;
    out->verify_text = out->verify ? X509_verify_cert_error_string(out->verify) : NULL;
    out->server_name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    return 0;
}

/* Append cert's PEM to m. 0 or -ENOMEM. */
static int tls_pem_add(BIO *m, X509 *cert)
{
    return PEM_write_bio_X509(m, cert) == 1 ? 0 : -ENOMEM;
}

int tls_conn_text(const struct conn *c, int what, char **out, size_t *len)
{
    SSL *ssl = c->tp == &tls_transport ? c->tp_data : NULL;
    if (!ssl || !SSL_is_init_finished(ssl))
        return -ENOTCONN;
    X509 *leaf = what == TLS_TEXT_SERVER_CERT ? SSL_get_certificate(ssl)
                                              : SSL_get0_peer_certificate(ssl);
    if (!leaf)
        return -ENOENT;
    BIO *m = BIO_new(BIO_s_mem());
    if (!m)
        return -ENOMEM;
    int rc = 0;
    if (what == TLS_TEXT_PEER_NAME) {
        /* RFC 4514's string form (RFC 2253's, which it replaces), UTF-8. */
        if (X509_NAME_print_ex(m, X509_get_subject_name(leaf), 0,
                               XN_FLAG_RFC2253 & ~ASN1_STRFLGS_ESC_MSB) < 0)
            rc = -ENOMEM;
    } else {
        rc = tls_pem_add(m, leaf);
        /* The rest of the client's chain as it sent it (on the server's side OpenSSL keeps the
         * leaf apart from it). */
        STACK_OF(X509) *chain = what == TLS_TEXT_PEER_CHAIN ? SSL_get_peer_cert_chain(ssl) : NULL;
        for (int i = 0; rc == 0 && chain && i < sk_X509_num(chain); i++) {
            X509 *x = sk_X509_value(chain, i);
            if (X509_cmp(x, leaf) != 0)
                rc = tls_pem_add(m, x);
        }
    }
    char *p;
    long n = BIO_get_mem_data(m, &p);
    char *copy = rc == 0 && n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (copy) {
        memcpy(copy, p, (size_t)n);
        copy[n] = 0;
        *out = copy;
        *len = (size_t)n;
    } else {
        rc = -ENOMEM;
    }
    BIO_free(m);
    ERR_clear_error();
    return rc;
}

/* server.h's view of the above, for a request (kept here rather than in request.c so that the
 * engine's units built without OpenSSL need no TLS). */
int server_req_tls_info(const cyserve_request *req, struct tls_info *out)
{
    const struct request *rq = req->engine;
    return rq ? tls_conn_info(rq->c, out) : -ENOTCONN;
}

int server_req_tls_text(const cyserve_request *req, int what, char **out, size_t *len)
{
    const struct request *rq = req->engine;
    return rq ? tls_conn_text(rq->c, what, out, len) : -ENOTCONN;
}

const struct conn_transport tls_transport = {tls_recv,        tls_sendv,      tls_sendfile,
                                             tls_shutdown,    tls_close,      tls_start,
                                             tls_recv_nowait, tls_send_nowait};
