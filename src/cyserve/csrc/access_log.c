/* access_log.c: the access log.
 *
 * Off unless cfg.access_log_fd >= 0. One line per response, in one of three formats
 * (cfg.access_log_format):
 *
 *   common    the Common Log Format, as log tools (goaccess, awstats, fail2ban) parse it:
 *             127.0.0.1 - - [22/Nov/2026:03:25:03 +0000] "GET /plaintext HTTP/1.1" 200 13
 *   combined  the same, then the Referer and the User-Agent, quoted (nginx's and Apache's
 *             "combined", gunicorn's default):  ... 200 13 "-" "curl/8.5.0"
 *   json      one JSON object per line, with the client's port, the scheme and the seconds the
 *             request took (from its complete head to its response queued) besides:
 *             {"time":"2026-11-22T03:25:03Z","client":"127.0.0.1","port":50212,...}
 *   custom    gunicorn's atoms (%(h)s %(r)s ...), compiled by cyserve/access_log.py once at start
 *             into a list of steps (struct access_log_op) that access_log_custom runs: a format
 *             string is never parsed per line, and the line still goes out in one write.
 *
 * The client is the peer's address, or who a trusted proxy names (request_client); CLF's host
 * field has no port, so common and combined write the address alone.
 *
 * Each line goes out in one write(2) as it is made, from whichever worker serves the request:
 * lines are short (the target and each header value are cut at ACCESS_LOG_FIELD_MAX), so a
 * write to a pipe is atomic and lines of different workers and processes never interleave, and
 * nothing waits in a buffer when the traffic stops. The request line is "-" for a request that
 * was rejected before it was parsed. The parser has already refused control characters, spaces
 * and quotes outside the grammar in the method and the target, so they are written as they came
 * in the CLF formats; header values may hold quotes and bytes above 0x7e, so those are escaped
 * (\" \\ and \xHH, as nginx does), and in JSON every field is escaped as JSON wants. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "access_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "conn.h"
#include "server_int.h"

#define ACCESS_LOG_FIELD_MAX 1024
/* The longest line: the fixed parts, the target and two header values, each escaped at up to
 * six bytes per byte in JSON (\u00XX), plus the client. */
#define ACCESS_LOG_LINE_MAX (3 * 6 * ACCESS_LOG_FIELD_MAX + 512)

