/* stream.h: streamed answers of Python handlers (stream.c): the protocol that sends such an
 * answer pulls its pieces with stream_next() and gives it back with stream_abandon(). Internal
 * to the engine. */
#ifndef CYSERVE_STREAM_H
#define CYSERVE_STREAM_H

#include "server.h"

struct request;

/* Put the next piece of stream (target t) into rq->resp's body, by an offloaded call of the
 * target's py_stream. Returns 0 with *more set: 1 more follows, 0 that was the last (the stream
 * is released), -1 the handler failed (released; nothing more can be sent). Returns -errno when
 * the call could not be made (the server is stopping): the stream is kept as an orphan for
 * server_take_orphan. The serving coroutine. */
int stream_next(struct request *rq, const struct server_target *t, void *stream, int *more);

/* Give stream back to its handler (the client left, or the answer was cut), or keep it as an
 * orphan when no call can be made any more. The serving coroutine. */
void stream_abandon(struct request *rq, const struct server_target *t, void *stream);

#endif
