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

#include "access_log.h"
#include "conn.h"
#include "files.h"
#include "http1.h"
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

int hfiles_serve(struct http1_session *sv, const struct server_target *t,
                       const struct router_match *m, int keep, int head_only)
{
    enum http_method meth = sv->rq.head.method_id;
    if (meth != HTTP_GET && meth != HTTP_HEAD)
        return http1_simple_response(sv, 405, "405 Method Not Allowed\n", "Allow: GET, HEAD\r\n",
                                     keep, 0);
    size_t pl = m->prefix_len <= sv->rq.head.path_len ? m->prefix_len : sv->rq.head.path_len;
    struct files_hit hit;
    int rc = files_open(t->root, sv->rq.head.path + pl, sv->rq.head.path_len - pl, &hit);
    if (rc == -EACCES)
        return http1_simple_response(sv, 403, "403 Forbidden\n", NULL, keep, head_only);
    if (rc == -EINVAL)
        return http1_simple_response(sv, 400, "400 Bad Request: invalid path\n", NULL, keep,
                                     head_only);
    if (rc == -ENOENT)
        return http1_simple_response(sv, 404, "404 Not Found\n", NULL, keep, head_only);
    /* Out of descriptors or memory is the server's state, not the file's: a 404 would be wrong
     * and cacheable. */
    if (rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM)
        return http1_simple_response(sv, 503, "503 Service Unavailable\n", "Retry-After: 1\r\n",
                                     keep, head_only);
    if (rc < 0)
        return http1_simple_response(sv, 500, "500 Internal Server Error\n", NULL, keep, head_only);
    const char *range, *if_range;
    size_t range_len, if_range_len;
    request_header_value(&sv->rq, "range", 5, &range, &range_len);
    request_header_value(&sv->rq, "if-range", 8, &if_range, &if_range_len);
    /* A Range whose If-Range no longer matches is ignored: the client gets the whole new file. */
    if (range && !files_if_range(&hit, if_range, if_range_len))
        range = NULL;
    char lines[512];
    int n = snprintf(lines, sizeof(lines), "ETag: %.*s\r\nLast-Modified: %s\r\n",
                     (int)hit.etag_len, hit.etag, hit.last_modified);
    if (hfiles_not_modified(&sv->rq, &hit)) {
        close(hit.fd);
        access_log_note(&sv->rq, 304, 0);
        return http_write_head(&sv->out, 304, sv->rq.head.minor_version, keep, 0, lines, (size_t)n,
                               http1_date());
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
            return http1_simple_response(sv, 416, "416 Range Not Satisfiable\n", cr, keep,
                                         head_only);
        }
        if (r == 0) {
            status = 206;
            count = end - start + 1;
            n += snprintf(lines + n, sizeof(lines) - (size_t)n,
                          "Content-Range: bytes %llu-%llu/%llu\r\n", (unsigned long long)start,
                          (unsigned long long)end, (unsigned long long)hit.size);
        }
    }
    if (status == 200)
        start = 0;
    n += snprintf(lines + n, sizeof(lines) - (size_t)n,
                  "Content-Type: %.*s\r\nAccept-Ranges: bytes\r\n", (int)hit.content_type_len,
                  hit.content_type);
    access_log_note(&sv->rq, status, head_only ? 0 : (int64_t)count);
    rc = http_write_head(&sv->out, status, sv->rq.head.minor_version, keep, count, lines, (size_t)n,
                         http1_date());
    if (!rc && !head_only && count) {
        rc = http1_flush(sv);
        if (!rc)
            rc = conn_sendfile(sv->c, hit.fd, start, count);
    }
    close(hit.fd);
    return rc;
}

