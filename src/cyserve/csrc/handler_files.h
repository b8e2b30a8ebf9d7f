/* handler_files.h: SERVER_FILES targets (handler_files.c). Internal to the engine. */
#ifndef CYSERVE_HANDLER_FILES_H
#define CYSERVE_HANDLER_FILES_H

#include "router.h"
#include "server.h"

struct request;

/* Answer rq from file target t (m: its route match, whose prefix is cut from the path): fill
 * rq->answer, with the open file (REQUEST_BODY_FILE) when there is one to send. The serving
 * coroutine. */
void hfiles_serve(struct request *rq, const struct server_target *t, const struct router_match *m);

#endif
