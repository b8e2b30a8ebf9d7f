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
    /* RFC 9110 5.6.7: a recipient MUST accept the two obsolete forms too. */
    is_int(http_date_parse("Sunday, 06-Nov-94 08:49:37 GMT", 30, &t), 0, "RFC 850");
    is_int(t, 784111777, "RFC 850 value");
    is_int(http_date_parse("Sun Nov  6 08:49:37 1994", 24, &t), 0, "asctime");
    is_int(t, 784111777, "asctime value");
    is_int(http_date_parse("Tue Feb 29 00:00:00 2000", 24, &t), 0, "asctime, two-digit day");
    is_int(t, 951782400, "asctime two-digit day value");
    /* "94" read in 2026 would be 68 years ahead, so it was 1994 (above); "70" would be 44 years
     * ahead, so it is 2070 (until 2070 - 50). */
    is_int(http_date_parse("Tuesday, 01-Jan-70 00:00:00 GMT", 31, &t), 0, "RFC 850, 70");
    is_int(t, 3155760000LL, "RFC 850 two-digit year within 50 years ahead");
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char d850[64];
    snprintf(d850, sizeof(d850), "Monday, 01-Jan-%02d 00:00:00 GMT", (tm.tm_year + 1900 + 1) % 100);
    is_int(http_date_parse(d850, strlen(d850), &t), 0, "RFC 850, next year");
    ok(t > now && t - now < 400 * 86400, "two digits one year ahead stay in this century");
    static const char *const bad[] = {
        "Sunday, 06-Nov-94 08:49:37 gmt",
        "Sundae, 06-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sunday,06-Nov-94 08:49:37 GMT ",
        "Sunday, 31-Feb-94 08:49:37 GMT",
        "Sun Nov 6 08:49:37 1994",
        "Sun Nov  6 08:49:37 94  ",
        "Sun Nov  6 25:49:37 1994",
        "Sun Xxx  6 08:49:37 1994",
        "Sun Nov 0a 08:49:37 1994",
        "Sun Nov  0 08:49:37 1994",
        ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,",
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
