/* body.h: a request body streamed to its handler: read from the socket as the handler asks for
 * it, through a small window, instead of whole before the call. The design (when a body is
 * streamed, who reads on which thread, what is left for the next request) is at the top of
 * body.c. Internal to the engine; error convention 0 or -errno. */
#ifndef CYSERVE_BODY_H
#define CYSERVE_BODY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cyserve/handler.h"
#include "http_parse.h"

struct conn;
struct server;

/* The window a streamed body is read through: what one connection holds of its body. */
#define BODY_WINDOW 65536

/* A body larger than this (its Content-Length, or what a chunked body has decoded so far) that
 * has not arrived whole with its head is streamed to a handler that reads bodies as streams;
 * smaller ones are read whole before the call, as before. */
#define BODY_STREAM_MIN 65536

/* The state of one streamed body. Made by the connection's coroutine (body_start) before the
 * handler's call; read by that call (body_read, on the thread running it, while the coroutine
 * waits for the call); then finished by the coroutine again (body_drain, body_tail, body_end).
 * Never by two threads at once: the call and the coroutine take turns. */
struct body_reader {
    struct conn *c;
    struct server *s;
    int fd;
    int chunked;
    int slot; /* holds one of the server's stream slots (body_slot_take), given back by body_end */
    int done; /* the body's end was seen */
    int err;  /* sticky: 0, or the -errno every later read returns */
    /* The last read said -EAGAIN because OpenSSL must write first: wait for the socket to be
     * writable rather than readable. Always 0 over plain TCP. */
    int wait_out;
    /* With err: the answer the client should get (413, 408, 400, 431), or 0 when there is
     * nobody to answer (the client went away, the server stops); reason names the problem. */
    int status;
    const char *reason;
    struct http_chunked st;
    int64_t length;     /* Content-Length, or -1 for a chunked body */
    uint64_t left;      /* Content-Length: bytes not yet received */
    uint64_t got;       /* decoded body bytes received, the part read before the call included */
    uint64_t recvd;     /* bytes this reader received from the socket (the minimum rate) */
    uint64_t waited_ns; /* time spent waiting for the client to send (the minimum rate) */
    uint64_t taken;     /* body bytes handed to the handler */
    /* The window: decoded body bytes at win[pos..end), then, once the body has ended, the bytes
     * of the next request read past it at win[end..tail). */
    char *win;
    size_t cap, pos, end, tail;
    /* A body that does not come from the socket (an HTTP/2 stream's DATA, which the connection's
     * coroutine receives): body_read calls pull instead, with the same contract, and pull keeps
     * err, status, reason and taken as body_read does. NULL for HTTP/1's own bodies. */
    ssize_t (*pull)(struct body_reader *br, void *dst, size_t n, int line);
    void *pull_data;
};

/* Start streaming the body of the request on c (server s) whose first body bytes are
 * prefix[0..n) (decoded, copied), length its Content-Length or -1 when chunked, st the chunked
 * decoder's state after the prefix (NULL for a Content-Length body). 0 or -ENOMEM. The
 * connection's coroutine. */
int body_start(struct body_reader *br, struct conn *c, struct server *s, const char *prefix,
               size_t n, int64_t length, const struct http_chunked *st);

/* Take one of the server's stream slots: 1, or 0 when as many bodies stream as may (half of
 * blocking_threads, at least one; none when relief is off), so that the body is read whole
 * instead. A handler waiting for a slow client holds a thread, and relief has blocking_threads
 * of them for every call that blocks: half are left to the others. Any thread. */
int body_slot_take(struct server *s);

/* Give back a slot taken by body_slot_take that no reader holds. Any thread. */
void body_slot_give(struct server *s);

/* Record br's sticky error err (-errno) with the answer status a client should get (0: none)
 * and its reason (static); returns err. For a pull function (above). */
int body_fail(struct body_reader *br, int err, int status, const char *reason);

/* Whether a stop's grace period is over, so that a body still being read is cut. Any thread. */
int body_stop_due(const struct server *s, uint64_t now);

/* Release what br holds (its window, its stream slot). Idempotent. Any thread that holds br. */
void body_end(struct body_reader *br);

/* Up to n body bytes into dst, waiting for the client as needed (poll(2) on the socket: the
 * caller is a handler's call on a thread, never a coroutine; the caller releases the GIL).
 * line: stop after a '\n'. Returns the bytes given (> 0), 0 at the body's end, or -errno:
 * -EFBIG (over max_body_bytes), -ETIMEDOUT (body_timeout without a byte, or slower than
 * min_body_rate), -EBADMSG (malformed chunked framing), -ECONNRESET (the client went away
 * before the end), -ECANCELED (the server's stop cut it), -ENOMEM. Errors are sticky. */
ssize_t body_read(struct body_reader *br, void *dst, size_t n, int line);

/* Drop the body bytes that have arrived and read on without waiting, until at most *budget
 * more bytes were dropped (decreased by those dropped). Returns 0 when the body has ended,
 * -EAGAIN when the rest must be waited for (the caller waits for the socket, readable or, with
 * br->wait_out, writable, then calls again), -E2BIG when the budget ran out, or a sticky error. The connection's coroutine. */
int body_drain(struct body_reader *br, uint64_t *budget);

/* The bytes after the body's end that were read with it (the next pipelined request):
 * *p and the count. Valid until body_end. */
size_t body_tail(const struct body_reader *br, const char **p);

/* The status a client should be answered with for br's error (0: none, or nobody to answer)
 * and its reason (static). */
static inline int body_error_status(const struct body_reader *br, const char **reason)
{
    *reason = br->reason ? br->reason : "request body unreadable";
    return br->err ? br->status : 0;
}

/* The streamed body of the request a handler was given, or NULL when its body is whole in
 * req->body. The handler's call. */
struct body_reader *body_of(const cyserve_request *req);

#endif
