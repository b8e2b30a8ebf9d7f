/* cyserve/handler.h: the C ABI of GIL-free request handlers. Shipped with the package;
 * cyserve.get_include() returns the folder that holds it.
 *
 * A handler is
 *     int handler(cyserve_request *req, cyserve_response *resp, void *ctx);
 * declared `noexcept nogil` in Cython. It runs on a worker thread without the GIL, inside the
 * connection's coroutine. It returns 0 when it has filled resp, or a non-zero value to make the
 * server answer 500. Everything reachable from req is a view into the connection's buffers: valid
 * until the handler returns, never to be freed. Memory a handler needs for the response comes
 * from cyserve_resp_alloc() (request-scoped arena: freed with the request, never by the handler).
 * The functions that act on req and resp are exported by cyserve._core (see _core.pxd). */
#ifndef CYSERVE_HANDLER_H
#define CYSERVE_HANDLER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct cyserve_str {
    const char *ptr;
    size_t len;
} cyserve_str;

typedef struct cyserve_header {
    cyserve_str name;
    cyserve_str value;
} cyserve_header;

/* A path parameter captured by a pattern route such as /users/{id:int}. For an int parameter,
 * ival holds the parsed value; for other types it is 0. */
typedef struct cyserve_param {
    cyserve_str name;
    cyserve_str value;
    int64_t ival;
} cyserve_param;

typedef struct cyserve_request {
    cyserve_str method;
    cyserve_str target; /* as received, e.g. /users/7?x=1 */
    cyserve_str path;   /* target up to '?', percent-decoding not applied */
    cyserve_str query;  /* after '?', empty if none */
    int minor_version;  /* HTTP/1.<minor_version> */
    const cyserve_header *headers;
    size_t num_headers;
    cyserve_str body; /* the whole body (de-chunked); empty if none */
    const cyserve_param *params;
    size_t num_params;
    void *engine; /* private */
} cyserve_request;

/* Opaque: only the exported functions touch it. */
typedef struct cyserve_response cyserve_response;

typedef int (*cyserve_nogil_handler)(cyserve_request *req, cyserve_response *resp, void *ctx);

/* Name checked when a handler capsule is registered. */
#define CYSERVE_HANDLER_CAPSULE "cyserve.nogil_handler"

static inline int cyserve_str_eq(cyserve_str s, const char *lit, size_t n)
{
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

#endif
