/* ws.h: the WebSocket protocol's codec (RFC 6455; prefix ws_): the opening handshake's checks and
 * its Sec-WebSocket-Accept, a zero-copy frame reader that enforces every rule a server must
 * (masking, fragmentation with control frames between the fragments, UTF-8 of text messages and
 * close reasons, close codes, the maximum message size), and the framing of what a server sends.
 * Knows nothing of connections or Python: the engine (ws_conn.c) drives it, the tests feed it
 * bytes. Parsers return bytes consumed, -1 (a protocol error, with the close code to send) or -2
 * (more bytes needed); the rest 0 or -errno. Any thread; no global state. */
#ifndef CYSERVE_WS_H
#define CYSERVE_WS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum ws_opcode {
    WS_OP_CONT = 0x0,
    WS_OP_TEXT = 0x1,
    WS_OP_BINARY = 0x2,
    WS_OP_CLOSE = 0x8,
    WS_OP_PING = 0x9,
    WS_OP_PONG = 0xA,
};

/* The close codes the engine sends or reports (RFC 6455 7.4.1). */
enum ws_close_code {
    WS_CLOSE_NORMAL = 1000,
    WS_CLOSE_GOING_AWAY = 1001,
    WS_CLOSE_PROTOCOL = 1002,
    WS_CLOSE_UNSUPPORTED = 1003,
    WS_CLOSE_NO_STATUS = 1005, /* a close frame without a code: never sent */
    WS_CLOSE_ABNORMAL = 1006,  /* the connection ended without a close frame: never sent */
    WS_CLOSE_INVALID_DATA = 1007,
    WS_CLOSE_POLICY = 1008,
    WS_CLOSE_TOO_BIG = 1009,
    WS_CLOSE_INTERNAL = 1011,
};

/* The longest frame head: 2 bytes, 8 of extended length, 4 of mask. */
#define WS_HEAD_MAX 14
/* The longest control frame payload (RFC 6455 5.5). */
#define WS_CONTROL_MAX 125
/* Sec-WebSocket-Accept's length: base64 of a SHA-1 digest. */
#define WS_ACCEPT_LEN 28

/* What the reader keeps between frames: the message being received and its validation. */
struct ws_reader {
    uint64_t max_message; /* a message (all its fragments) longer than this closes 1009; 0: none */
    int deflate;          /* permessage-deflate was negotiated: RSV1 marks a compressed message */
    int compressed;       /* the open message is compressed: its UTF-8 is checked after inflating */
    int message_op;       /* WS_OP_TEXT or WS_OP_BINARY while a fragmented message is open, or 0 */
    uint64_t message_len; /* bytes of the open message so far */
    uint32_t utf8;        /* the text message's UTF-8 validation state (0: at a character edge) */
    /* After -1: the close code to send, and why (a static string, for logs and tests). */
    int error;
    const char *error_text;
    /* After -2 once the head is complete: the whole frame's size, so the caller can make room
     * for it; 0 while the head itself is incomplete. */
    uint64_t need;
    /* An uncompressed text frame still incomplete: the bytes of its payload already validated
     * and the UTF-8 state after them, so that its text fails as soon as a bad byte is in (fail
     * fast) and no byte is validated twice. 0 between frames. */
    uint64_t partial_len;
    uint32_t partial_utf8;
};

/* One frame, as the reader returns it. payload points into the caller's buffer, unmasked in
 * place. For a data frame, opcode is the message's (TEXT or BINARY), also for its continuation
 * fragments, and fin says whether the message ends with it. For a close frame, code is its
 * status (WS_CLOSE_NO_STATUS when it carried none) and reason its UTF-8 text. */
struct ws_frame {
    int opcode;
    int fin;
    int first;      /* a data frame that starts a message */
    int compressed; /* a data frame of a compressed message (RSV1 on its first frame): its
                     * payload is deflate data, for ws_pmd_inflate */
    char *payload;
    uint64_t len;
    int code;
    const char *reason;
    size_t reason_len;
};

