/* test_tls.c: the TLS transport's reads (tls_recv) against a real client over a socketpair,
 * where a record asks the server to write while it reads and the server's socket cannot take a
 * byte (the client does not read). tls_recv returns short when OpenSSL wants to write after it
 * read some bytes, and conn.c counts a short read as a drained socket: should OpenSSL ever write
 * inside a read, the connection could go idle with records left behind. It does not, with
 * OpenSSL 3 and the server's options: a TLS 1.3 KeyUpdate that requests one back is answered on
 * the next write, and a TLS 1.2 renegotiation is refused with an alert whose write may fail and
 * is retried on the next write. These tests hold that: the records after the one that asks for
 * a write are read in the same call, and nothing waits for writability. */
#define _GNU_SOURCE
#include "csrc/coro.c"
#include "csrc/sched.c"
#include "csrc/http_parse.c"
#include "csrc/wbuf.c"
#include "csrc/resp.c"
#include "csrc/http1_write.c"
#include "csrc/router.c"
#include "csrc/files.c"
#include "csrc/http_date.c"
#include "csrc/conn.c"
#include "csrc/listen.c"
#include "csrc/server.c"
#include "csrc/request.c"
#include "csrc/handler_static.c"
#include "csrc/handler_files.c"
#include "csrc/stream.c"
#include "csrc/body.c"
#include "csrc/handoff.c"
#include "csrc/access_log.c"
#include "csrc/http1.c"
#include "csrc/http1_inline.c"
#include "csrc/http2.c"
#include "csrc/proxy.c"
#include "csrc/ws.c"
#include "csrc/ws_conn.c"
#include "csrc/ws_nogil.c"
#include "csrc/ws_zlend.c"
#include "csrc/proxyproto.c"
#include "csrc/metrics.c"
#include "csrc/tls.c"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>

#include "tap.h"

/* A self-signed certificate with its key, in one PEM file: path filled. 0 or -1. */
static int make_cert(char *path, size_t cap)
{
    snprintf(path, cap, "/tmp/cyserve-test-tls-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    int ok = f && k && x;
    if (ok) {
        ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
        X509_gmtime_adj(X509_getm_notBefore(x), 0);
        X509_gmtime_adj(X509_getm_notAfter(x), 3600);
        X509_set_pubkey(x, k);
        X509_NAME *n = X509_get_subject_name(x);
        X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1,
                                   -1, 0);
        X509_set_issuer_name(x, n);
        ok = X509_sign(x, k, EVP_sha256()) > 0 && PEM_write_X509(f, x) == 1 &&
             PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL) == 1;
    }
    X509_free(x);
    EVP_PKEY_free(k);
    if (f)
        fclose(f);
    else
        close(fd);
    return ok ? 0 : -1;
}

struct client {
    SSL_CTX *ctx;
    int fd;
    SSL *ssl;
    int ok;
};

static void *client_connect(void *arg)
{
    struct client *cl = arg;
    cl->ssl = SSL_new(cl->ctx);
    SSL_set_fd(cl->ssl, cl->fd);
    cl->ok = SSL_connect(cl->ssl) == 1;
    return NULL;
}

/* A server session of t (made as tls_handshake makes one) and a client of at most max_version,
 * handshaken over a socketpair whose server side is then non-blocking with its send buffer full
 * of bytes the client never reads. The client side is non-blocking too. 0 or -1. */
static int pair(struct tls_ctx *t, int max_version, SSL **server, struct client *cl, int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return -1;
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    cl->ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(cl->ctx, max_version);
    cl->fd = sv[1];
    SSL *ssl = tls_session_new(t);
    SSL_set_fd(ssl, sv[0]);
    BIO_set_callback_ex(SSL_get_rbio(ssl), tls_bio_cb);
    pthread_t th;
    pthread_create(&th, NULL, client_connect, cl);
    int r = SSL_accept(ssl);
    pthread_join(th, NULL);
    *server = ssl;
    if (r != 1 || !cl->ok)
        return -1;
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    return 0;
}

/* Fill fd's send side (and its peer's receive side) with bytes nobody reads. */
static void fill(int fd)
{
    char junk[1024] = {0};
    while (write(fd, junk, sizeof(junk)) > 0)
        ;
}

