/* tls_conn_mem.c: what OpenSSL keeps for one idle server connection, and where it goes.
 *
 * A TLS connection in cyserve holds its SSL for its life. This program counts, with
 * CRYPTO_set_mem_functions, the blocks that the server's side allocates and has not freed after
 * a TLS 1.3 handshake (ECDSA P-256 certificate, ALPN h2, session tickets on, as csrc/tls.c sets
 * the context: SSL_MODE_RELEASE_BUFFERS) and one request/answer of application data each way,
 * read through by the client, over memory BIOs. Allocations are charged to the side whose call
 * is running (a global flag), so the client's own state is left out.
 *
 *   gcc -O2 bench/micro/tls_conn_mem.c -lssl -lcrypto -o /tmp/tlsmem && /tmp/tlsmem CERT KEY
 *
 * It prints the server connection's live blocks and bytes, what glibc gives them (usable size
 * plus its 8-byte chunk header), and the largest blocks by the source line that made them
 * (OpenSSL passes file and line). With a second run of the handshake it also shows the peak of
 * the server's live bytes during the handshake, the memory a connection needs only briefly. */
#include <malloc.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int charging;          /* 1 while the server side's calls run */
static long live, heap, peak; /* the server's blocks: bytes asked, bytes glibc gives them */
static long blocks;

/* The blocks charged to the server, by where they were made (a small open table). */
#define SITES 256
static struct site {
    const char *file;
    int line;
    long n, bytes;
} sites[SITES];

struct hdr {
    size_t size;
    const char *file;
    int line;
    int charged;
};

static void site_add(const char *file, int line, long sign, size_t size)
{
    for (int i = 0; i < SITES; i++) {
        if (!sites[i].file) {
            sites[i].file = file;
            sites[i].line = line;
        }
        if (sites[i].file == file && sites[i].line == line) {
            sites[i].n += sign;
            sites[i].bytes += sign * (long)size;
            return;
        }
    }
}

static void account(struct hdr *h, long sign)
{
    if (!h->charged)
        return;
    blocks += sign;
    live += sign * (long)h->size;
    heap += sign * (long)(malloc_usable_size(h) - sizeof(*h) + 8 + sizeof(*h));
    if (live > peak)
        peak = live;
    site_add(h->file, h->line, sign, h->size);
}

static void *m_malloc(size_t size, const char *file, int line)
{
    struct hdr *h = malloc(sizeof(*h) + size);
    if (!h)
        return NULL;
    *h = (struct hdr){size, file, line, charging};
    account(h, 1);
    return h + 1;
}

static void m_free(void *p, const char *file, int line)
{
    (void)file, (void)line;
    if (!p)
        return;
    struct hdr *h = (struct hdr *)p - 1;
    account(h, -1);
    free(h);
}

static void *m_realloc(void *p, size_t size, const char *file, int line)
{
    if (!p)
        return m_malloc(size, file, line);
    struct hdr *h = (struct hdr *)p - 1;
    void *n = m_malloc(size, file, line);
    if (!n)
        return NULL;
    memcpy(n, p, h->size < size ? h->size : size);
    m_free(p, file, line);
    return n;
}

static int alpn_cb(SSL *s, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned inlen, void *arg)
{
    (void)s, (void)arg;
    static const unsigned char h2[] = "\x02h2";
    if (SSL_select_next_proto((unsigned char **)out, outlen, h2, 3, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    return SSL_TLSEXT_ERR_OK;
}

/* Move bytes from one memory BIO pair to the other side. */
static void shuttle(BIO *from, BIO *to)
{
    char buf[4096];
    int n;
    while ((n = BIO_read(from, buf, sizeof(buf))) > 0)
        BIO_write(to, buf, n);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s CERT KEY\n", argv[0]);
        return 2;
    }
    CRYPTO_set_mem_functions(m_malloc, m_realloc, m_free);
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_options(sctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF |
                                  SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(sctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_id_context(sctx, (const unsigned char *)"cyserve", 7);
    SSL_CTX_set_alpn_select_cb(sctx, alpn_cb, NULL);
    if (SSL_CTX_use_certificate_chain_file(sctx, argv[1]) != 1 ||
        SSL_CTX_use_PrivateKey_file(sctx, argv[2], SSL_FILETYPE_PEM) != 1) {
        ERR_print_errors_fp(stderr);
        return 1;
    }
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_alpn_protos(cctx, (const unsigned char *)"\x02h2", 3);

    for (int round = 0; round < 3; round++) {
        long live0 = live, heap0 = heap, blocks0 = blocks;
        memset(sites, 0, sizeof(sites));
        peak = live;
        charging = 1;
        SSL *srv = SSL_new(sctx);
        BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
        SSL_set_bio(srv, s_in, s_out);
        SSL_set_accept_state(srv);
        long at_new = heap - heap0;
        charging = 0;
        SSL *cl = SSL_new(cctx);
        BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
        SSL_set_bio(cl, c_in, c_out);
        SSL_set_connect_state(cl);
        for (int i = 0; i < 10; i++) {
            SSL_do_handshake(cl);
            shuttle(c_out, s_in);
            charging = 1;
            SSL_do_handshake(srv);
            charging = 0;
            shuttle(s_out, c_in);
        }
        char buf[256];
        SSL_write(cl, "request", 7);
        shuttle(c_out, s_in);
        charging = 1;
        int n = SSL_read(srv, buf, sizeof(buf));
        SSL_write(srv, "answer", 6);
        charging = 0;
        shuttle(s_out, c_in);
        int m = SSL_read(cl, buf, sizeof(buf));
        charging = 1;
        /* One more read that finds nothing: an idle connection's last call. */
        SSL_read(srv, buf, sizeof(buf));
        ERR_clear_error();
        charging = 0;
        printf("round %d: %s, server read %d, client read %d; at SSL_new %ld B heap; handshake "
               "peak %ld B asked; idle: %ld blocks, %ld B asked, %ld B heap\n",
               round, SSL_get_version(srv), n, m, at_new, peak - live0, blocks - blocks0,
               live - live0, heap - heap0);
        if (round == 2) {
            printf("  the idle connection's blocks by where they were made (>= 256 B):\n");
            for (int i = 0; i < SITES && sites[i].file; i++)
                if (sites[i].bytes >= 256)
                    printf("  %6ld B in %3ld blocks  %s:%d\n", sites[i].bytes, sites[i].n,
                           sites[i].file, sites[i].line);
        }
        SSL_free(cl);
        charging = 1;
        SSL_free(srv);
        charging = 0;
    }
    return 0;
}
