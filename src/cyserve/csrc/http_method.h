/* http_method.h: the request methods the engine tells apart (enum http_method), and their names.
 *
 * Its own header because it is not HTTP/1's: the HTTP/1 parser (http_parse.h) sets a request's
 * method from these, and the router (router.h) keeps one bit per method, 1u << value, without
 * needing the parser. The values are an interface: ROUTER_METHOD_BIT is built from them, and the
 * Cython layer numbers its method bits the same way (native/server.pyx), so a new method goes at
 * the end and none is ever renumbered. Constants only: any thread. */
#ifndef CYSERVE_HTTP_METHOD_H
#define CYSERVE_HTTP_METHOD_H

#include <stddef.h>

enum http_method {
    HTTP_OTHER = 0, /* a valid token that is not one of these */
    HTTP_GET,
    HTTP_HEAD,
    HTTP_POST,
    HTTP_PUT,
    HTTP_DELETE,
    HTTP_PATCH,
    HTTP_OPTIONS,
    HTTP_CONNECT,
    HTTP_TRACE,
};

/* One past the last named method: the named ones are HTTP_GET .. HTTP_METHOD_COUNT - 1. */
#define HTTP_METHOD_COUNT (HTTP_TRACE + 1)

/* The name of a named method ("GET"), or NULL for HTTP_OTHER and values out of range. */
static inline const char *http_method_name(enum http_method m)
{
    /* One method a line: a table read down the methods. */
    /* clang-format off */
    switch (m) {
    case HTTP_GET: return "GET";
    case HTTP_HEAD: return "HEAD";
    case HTTP_POST: return "POST";
    case HTTP_PUT: return "PUT";
    case HTTP_DELETE: return "DELETE";
    case HTTP_PATCH: return "PATCH";
    case HTTP_OPTIONS: return "OPTIONS";
    case HTTP_CONNECT: return "CONNECT";
    case HTTP_TRACE: return "TRACE";
    default: return NULL;
    }
    /* clang-format on */
}

#endif
