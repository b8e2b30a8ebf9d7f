# cython: language_level=3
# Extern declarations of csrc/router.h and csrc/files.h, for the engine's Cython code. Compiled
# into cyserve._core only (the C symbols live there). Contracts: see the headers.
from libc.stdint cimport uint64_t, int64_t
from posix.types cimport time_t

cdef extern from "cyserve/handler.h" nogil:
    ctypedef struct cyserve_str:
        const char *ptr
        size_t len
    ctypedef struct cyserve_param:
        cyserve_str name
        cyserve_str value
        int64_t ival

cdef extern from "csrc/router.h" nogil:
    # C's struct tags and functions share one namespace in Cython (router_match is both), so
    # the structs get a _t name here and their C spelling in quotes.
    ctypedef struct router_t "struct router":
        pass

    enum router_match_kind:
        ROUTER_PATH
        ROUTER_PREFIX
        ROUTER_REGEX

    enum:
        ROUTER_MAX_PARAMS
        ROUTER_ANY_METHOD

    unsigned ROUTER_METHOD_BIT(int method)

    ctypedef struct router_match_t "struct router_match":
        void *target
        cyserve_param params[16]
        size_t num_params
        unsigned allow
        size_t prefix_len
        router_match_kind kind

    int router_new(router_t **out)
    void router_free(router_t *r)
    int router_add(router_t *r, router_match_kind kind, const char *pattern, size_t len,
                   unsigned methods, void *target, char *err, size_t errlen)
    int router_match(const router_t *r, unsigned method_bit, const char *path, size_t len,
                     router_match_t *m)
    size_t router_format_allow(unsigned allow, char *buf, size_t size)

cdef extern from "csrc/files.h" nogil:
    ctypedef struct files_root_t "struct files_root":
        pass

    enum:
        FILES_DATE_SIZE
        FILES_ETAG_SIZE

    ctypedef struct files_hit_t "struct files_hit":
        int fd
        uint64_t size
        time_t mtime
        int64_t mtime_ns
        char etag[48]
        size_t etag_len
        char last_modified[30]
        const char *content_type
        size_t content_type_len
        unsigned encoding
        int vary

    ctypedef struct files_type_t "struct files_type":
        const char *ext
        const char *type

    enum:
        FILES_ENC_BR
        FILES_ENC_ZSTD
        FILES_ENC_GZIP

    int files_root_new(const char *path, files_root_t **out)
    int files_root_set_types(files_root_t *root, const files_type_t *types, size_t n)
    void files_root_set_encodings(files_root_t *root, unsigned encodings)
    void files_root_free(files_root_t *root)
    int files_open(const files_root_t *root, const char *rel, size_t len, files_hit_t *hit)
    int files_not_modified(const files_hit_t *hit, const char *inm, size_t inm_len,
                           const char *ims, size_t ims_len)
    int files_if_range(const files_hit_t *hit, const char *value, size_t len)
    int files_parse_range(const char *value, size_t len, uint64_t size, uint64_t *start,
                          uint64_t *end)
    size_t http_date_format(time_t t, char *out)
    int http_date_parse(const char *s, size_t len, time_t *out)