/* A reader for a new connection, messages bounded by max_message (0: unbounded). */
void ws_reader_init(struct ws_reader *r, uint64_t max_message);

/* Read one client frame from buf[0..len). With r->deflate set, RSV1 on a message's first frame
 * marks it compressed (f->compressed on each of its frames; its text is then not validated here,
 * ws_pmd_inflate does it on the inflated bytes); RSV1 elsewhere, RSV2 and RSV3 stay errors. Returns the bytes it took (> 0) and fills *f, its
 * payload unmasked in place (buf is modified only then); -2 when the frame is not complete
 * (r->need says how large it is once its head is in); -1 on a protocol error: r->error is the
 * close code (1002 protocol, 1007 invalid UTF-8, 1009 too big) and the connection must close.
 * A too-big message fails from its head, before its payload arrives; invalid UTF-8 in an
 * uncompressed text frame fails once the bad byte is in, before the frame is whole. After -2 the
 * caller must call again with the same frame at buf (and more of it): the reader remembers how
 * much of an incomplete text frame it validated. */
ssize_t ws_read_frame(struct ws_reader *r, char *buf, size_t len, struct ws_frame *f);

/* Write a server frame's head (unmasked) for opcode, fin and payload length into out. Returns
 * its length (2, 4 or 10). */
size_t ws_frame_head(unsigned char out[WS_HEAD_MAX], int opcode, int fin, uint64_t len);

/* A close frame's payload for code and reason[0..reason_len) into out: the code, then the
 * reason cut to fit 123 bytes at a character edge. Returns its length (0 for
 * WS_CLOSE_NO_STATUS, which is sent as an empty close). */
size_t ws_close_payload(char out[WS_CONTROL_MAX], int code, const char *reason, size_t reason_len);

/* Whether code may be sent in a close frame by an endpoint (1000-1003, 1007-1014, 3000-4999). */
int ws_close_code_valid(int code);

/* Validate UTF-8 incrementally: feed p[0..n) with *state (0 at the start). Returns 0 while valid
 * so far (*state says whether a character is open: nonzero), -1 as soon as a byte cannot be
 * valid (fail fast). A whole text is valid when it returns 0 with *state 0. */
int ws_utf8_feed(uint32_t *state, const unsigned char *p, size_t n);

/* Whether the comma-separated token list v[0..n) holds tok (case-insensitive, OWS around items,
 * as Connection: keep-alive, Upgrade). */
int ws_token_list_has(const char *v, size_t n, const char *tok);

/* The opening handshake's fields of one request. A field the request lacks is NULL. The engine
 * folds repeated Connection and Upgrade fields with any_token instead. */
struct ws_handshake {
    int is_get;
    int minor_version;
    int connection_upgrade; /* some Connection field lists "upgrade" */
    int upgrade_websocket;  /* some Upgrade field lists "websocket" */
    const char *key;
    size_t key_len;
    const char *version;
    size_t version_len;
};

/* Whether a request asks for a WebSocket at all (Upgrade lists websocket). */
static inline int ws_handshake_requested(const struct ws_handshake *h)
{
    return h->upgrade_websocket;
}

/* Check a handshake (RFC 6455 4.2.1). Returns 0 when valid, 426 when the version is not 13 (the
 * answer must carry Sec-WebSocket-Version: 13), 400 otherwise; *why says which rule failed. */
int ws_handshake_check(const struct ws_handshake *h, const char **why);

/* Sec-WebSocket-Accept for key[0..key_len) (SHA-1 of the key and the RFC's GUID, base64) into
 * out (WS_ACCEPT_LEN bytes, no terminator). 0, or -EINVAL when the key is not 24 characters of
 * base64 that decode to 16 bytes. */
int ws_accept(const char *key, size_t key_len, char out[WS_ACCEPT_LEN]);

