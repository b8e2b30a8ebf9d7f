/* access_log.c: the access log.
 *
 * Off unless cfg.access_log_fd >= 0. One line per response, in the Common Log Format that log
 * tools parse, plus the time the request took (from its complete head to its response queued):
 *
 *   127.0.0.1:50212 - - [22/Nov/2026:03:25:03 +0000] "GET /plaintext HTTP/1.1" 200 13 0.000021
 *
 * Each line goes out in one write(2) as it is made, from whichever worker serves the request:
 * lines are short (the target is cut at ACCESS_LOG_TARGET_MAX), so a write to a pipe is atomic
 * and lines of different workers and processes never interleave, and nothing waits in a buffer
 * when the traffic stops. The request line is "-" for a request that was rejected before it
 * was parsed. The parser has already refused control characters, spaces and quotes outside the
 * grammar in the method and the target, so they are written as they came. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "access_log.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "conn.h"
#include "server_int.h"

#define ACCESS_LOG_TARGET_MAX 1024

static const char *access_log_date(void)
{
    static __thread time_t last;
    static __thread char buf[32];
    static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != last || !buf[0]) {
        struct tm tm;
        gmtime_r(&now, &tm);
        snprintf(buf, sizeof(buf), "%02d/%s/%04d:%02d:%02d:%02d +0000", tm.tm_mday, mon[tm.tm_mon],
                 tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        last = now;
    }
    return buf;
}

void access_log_write(struct request *rq)
{
    int fd = rq->srv->cfg.access_log_fd;
    if (LIKELY(fd < 0) || !rq->log_status)
        return;
    char line[ACCESS_LOG_TARGET_MAX + 256];
    char bytes[24] = "-";
    if (rq->log_bytes >= 0)
        snprintf(bytes, sizeof(bytes), "%lld", (long long)rq->log_bytes);
    double secs = rq->log_have_req ? (double)(clock_mono_ns() - rq->log_t0) / 1e9 : 0.0;
    const char *scheme;
    const char *client = request_client(rq, &scheme); /* the peer, or who a trusted proxy names */
    int n;
    if (rq->log_have_req) {
        const struct http_request *r = &rq->head;
        int tlen = r->target_len > ACCESS_LOG_TARGET_MAX ? ACCESS_LOG_TARGET_MAX
                                                         : (int)r->target_len;
        n = snprintf(line, sizeof(line), "%s - - [%s] \"%.*s %.*s HTTP/%s\" %d %s %.6f\n", client,
                     access_log_date(), (int)r->method_len, r->method, tlen, r->target,
                     rq->http2          ? "2.0"
                     : r->minor_version ? "1.1"
                                        : "1.0",
                     rq->log_status, bytes, secs);
    } else {
        n = snprintf(line, sizeof(line), "%s - - [%s] \"-\" %d %s %.6f\n", client,
                     access_log_date(), rq->log_status, bytes, secs);
    }
    if (n > 0) {
        size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
        /* A failed write drops its line and the server goes on. A write blocks while a pipe on
         * standard output is full: a reader that stalls slows the workers down, as it would
         * nginx's or gunicorn's. */
        ssize_t w;
        do {
            w = write(fd, line, len);
        } while (w < 0 && errno == EINTR);
    }
    rq->log_status = 0;
}
