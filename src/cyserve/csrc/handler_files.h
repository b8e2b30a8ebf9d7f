/* handler_files.h: SERVER_FILES targets (handler_files.c). Internal to the engine. */
#ifndef CYSERVE_HANDLER_FILES_H
#define CYSERVE_HANDLER_FILES_H

#include "router.h"
#include "server.h"

struct http1_session;

/* Answer sv->rq from file target t (m: its route match, whose prefix is cut from the path).
 * Returns 0 or -errno (the connection must close). The serving coroutine. */
int hfiles_serve(struct http1_session *sv, const struct server_target *t,
                 const struct router_match *m, int keep, int head_only);

#endif
