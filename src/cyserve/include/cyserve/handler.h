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

/* ---- GIL-free WebSocket handlers ----
 *
 * A WebSocket route (app.nogil_websocket) answers the opening handshake itself (RFC 6455 4.2:
 * a bad one gets 400 or 426 before any callback runs) and then calls the three functions of a
 * cyserve_ws_handler, each `noexcept nogil` in Cython, on the worker that serves the
 * connection, without the GIL, inside that connection's coroutine:
 *
 *   on_open     the handshake was valid. Return 0 to accept (101 Switching Protocols), anything
 *               else to refuse: resp is then the answer (403 unless the callback set a status).
 *               Headers it adds go out with the 101 too (Sec-WebSocket-Protocol, for one).
 *               req is valid during the call only. Frames sent here follow the 101.
 *   on_message  one whole message (fragments already joined, text already checked as UTF-8),
 *               data valid during the call only. Non-zero closes the connection with 1011.
 *   on_close    the connection ended; code is the client's close code (1005 when its close
 *               carried none), or what the server closed with (1001 a stop, 1002/1007/1009 a
 *               rule the client broke, 1011 on_message failed or no pong came in time), or
 *               1006 when the client went without a close. The last call for ws; ws is freed
 *               after it. Sends are refused (-EPIPE) from here on.
 *
 * on_message and on_close may be NULL. A cyserve_ws is valid from on_open until on_close
 * returns and may be used only from its own callbacks (it belongs to its connection's
 * coroutine): the send and close functions are exported by cyserve._core (_core.pxd).
 * Messages are uncompressed: permessage-deflate is not negotiated on this path. */
typedef struct cyserve_ws cyserve_ws;

enum { CYSERVE_WS_TEXT = 1, CYSERVE_WS_BINARY = 2 };

typedef struct cyserve_ws_handler {
    int (*on_open)(cyserve_ws *ws, cyserve_request *req, cyserve_response *resp, void *ctx);
    int (*on_message)(cyserve_ws *ws, int opcode, const char *data, size_t len, void *ctx);
    void (*on_close)(cyserve_ws *ws, int code, void *ctx);
} cyserve_ws_handler;

/* Name checked when a WebSocket handler capsule is registered. */
#define CYSERVE_WS_HANDLER_CAPSULE "cyserve.nogil_ws_handler"

static inline int cyserve_str_eq(cyserve_str s, const char *lit, size_t n)
{
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

#endif