static const char *access_log_date(int iso)
{
    static __thread time_t last[2];
    static __thread char buf[2][96]; /* room for any int fields, whatever GCC fears */
    static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != last[iso] || !buf[iso][0]) {
        struct tm tm;
        gmtime_r(&now, &tm);
        if (iso)
            snprintf(buf[1], sizeof(buf[1]), "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        else
            snprintf(buf[0], sizeof(buf[0]), "%02d/%s/%04d:%02d:%02d:%02d +0000", tm.tm_mday,
                     mon[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        last[iso] = now;
    }
    return buf[iso];
}

/* A line under construction: appends never overflow; a line that would is cut (it cannot, given
 * ACCESS_LOG_LINE_MAX and the cuts at ACCESS_LOG_FIELD_MAX, but the bound is checked anyway). */
struct access_line {
    char buf[ACCESS_LOG_LINE_MAX];
    size_t len;
};

static void al_raw(struct access_line *l, const char *p, size_t n)
{
    if (n > sizeof(l->buf) - 1 - l->len)
        n = sizeof(l->buf) - 1 - l->len;
    memcpy(l->buf + l->len, p, n);
    l->len += n;
}

static void al_str(struct access_line *l, const char *p)
{
    al_raw(l, p, strlen(p));
}

static void al_fmt(struct access_line *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void al_fmt(struct access_line *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->len, sizeof(l->buf) - l->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->len += (size_t)n < sizeof(l->buf) - l->len ? (size_t)n : sizeof(l->buf) - 1 - l->len;
}

/* p[0..n) cut at ACCESS_LOG_FIELD_MAX, escaped for a quoted CLF field (json == 0: \" \\ and
 * \xHH for bytes outside 0x20..0x7e) or a JSON string (json == 1: \" \\ and \u00XX; bytes
 * above 0x7f are written as the Latin-1 characters they would be, so the line is always valid
 * UTF-8 whatever the client sent). */
static void al_escaped(struct access_line *l, const char *p, size_t n, int json)
{
    static const char hex[] = "0123456789abcdef";
    if (n > ACCESS_LOG_FIELD_MAX)
        n = ACCESS_LOG_FIELD_MAX;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            al_raw(l, e, 2);
        } else if (ch >= 0x20 && ch < 0x7f) {
            al_raw(l, (const char *)&ch, 1);
        } else if (json) {
            char e[6] = {'\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15]};
            al_raw(l, e, 6);
        } else {
            char e[4] = {'\\', 'x', hex[ch >> 4], hex[ch & 15]};
            al_raw(l, e, 4);
        }
    }
}

/* The value of the first header field named `name` (case-insensitive), or NULL. */
static const struct http_header *al_header(const struct http_request *r, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; i < r->num_headers; i++)
        if (r->headers[i].name_len == len && strncasecmp(r->headers[i].name, name, len) == 0)
            return &r->headers[i];
    return NULL;
}

/* The host part of a peer string as request_client gives it: "1.2.3.4:5678" -> "1.2.3.4",
 * "[::1]:5678" -> "::1"; "-" (no peer) and anything without a port stay as they are. */
static void al_host(const char *peer, const char **host, size_t *len, long *port)
{
    const char *colon = strrchr(peer, ':');
    *host = peer;
    *len = strlen(peer);
    *port = -1;
    if (peer[0] == '[') {
        const char *close = strchr(peer, ']');
        if (close) {
            *host = peer + 1;
            *len = (size_t)(close - peer - 1);
            if (close[1] == ':')
                *port = strtol(close + 2, NULL, 10);
        }
    } else if (colon && colon == strchr(peer, ':')) {
        /* exactly one ':' : IPv4 (or a name) with a port; an IPv6 address has several */
        *len = (size_t)(colon - peer);
        *port = strtol(colon + 1, NULL, 10);
    }
}

/* The request line "GET /x HTTP/1.1" (the target cut at ACCESS_LOG_FIELD_MAX), or "-". */
static void al_reqline(struct access_line *l, const struct request *rq,
                       const struct http_request *r)
{
    if (r == NULL) {
        al_str(l, "-");
        return;
    }
    size_t tlen = r->target_len > ACCESS_LOG_FIELD_MAX ? ACCESS_LOG_FIELD_MAX : r->target_len;
    al_fmt(l, "%.*s %.*s HTTP/%s", (int)r->method_len, r->method, (int)tlen, r->target,
           rq->http2          ? "2.0"
           : r->minor_version ? "1.1"
                              : "1.0");
}

/* A header's value escaped as in the combined format, or "-". */
static void al_header_value(struct access_line *l, const struct http_header *h)
{
    if (h)
        al_escaped(l, h->value, h->value_len, 0);
    else
        al_str(l, "-");
}

/* The line of a custom format: each op in turn. The parser has refused spaces, quotes and
 * control bytes in the method and the target, so those go out as they came, as in the common
 * format; header values are escaped as the combined format escapes them. */
static void access_log_custom(struct access_line *l, const struct request *rq,
                              const struct http_request *r, const char *host, size_t host_len)
{
    const struct server_config *cfg = &rq->srv->cfg;
    uint64_t ns = r ? clock_mono_ns() - rq->log_t0 : 0;
    for (unsigned i = 0; i < cfg->access_log_nops; i++) {
        const struct access_log_op *op = &cfg->access_log_ops[i];
        switch (op->atom) {
        case ACCESS_LOG_TEXT:
            al_raw(l, op->arg, op->arg_len);
            break;
        case ACCESS_LOG_HOST:
            al_raw(l, host, host_len);
            break;
        case ACCESS_LOG_DASH:
            al_str(l, "-");
            break;
        case ACCESS_LOG_TIME:
            al_str(l, "[");
            al_str(l, access_log_date(0));
            al_str(l, "]");
            break;
        case ACCESS_LOG_REQLINE:
            al_reqline(l, rq, r);
            break;
        case ACCESS_LOG_METHOD:
            if (r)
                al_raw(l, r->method, r->method_len);
            else
                al_str(l, "-");
            break;
        case ACCESS_LOG_PATH:
        case ACCESS_LOG_QUERY: {
            if (r == NULL) {
                al_str(l, op->atom == ACCESS_LOG_PATH ? "-" : "");
                break;
            }
            size_t tlen = r->target_len > ACCESS_LOG_FIELD_MAX ? ACCESS_LOG_FIELD_MAX
                                                               : r->target_len;
            const char *qm = memchr(r->target, '?', tlen);
            size_t plen = qm ? (size_t)(qm - r->target) : tlen;
            if (op->atom == ACCESS_LOG_PATH)
                al_raw(l, r->target, plen);
            else if (qm)
                al_raw(l, qm + 1, tlen - plen - 1);
            break;
        }
        case ACCESS_LOG_PROTOCOL:
            if (r)
                al_str(l, rq->http2 ? "HTTP/2.0" : r->minor_version ? "HTTP/1.1" : "HTTP/1.0");
            else
                al_str(l, "-");
            break;
        case ACCESS_LOG_STATUS:
            al_fmt(l, "%d", rq->log_status);
            break;
        case ACCESS_LOG_BYTES:
        case ACCESS_LOG_BYTES0:
            if (rq->log_bytes >= 0)
                al_fmt(l, "%lld", (long long)rq->log_bytes);
            else
                al_str(l, op->atom == ACCESS_LOG_BYTES ? "-" : "0");
            break;
        case ACCESS_LOG_REFERER:
            al_header_value(l, r ? al_header(r, "referer") : NULL);
            break;
        case ACCESS_LOG_AGENT:
            al_header_value(l, r ? al_header(r, "user-agent") : NULL);
            break;
        case ACCESS_LOG_SECONDS:
            al_fmt(l, "%llu", (unsigned long long)(ns / 1000000000u));
            break;
        case ACCESS_LOG_MILLIS:
            al_fmt(l, "%llu", (unsigned long long)(ns / 1000000u));
            break;
        case ACCESS_LOG_MICROS:
            al_fmt(l, "%llu", (unsigned long long)(ns / 1000u));
            break;
        case ACCESS_LOG_DECIMAL:
            al_fmt(l, "%.6f", (double)ns / 1e9);
            break;
        case ACCESS_LOG_PID:
            al_fmt(l, "<%ld>", (long)getpid());
            break;
        case ACCESS_LOG_HEADER:
            al_header_value(l, r ? al_header(r, op->arg) : NULL);
            break;
        default:
            break;
        }
    }
    /* A format of many long header atoms could fill the buffer: the line is cut, but it still
     * ends with its newline. */
    if (l->len >= sizeof(l->buf) - 1) {
        l->buf[sizeof(l->buf) - 2] = '\n';
        l->len = sizeof(l->buf) - 1;
    } else {
        al_str(l, "\n");
    }
}

void access_log_write(struct request *rq)
{
    int fd = rq->srv->cfg.access_log_fd;
    if (LIKELY(fd < 0) || !rq->log_status)
        return;
    int format = rq->srv->cfg.access_log_format;
    /* Per thread rather than on the stack: a line can reach 19 KiB and connections run on
     * 64 KiB coroutine stacks. Nothing here yields, so one buffer per thread is enough. */
    static __thread struct access_line line;
    line.len = 0;
    const char *scheme;
    const char *host;
    size_t host_len;
    long port;
    al_host(request_client(rq, &scheme), &host, &host_len, &port);
    const struct http_request *r = rq->log_have_req ? &rq->head : NULL;
    const struct http_header *referer = NULL, *agent = NULL;
    if (r && format != ACCESS_LOG_CUSTOM) {
        referer = al_header(r, "referer");
        agent = al_header(r, "user-agent");
    }
    if (format == ACCESS_LOG_CUSTOM) {
        access_log_custom(&line, rq, r, host, host_len);
    } else if (format == ACCESS_LOG_JSON) {
        double secs = r ? (double)(clock_mono_ns() - rq->log_t0) / 1e9 : 0.0;
        al_str(&line, "{\"time\":\"");
        al_str(&line, access_log_date(1));
        al_str(&line, "\",\"client\":\"");
        al_escaped(&line, host, host_len, 1);
        if (port >= 0)
            al_fmt(&line, "\",\"port\":%ld,\"scheme\":\"%s\"", port, scheme);
        else
            al_fmt(&line, "\",\"port\":null,\"scheme\":\"%s\"", scheme);
        if (r) {
            al_str(&line, ",\"method\":\"");
            al_escaped(&line, r->method, r->method_len, 1);
            al_str(&line, "\",\"target\":\"");
            al_escaped(&line, r->target, r->target_len, 1);
            if (rq->http2)
                al_str(&line, "\",\"protocol\":\"HTTP/2.0\"");
            else
                al_fmt(&line, "\",\"protocol\":\"HTTP/1.%d\"", r->minor_version);
        } else {
            al_str(&line, ",\"method\":null,\"target\":null,\"protocol\":null");
        }
        al_fmt(&line, ",\"status\":%d", rq->log_status);
        if (rq->log_bytes >= 0)
            al_fmt(&line, ",\"bytes\":%lld", (long long)rq->log_bytes);
        else
            al_str(&line, ",\"bytes\":null");
        al_fmt(&line, ",\"duration\":%.6f", secs);
        const struct http_header *hs[2] = {referer, agent};
        static const char *keys[2] = {",\"referer\":", ",\"user_agent\":"};
        for (int i = 0; i < 2; i++) {
            al_str(&line, keys[i]);
            if (hs[i]) {
                al_str(&line, "\"");
                al_escaped(&line, hs[i]->value, hs[i]->value_len, 1);
                al_str(&line, "\"");
            } else {
                al_str(&line, "null");
            }
        }
        al_str(&line, "}\n");
    } else {
        al_raw(&line, host, host_len);
        al_str(&line, " - - [");
        al_str(&line, access_log_date(0));
        al_str(&line, "] \"");
        if (r) {
            size_t tlen = r->target_len > ACCESS_LOG_FIELD_MAX ? ACCESS_LOG_FIELD_MAX
                                                               : r->target_len;
            al_fmt(&line, "%.*s %.*s HTTP/%s", (int)r->method_len, r->method, (int)tlen, r->target,
                   rq->http2          ? "2.0"
                   : r->minor_version ? "1.1"
                                      : "1.0");
        } else {
            al_str(&line, "-");
        }
        al_fmt(&line, "\" %d ", rq->log_status);
        if (rq->log_bytes >= 0)
            al_fmt(&line, "%lld", (long long)rq->log_bytes);
        else
            al_str(&line, "-");
        if (format == ACCESS_LOG_COMBINED) {
            const struct http_header *hs[2] = {referer, agent};
            for (int i = 0; i < 2; i++) {
                al_str(&line, " \"");
                if (hs[i])
                    al_escaped(&line, hs[i]->value, hs[i]->value_len, 0);
                else
                    al_str(&line, "-");
                al_str(&line, "\"");
            }
        }
        al_str(&line, "\n");
    }
    /* A failed write drops its line and the server goes on. A write blocks while a pipe on
     * standard output is full: a reader that stalls slows the workers down, as it would nginx's
     * or gunicorn's. */
    ssize_t w;
    do {
        w = write(fd, line.buf, line.len);
    } while (w < 0 && errno == EINTR);
    rq->log_status = 0;
}
