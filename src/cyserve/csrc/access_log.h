/* access_log.h: one Common Log Format line per response (access_log.c), when
 * server_config.access_log_fd >= 0. Internal to the engine. */
#ifndef CYSERVE_ACCESS_LOG_H
#define CYSERVE_ACCESS_LOG_H

#include <stdint.h>

#include "request.h"

/* Note the status and the body bytes (-1: unknown) of the answer being written for rq, for
 * its line. Cheap enough to call whether the log is on or not. */
static inline void access_log_note(struct request *rq, int status, int64_t bytes)
{
    rq->log_status = status;
    rq->log_bytes = bytes;
}

/* Write rq's line (nothing when the log is off or no answer was noted), then forget the noted
 * answer. The thread serving rq. */
void access_log_write(struct request *rq);

#endif
