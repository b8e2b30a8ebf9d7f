/* http_date.c: IMF-fixdate formatting and parsing (RFC 9110 5.6.7), for the Date header, for
 * Last-Modified and for If-Modified-Since / If-Range. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* timegm */
#endif
#include "http_date.h"

#include <errno.h>
#include <string.h>

#include "compat.h"


static const char date_days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
static const char date_months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                          "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

static void date_put2(char *p, int v)
{
    p[0] = (char)('0' + v / 10);
    p[1] = (char)('0' + v % 10);
}

size_t http_date_format(time_t t, char out[HTTP_DATE_SIZE])
{
    /* Built by hand, not with strftime: %a and %b follow LC_TIME, which the Python process
     * may have set, and HTTP dates are always English. */
    struct tm tm;
    if (UNLIKELY(gmtime_r(&t, &tm) == NULL || tm.tm_year + 1900 < 0 ||
                 tm.tm_year + 1900 > 9999)) {
        out[0] = '\0';
        return 0;
    }
    int year = tm.tm_year + 1900;
    memcpy(out, date_days[tm.tm_wday], 3);
    out[3] = ',';
    out[4] = ' ';
    date_put2(out + 5, tm.tm_mday);
    out[7] = ' ';
    memcpy(out + 8, date_months[tm.tm_mon], 3);
    out[11] = ' ';
    date_put2(out + 12, year / 100);
    date_put2(out + 14, year % 100);
    out[16] = ' ';
    date_put2(out + 17, tm.tm_hour);
    out[19] = ':';
    date_put2(out + 20, tm.tm_min);
    out[22] = ':';
    date_put2(out + 23, tm.tm_sec);
    memcpy(out + 25, " GMT", 5);
    return 29;
}

static int date_digits(const char *s, size_t n)
{
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

int http_date_parse(const char *s, size_t len, time_t *out)
{
    /* "Sun, 06 Nov 1994 08:49:37 GMT" */
    if (len != 29 || s[3] != ',' || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' ||
        s[19] != ':' || s[22] != ':' || memcmp(s + 25, " GMT", 4) != 0)
        return -EINVAL;
    int wday = -1, mon = -1;
    for (int i = 0; i < 7; i++)
        if (memcmp(s, date_days[i], 3) == 0)
            wday = i;
    for (int i = 0; i < 12; i++)
        if (memcmp(s + 8, date_months[i], 3) == 0)
            mon = i;
    int mday = date_digits(s + 5, 2), year = date_digits(s + 12, 4);
    int hour = date_digits(s + 17, 2), min = date_digits(s + 20, 2);
    int sec = date_digits(s + 23, 2);
    if (wday < 0 || mon < 0 || mday < 1 || mday > 31 || year < 0 || hour < 0 || hour > 23 ||
        min < 0 || min > 59 || sec < 0 || sec > 60)
        return -EINVAL;
    struct tm tm = {.tm_sec = sec == 60 ? 59 : sec, .tm_min = min, .tm_hour = hour,
                    .tm_mday = mday, .tm_mon = mon, .tm_year = year - 1900};
    time_t t = timegm(&tm);
    /* timegm normalises 31 Feb into March: reject dates that do not exist. */
    if (tm.tm_mday != mday || tm.tm_mon != mon)
        return -EINVAL;
    *out = t;
    return 0;
}
