/* handler_static.h: SERVER_STATIC targets and the memfds of large bodies (handler_static.c).
 * Internal to the engine; server_target_static() and server_target_clear() are in server.h. */
#ifndef CYSERVE_HANDLER_STATIC_H
#define CYSERVE_HANDLER_STATIC_H

#include <stddef.h>

#include "server.h"

/* The sealed memfd holding the process-lifetime body ptr[0..len) (resp_set_body_static), made
 * by the first response that sends it; -1 when there is none (table full, no memfd): send from
 * memory. Any worker. */
int static_ext_memfd(struct server *s, const char *ptr, size_t len);

/* A new sealed memfd holding a copy of body[0..len) (its contents can never change), or -1
 * when the kernel gives none (no memfd_create, no memory): the caller keeps the bytes in
 * memory. The caller owns the descriptor. Any thread. */
int static_body_memfd(const char *body, size_t len);

#endif
