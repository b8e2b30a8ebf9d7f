/* test_http_method.c: the method enum's values and names, which the router and the Cython layer
 * rely on. */
#include "csrc/http_method.h"

#include "tap.h"

int main(void)
{
    /* The numbering is an interface (router bits, the Cython layer's method bits): pinned. */
    is_int(HTTP_OTHER, 0, "OTHER is 0");
    is_int(HTTP_GET, 1, "GET is 1");
    is_int(HTTP_TRACE, 9, "TRACE is 9");
    is_int(HTTP_METHOD_COUNT, 10, "ten values");
    static const char *const names[] = {NULL,     "GET",   "HEAD",    "POST",    "PUT",
                                        "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"};
    for (int m = HTTP_OTHER; m < HTTP_METHOD_COUNT; m++) {
        const char *got = http_method_name((enum http_method)m);
        if (names[m])
            ok(got && strcmp(got, names[m]) == 0, "name of %d is %s", m, names[m]);
        else
            ok(got == NULL, "OTHER has no name");
    }
    ok(http_method_name((enum http_method)HTTP_METHOD_COUNT) == NULL, "out of range: no name");
    return done_testing();
}
