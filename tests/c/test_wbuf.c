/* test_wbuf.c: growable byte buffers: caller storage first, the heap once outgrown. */
#define _GNU_SOURCE
#include "csrc/wbuf.c"

#include "tap.h"

static void test_storage_then_heap(void)
{
    char st[8];
    struct wbuf b;
    wbuf_init(&b, st, sizeof(st));
    is_int(wbuf_append(&b, "abcdef", 6), 0, "append into storage");
    ok(b.ptr == st && b.heap == NULL, "still in the caller's storage");
    is_int(wbuf_reserve(&b, 2), 0, "reserve what fits");
    ok(b.ptr == st, "a reserve that fits does not move");
    is_int(wbuf_append(&b, "ghijk", 5), 0, "append past the storage");
    ok(b.heap != NULL && b.ptr == b.heap, "moved to the heap");
    ok(b.cap >= 11, "capacity covers the bytes");
    is_mem(b.ptr, b.len, "abcdefghijk", "bytes kept across the move");
    char big[5000];
    memset(big, 'z', sizeof(big));
    is_int(wbuf_append(&b, big, sizeof(big)), 0, "heap buffer grows again");
    is_int(b.len, 5011, "length");
    ok(b.ptr[5010] == 'z' && b.ptr[0] == 'a', "content kept across realloc");
    is_int(wbuf_reserve(&b, SIZE_MAX), -ENOMEM, "an impossible size is -ENOMEM");
    is_int(b.len, 5011, "and leaves the buffer unchanged");
    wbuf_free(&b);
    ok(b.ptr == NULL && b.len == 0 && b.cap == 0, "free empties the buffer");
}

static void test_no_storage(void)
{
    struct wbuf b;
    wbuf_init(&b, NULL, 100);
    is_int(b.cap, 0, "no storage: no capacity whatever cap says");
    is_int(wbuf_append(&b, "x", 0), 0, "empty append");
    is_int(b.len, 0, "nothing appended");
    is_int(wbuf_append(&b, "xy", 2), 0, "first append allocates");
    is_mem(b.ptr, b.len, "xy", "bytes");
    wbuf_free(&b);
}

int main(void)
{
    test_storage_then_heap();
    test_no_storage();
    return done_testing();
}
