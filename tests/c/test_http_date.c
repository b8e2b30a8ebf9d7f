/* test_http_date.c: IMF-fixdate formatting and parsing (csrc/http_date.c). */
#define _GNU_SOURCE
#include "csrc/http_date.c"

#include <errno.h>

#include "tap.h"

static void test_dates(void)
{
    char d[HTTP_DATE_SIZE];
    is_int(http_date_format(784111777, d), 29, "length 29");
    is_mem(d, strlen(d), "Sun, 06 Nov 1994 08:49:37 GMT", "RFC 9110's example");
    http_date_format(0, d);
    is_mem(d, strlen(d), "Thu, 01 Jan 1970 00:00:00 GMT", "epoch");
    http_date_format(951782400, d);
    is_mem(d, strlen(d), "Tue, 29 Feb 2000 00:00:00 GMT", "leap day");
    is_int(http_date_format((time_t)400000000000LL, d), 0, "year > 9999 refused");

    time_t t;
    is_int(http_date_parse("Sun, 06 Nov 1994 08:49:37 GMT", 29, &t), 0, "parse");
    is_int(t, 784111777, "parsed value");
    is_int(http_date_parse("Thu, 01 Jan 1970 00:00:00 GMT", 29, &t), 0, "parse epoch");
    is_int(t, 0, "epoch value");
    static const char *const bad[] = {
        "Sunday, 06-Nov-94 08:49:37 GMT", /* RFC 850 */
        "Sun Nov  6 08:49:37 1994",       /* asctime */
        "Sun, 06 Nov 1994 08:49:37 gmt",
        "Sun, 06 Foo 1994 08:49:37 GMT",
        "Xxx, 06 Nov 1994 08:49:37 GMT",
        "Sun, 31 Feb 1994 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:49:37 GMT",
        "Sun, 06 Nov 1994 08:60:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT ",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 0a Nov 1994 08:49:37 GMT",
        "",
    };
    for (size_t i = 0; i < N_ELEMENTS(bad); i++)
        is_int(http_date_parse(bad[i], strlen(bad[i]), &t), -EINVAL, bad[i]);
}

int main(void)
{
    test_dates();
    return done_testing();
}