/* ---- permessage-deflate (RFC 7692) ---- */

/* What a connection negotiated. */
struct ws_pmd_params {
    int server_no_context_takeover; /* the server resets its compressor after each message */
    int client_no_context_takeover; /* the client resets its own: the server's inflater may too */
    int server_max_window_bits;     /* 9..15: the window the server compresses with */
};

/* The longest Sec-WebSocket-Extensions value ws_pmd_negotiate writes, its NUL included. */
#define WS_PMD_RESPONSE_MAX 128

/* Choose among the offers of a Sec-WebSocket-Extensions value v[0..n) (the request's fields
 * joined with commas): the first permessage-deflate offer whose parameters are all known, given
 * once, well formed and within what the server can honour. Declined: unknown or repeated
 * parameters, a bad value, and server_max_window_bits=8, which zlib cannot keep to (it deflates
 * with 9 instead). client_max_window_bits is accepted with or without a value and not answered:
 * the inflater's 32 KiB window reads any smaller one. Returns the response's length (> 0), the
 * value written NUL-ended to out, with *p filled; 0 when no offer is acceptable (the connection
 * then speaks uncompressed). Any thread. */
size_t ws_pmd_negotiate(const char *v, size_t n, struct ws_pmd_params *p,
                        char out[WS_PMD_RESPONSE_MAX]);

/* The Sec-WebSocket-Extensions value that answers with p (as ws_pmd_negotiate writes it, after
 * a caller changed p, for instance to add a no_context_takeover the offer lacked: RFC 7692
 * 7.1.1.1 and 7.1.1.2 let a server add either), NUL-ended into out. Returns its length. */
size_t ws_pmd_response(const struct ws_pmd_params *p, char out[WS_PMD_RESPONSE_MAX]);

/* A growable heap buffer for whole messages (realloc'd; free ptr when done). */
struct ws_buf {
    char *ptr;
    size_t len, cap;
};

struct z_stream_s; /* zlib's, kept out of this header */

/* One connection's compression state; its zlib streams are made on first use, so a connection
 * that never sends or receives a compressed message costs nothing more. */
struct ws_pmd {
    struct ws_pmd_params p;
    struct z_stream_s *in, *out;
    int ended;     /* the message's deflate stream ended (BFINAL): the rest of it is ignored */
    int mem_level; /* zlib's memLevel for the deflater made (1..9; 0: 8, zlib's default) */
};

/* Start z with the negotiated p. Any thread. */
void ws_pmd_init(struct ws_pmd *z, const struct ws_pmd_params *p);

/* Free z's zlib streams. */
void ws_pmd_free(struct ws_pmd *z);

/* A frame of a compressed message (f->compressed, from ws_read_frame with r): inflate its payload
 * onto out (its first frame resets out->len to 0), and once it is the last, finish the message
 * (RFC 7692 7.2.2: the 00 00 FF FF the sender removed). Never lets out grow past
 * r->max_message + 1 bytes (0: unbounded): a message that inflates past it fails with 1009,
 * whatever its compressed size (a deflate bomb costs the server max_message, no more). A text
 * message's inflated bytes are validated as they come (fail fast, 1007). Returns 0; -1 with
 * r->error and r->error_text set (1007: bad deflate data or UTF-8; 1009: too big; 1011: out of
 * memory). The thread reading the connection. */
int ws_pmd_inflate(struct ws_pmd *z, struct ws_reader *r, const struct ws_frame *f,
                   struct ws_buf *out);

/* Compress a whole message p[0..n) onto out (out->len reset to 0) as permessage-deflate sends it:
 * one sync-flushed deflate run, its 00 00 FF FF tail removed; the sender sets RSV1 on the frame.
 * 0, -ENOMEM or -EIO. The thread writing the connection. */
int ws_pmd_deflate(struct ws_pmd *z, const char *p, size_t n, struct ws_buf *out);

#endif
