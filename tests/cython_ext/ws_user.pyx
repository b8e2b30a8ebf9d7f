# cython: language_level=3
"""A third-party Cython module written against cyserve's GIL-free WebSocket API, for
tests/e2e/test_nogil_websocket.py: an echo whose messages can also ask for what the API offers
(a close with a code, a failing callback, a large message, per-connection data), and whose
on_close records the code it was told. It cimports cyserve._core and is built with
include_dirs=[cyserve.get_include()]."""

from libc.stdio cimport snprintf
from libc.stdlib cimport malloc, free, atoi
from libc.string cimport memcmp, memset

from cyserve._core cimport (
    cyserve_request, cyserve_response, cyserve_str, cyserve_req_header, cyserve_resp_status,
    cyserve_resp_header, cyserve_resp_write,
    cyserve_ws, cyserve_ws_handler, cyserve_ws_handler_capsule, cyserve_ws_send,
    cyserve_ws_close, cyserve_ws_set_data, cyserve_ws_data, CYSERVE_WS_TEXT, CYSERVE_WS_BINARY,
)

cdef extern from *:
    """
    #include <stdatomic.h>
    /* Shared by every worker thread, hence atomics. */
    static atomic_int wsu_opens, wsu_closes, wsu_last_code;
    static void wsu_opened(void) { atomic_fetch_add(&wsu_opens, 1); }
    static void wsu_closed(int code)
    {
        atomic_store(&wsu_last_code, code);
        atomic_fetch_add(&wsu_closes, 1);
    }
    static int wsu_get_opens(void) { return atomic_load(&wsu_opens); }
    static int wsu_get_closes(void) { return atomic_load(&wsu_closes); }
    static int wsu_get_last_code(void) { return atomic_load(&wsu_last_code); }
    """
    void wsu_opened() noexcept nogil
    void wsu_closed(int code) noexcept nogil
    int wsu_get_opens() noexcept nogil
    int wsu_get_closes() noexcept nogil
    int wsu_get_last_code() noexcept nogil


cdef struct conn_state:
    long messages


cdef bint starts(const char *data, size_t n, const char *lit, size_t m) noexcept nogil:
    return n >= m and memcmp(data, lit, m) == 0


cdef int on_open(cyserve_ws *ws, cyserve_request *req, cyserve_response *resp,
                 void *ctx) noexcept nogil:
    cdef cyserve_str v
    cdef conn_state *st
    if req.query.len == 4 and memcmp(req.query.ptr, b"deny", 4) == 0:
        cyserve_resp_status(resp, 401)
        cyserve_resp_header(resp, b"X-Why", 5, b"no", 2)
        cyserve_resp_write(resp, b"go away", 7)
        return 1
    if cyserve_req_header(req, b"sec-websocket-protocol", 22, &v) == 0 and \
            v.len >= 4 and memcmp(v.ptr, b"chat", 4) == 0:
        cyserve_resp_header(resp, b"Sec-WebSocket-Protocol", 22, b"chat", 4)
    st = <conn_state *>malloc(sizeof(conn_state))
    if st == NULL:
        return 1
    memset(st, 0, sizeof(conn_state))
    cyserve_ws_set_data(ws, st)
    wsu_opened()
    # A greeting sent from on_open goes out right behind the 101.
    if req.query.len == 5 and memcmp(req.query.ptr, b"hello", 5) == 0:
        return cyserve_ws_send(ws, CYSERVE_WS_TEXT, b"hello", 5)
    return 0


cdef char BIG[200000]


cdef int on_message(cyserve_ws *ws, int opcode, const char *data, size_t n,
                    void *ctx) noexcept nogil:
    cdef conn_state *st = <conn_state *>cyserve_ws_data(ws)
    cdef char buf[64]
    cdef int rc, k
    cdef size_t i, size
    st.messages += 1
    if opcode == CYSERVE_WS_TEXT and starts(data, n, b"close ", 6) and n < 40:
        memset(buf, 0, sizeof(buf))
        for i in range(n - 6):
            buf[i] = data[6 + i]
        rc = cyserve_ws_close(ws, atoi(buf), b"bye", 3)
        if rc != 0:
            k = snprintf(buf, sizeof(buf), b"close rc=%d", rc)
            return cyserve_ws_send(ws, CYSERVE_WS_TEXT, buf, <size_t>k)
        # Sending after the close is refused.
        rc = cyserve_ws_send(ws, CYSERVE_WS_TEXT, b"late", 4)
        return 0 if rc == -32 else -1
    if opcode == CYSERVE_WS_TEXT and n == 4 and memcmp(data, b"fail", 4) == 0:
        return -1
    if opcode == CYSERVE_WS_TEXT and n == 8 and memcmp(data, b"bad-utf8", 8) == 0:
        rc = cyserve_ws_send(ws, CYSERVE_WS_TEXT, b"\xff", 1)
        k = snprintf(buf, sizeof(buf), b"rc=%d", rc)
        return cyserve_ws_send(ws, CYSERVE_WS_TEXT, buf, <size_t>k)
    if opcode == CYSERVE_WS_TEXT and n == 5 and memcmp(data, b"count", 5) == 0:
        k = snprintf(buf, sizeof(buf), b"%ld", st.messages)
        return cyserve_ws_send(ws, CYSERVE_WS_TEXT, buf, <size_t>k)
    if opcode == CYSERVE_WS_TEXT and starts(data, n, b"big ", 4) and n < 40:
        memset(buf, 0, sizeof(buf))
        for i in range(n - 4):
            buf[i] = data[4 + i]
        size = <size_t>atoi(buf)
        if size > sizeof(BIG):
            return -1
        for i in range(size):
            BIG[i] = <char>(i % 251)
        # Two in a row: one queued small, then the large one written from here.
        rc = cyserve_ws_send(ws, CYSERVE_WS_TEXT, b"big:", 4)
        if rc == 0:
            rc = cyserve_ws_send(ws, CYSERVE_WS_BINARY, BIG, size)
        return rc
    return cyserve_ws_send(ws, opcode, data, n)


cdef void on_close(cyserve_ws *ws, int code, void *ctx) noexcept nogil:
    free(cyserve_ws_data(ws))
    wsu_closed(code)


cdef cyserve_ws_handler HANDLER
HANDLER.on_open = on_open
HANDLER.on_message = on_message
HANDLER.on_close = on_close

HANDLER_CAPSULE = cyserve_ws_handler_capsule(&HANDLER)


def counts():
    """(opens, closes, the last close code on_close was told)."""
    return wsu_get_opens(), wsu_get_closes(), wsu_get_last_code()


def capsule_of_null():
    """cyserve_ws_handler_capsule refuses a handler without on_open: raises ValueError."""
    cdef cyserve_ws_handler empty
    memset(&empty, 0, sizeof(empty))
    return cyserve_ws_handler_capsule(&empty)
