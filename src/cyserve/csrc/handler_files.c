/* handler_files.c: SERVER_FILES targets: a file beneath a root, answered with its validators
 * (ETag, Last-Modified), conditional requests (304), ranges (206, 416) and sendfile. What a path
 * may open and the header values themselves are files.c's; this is the glue to a request. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "handler_files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "files.h"
#include "request.h"

/* files_not_modified() over every If-None-Match line: a list may be split across several field
 * lines (RFC 9110 5.3), and a tag matching on any of them counts. Without If-None-Match the
 * (first) If-Modified-Since decides. */
static int hfiles_not_modified(const struct request *rq, const struct files_hit *hit)
{
    int seen = 0;
    for (size_t i = 0; i < rq->head.num_headers; i++) {
        const struct http_header *h = &rq->hdrs[i];
        if (h->name_len == 13 && strncasecmp(h->name, "if-none-match", 13) == 0) {
            if (files_not_modified(hit, h->value, h->value_len, NULL, 0))
                return 1;
            seen = 1;
        }
    }
    if (seen)
        return 0;
    const char *ims;
    size_t ims_len;
    request_header_value(rq, "if-modified-since", 17, &ims, &ims_len);
    return files_not_modified(hit, NULL, 0, ims, ims_len);
}

void hfiles_serve(struct request *rq, const struct server_target *t, const struct router_match *m)
{
    struct request_answer *a = &rq->answer;
    char *abuf = rq->answer_lines;
    enum http_method meth = rq->head.method_id;
    if (meth != HTTP_GET && meth != HTTP_HEAD) {
        request_answer_simple(a, abuf, 256, 405, "405 Method Not Allowed\n",
                              "Allow: GET, HEAD\r\n");
        return;
    }
    size_t pl = m->prefix_len <= rq->head.path_len ? m->prefix_len : rq->head.path_len;
    struct files_hit hit;
    int rc;
    if (files_root_encodings(t->root) == 0) {
        rc = files_open(t->root, rq->head.path + pl, rq->head.path_len - pl, &hit);
    } else {
        /* The root has precompressed siblings: every Accept-Encoding line is read (a list may
         * be split across several, RFC 9110 5.3). */
        struct files_accept acc;
        files_accept_init(&acc);
        for (size_t i = 0; i < rq->head.num_headers; i++) {
            const struct http_header *h = &rq->hdrs[i];
            if (h->name_len == 15 && strncasecmp(h->name, "accept-encoding", 15) == 0)
                files_accept_add(&acc, h->value, h->value_len);
        }
        rc = files_open_negotiated(t->root, rq->head.path + pl, rq->head.path_len - pl, &acc, &hit);
    }
    if (rc == -EACCES) {
        request_answer_simple(a, abuf, 256, 403, "403 Forbidden\n", NULL);
        return;
    }
    if (rc == -EINVAL) {
        request_answer_simple(a, abuf, 256, 400, "400 Bad Request: invalid path\n", NULL);
        return;
    }
    if (rc == -ENOENT) {
        request_answer_simple(a, abuf, 256, 404, "404 Not Found\n", NULL);
        return;
    }
    /* Out of descriptors or memory is the server's state, not the file's: a 404 would be wrong
     * and cacheable. */
    if (rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM) {
        request_answer_simple(a, abuf, 256, 503, "503 Service Unavailable\n", "Retry-After: 1\r\n");
        return;
    }
    if (rc < 0) {
        request_answer_simple(a, abuf, 256, 500, "500 Internal Server Error\n", NULL);
        return;
    }
    const char *range, *if_range;
    size_t range_len, if_range_len;
    /* Range and If-Range may appear once (RFC 9110 5.3): repeated, neither copy is used and the
     * whole file is sent, as a server may always ignore Range (RFC 9110 14.2). */
    http_field_once(rq->hdrs, rq->head.num_headers, "range", 5, &range, &range_len);
    if (http_field_once(rq->hdrs, rq->head.num_headers, "if-range", 8, &if_range, &if_range_len) >
        1)
        range = NULL;
    /* A Range whose If-Range no longer matches is ignored: the client gets the whole new file. */
    if (range && !files_if_range(&hit, if_range, if_range_len))
        range = NULL;
    char *lines = abuf;
    size_t cap = sizeof(rq->answer_lines);
    int n = snprintf(lines, cap, "ETag: %.*s\r\nLast-Modified: %s\r\n%s", (int)hit.etag_len,
                     hit.etag, hit.last_modified, hit.vary ? "Vary: Accept-Encoding\r\n" : "");
    if (hfiles_not_modified(rq, &hit)) {
        close(hit.fd);
        *a = (struct request_answer){
            .kind = REQUEST_BODY_BYTES,
            .status = 304,
            .lines = lines,
            .lines_len = (size_t)n,
            .length = 0,
            .fd = -1,
        };
        return;
    }
    int status = 200;
    uint64_t start = 0, end = hit.size ? hit.size - 1 : 0, count = hit.size;
    if (range) {
        int r = files_parse_range(range, range_len, hit.size, &start, &end);
        if (r == -ERANGE) {
            close(hit.fd);
            char cr[96];
            snprintf(cr, sizeof(cr), "Content-Range: bytes */%llu\r\n",
                     (unsigned long long)hit.size);
            request_answer_simple(a, abuf, 256, 416, "416 Range Not Satisfiable\n", cr);
            return;
        }
        if (r == 0) {
            status = 206;
            count = end - start + 1;
            n += snprintf(lines + n, cap - (size_t)n, "Content-Range: bytes %llu-%llu/%llu\r\n",
                          (unsigned long long)start, (unsigned long long)end,
                          (unsigned long long)hit.size);
        }
    }
    if (status == 200)
        start = 0;
    n += snprintf(lines + n, cap - (size_t)n, "Content-Type: %.*s\r\nAccept-Ranges: bytes\r\n",
                  (int)hit.content_type_len, hit.content_type);
    if (hit.encoding)
        n += snprintf(lines + n, cap - (size_t)n, "Content-Encoding: %s\r\n",
                      files_encoding_name(hit.encoding));
    *a = (struct request_answer){
        .kind = REQUEST_BODY_FILE,
        .status = status,
        .lines = lines,
        .lines_len = (size_t)n,
        .length = count,
        .body_len = count,
        .fd = hit.fd,
        .offset = start,
    };
}
