/* stream.h: streamed answers of Python handlers (stream.c). Internal to the engine. */
#ifndef CYSERVE_STREAM_H
#define CYSERVE_STREAM_H

#include "server.h"

struct http1_session;

/* Send the answer whose handler left sv->rq.resp.stream set: the head, the body so far, then
 * each piece the target's py_stream gives, until it ends; the stream is released (or kept as
 * an orphan when the server stops) in every case. Sets resp.close when the connection must
 * close after it. Returns 0 or -errno (the connection must close). The serving coroutine. */
int stream_send(struct http1_session *sv, const struct server_target *t, int keep, int head_only);

#endif