static void unpair(SSL *server, struct client *cl, int sv[2])
{
    SSL_free(server);
    SSL_free(cl->ssl);
    SSL_CTX_free(cl->ctx);
    close(sv[0]);
    close(sv[1]);
}

/* TLS 1.3: "A", a KeyUpdate that asks for one back, "B", all in the socket before the server
 * reads, whose send side is full: one tls_recv reads both pieces, past the KeyUpdate, and the
 * next finds the socket empty (-EAGAIN), not a write to wait for. */
static void test_key_update_inside_a_read(struct tls_ctx *t)
{
    SSL *server;
    struct client cl = {0};
    int sv[2];
    if (pair(t, TLS1_3_VERSION, &server, &cl, sv) != 0) {
        ok(0, "a TLS 1.3 pair");
        return;
    }
    ok(strcmp(SSL_get_version(server), "TLSv1.3") == 0, "TLS 1.3 (%s)", SSL_get_version(server));
    struct conn c;
    memset(&c, 0, sizeof(c));
    c.tp_data = server;
    c.io.fd = sv[0];
    ok(SSL_write(cl.ssl, "A", 1) == 1, "the client writes A");
    ok(SSL_key_update(cl.ssl, SSL_KEY_UPDATE_REQUESTED) == 1 && SSL_do_handshake(cl.ssl) == 1,
       "then a KeyUpdate that requests one back");
    ok(SSL_write(cl.ssl, "B", 1) == 1, "then B");
    fill(sv[0]);
    char buf[64];
    ssize_t n = tls_recv(&c, buf, sizeof(buf));
    is_int(n, 2, "one read takes A and B, past the KeyUpdate");
    ok(n == 2 && memcmp(buf, "AB", 2) == 0, "in order");
    is_int(tls_recv(&c, buf, sizeof(buf)), -EAGAIN, "then the socket is empty: EAGAIN");
    unpair(server, &cl, sv);
}

/* TLS 1.2: "A", then a renegotiation's ClientHello, while the server's send side is full. The
 * server refuses it with an alert it cannot write now; the read returns A and then -EAGAIN (the
 * socket is empty), never asking to wait for writability (which tls_recv would do, outside a
 * coroutine here, when nothing was read yet). */
static void test_renegotiation_inside_a_read(struct tls_ctx *t)
{
    SSL *server;
    struct client cl = {0};
    int sv[2];
    if (pair(t, TLS1_2_VERSION, &server, &cl, sv) != 0) {
        ok(0, "a TLS 1.2 pair");
        return;
    }
    ok(strcmp(SSL_get_version(server), "TLSv1.2") == 0, "TLS 1.2 (%s)", SSL_get_version(server));
    struct conn c;
    memset(&c, 0, sizeof(c));
    c.tp_data = server;
    c.io.fd = sv[0];
    ok(SSL_write(cl.ssl, "A", 1) == 1, "the client writes A");
    int r = SSL_renegotiate(cl.ssl) == 1 ? SSL_do_handshake(cl.ssl) : 0;
    ok(r == -1 && SSL_get_error(cl.ssl, r) == SSL_ERROR_WANT_READ,
       "then a ClientHello, and waits for the answer");
    fill(sv[0]);
    char buf[64];
    ssize_t n = tls_recv(&c, buf, sizeof(buf));
    is_int(n, 1, "the read returns A");
    is_int(tls_recv(&c, buf, sizeof(buf)), -EAGAIN,
           "and the refused ClientHello leaves the socket empty: EAGAIN");
    unpair(server, &cl, sv);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    char path[64];
    if (make_cert(path, sizeof(path)) != 0) {
        ok(0, "a certificate");
        return done_testing();
    }
    struct tls_options o = {.certfile = path};
    struct tls_ctx *t;
    char err[256];
    int rc = tls_ctx_new(&o, &t, err, sizeof(err));
    unlink(path);
    ok(rc == 0, "a server context (%s)", rc ? err : "made");
    if (rc == 0) {
        test_key_update_inside_a_read(t);
        test_renegotiation_inside_a_read(t);
        tls_ctx_free(t);
    }
    return done_testing();
}
