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
    if (UNLIKELY(gmtime_r(&t, &tm) == NULL || tm.tm_year + 1900 < 0 || tm.tm_year + 1900 > 9999)) {
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

static const char *const date_long_days[7] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                                              "Thursday", "Friday", "Saturday"};

static int date_month(const char *s)
{
    for (int i = 0; i < 12; i++)
        if (memcmp(s, date_months[i], 3) == 0)
            return i;
    return -1;
}

static int date_wday(const char *s)
{
    for (int i = 0; i < 7; i++)
        if (memcmp(s, date_days[i], 3) == 0)
            return i;
    return -1;
}

/* "hh:mm:ss" at s; -1 when malformed. */
static int date_clock(const char *s, int *hour, int *min, int *sec)
{
    if (s[2] != ':' || s[5] != ':')
        return -1;
    *hour = date_digits(s, 2);
    *min = date_digits(s + 3, 2);
    *sec = date_digits(s + 6, 2);
    return *hour < 0 || *hour > 23 || *min < 0 || *min > 59 || *sec < 0 || *sec > 60 ? -1 : 0;
}

static int date_finish(int mday, int mon, int year, int hour, int min, int sec, time_t *out)
{
    if (mon < 0 || mday < 1 || mday > 31 || year < 0)
        return -EINVAL;
    struct tm tm = {.tm_sec = sec == 60 ? 59 : sec,
                    .tm_min = min,
                    .tm_hour = hour,
                    .tm_mday = mday,
                    .tm_mon = mon,
                    .tm_year = year - 1900};
    time_t t = timegm(&tm);
    /* timegm normalises 31 Feb into March: reject dates that do not exist. */
    if (tm.tm_mday != mday || tm.tm_mon != mon)
        return -EINVAL;
    *out = t;
    return 0;
}

int http_date_parse(const char *s, size_t len, time_t *out)
{
    int hour, min, sec;
    if (len == HTTP_DATE_LEN && s[3] == ',') {
        /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
        if (s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' ||
            memcmp(s + 25, " GMT", 4) != 0 || date_wday(s) < 0 ||
            date_clock(s + 17, &hour, &min, &sec) < 0)
            return -EINVAL;
        return date_finish(date_digits(s + 5, 2), date_month(s + 8), date_digits(s + 12, 4), hour,
                           min, sec, out);
    }
    if (len == 24 && s[3] == ' ') {
        /* asctime: "Sun Nov  6 08:49:37 1994" (the day padded with a space) */
        if (s[7] != ' ' || s[10] != ' ' || s[19] != ' ' || date_wday(s) < 0 ||
            date_clock(s + 11, &hour, &min, &sec) < 0)
            return -EINVAL;
        int mday = s[8] == ' ' ? date_digits(s + 9, 1) : date_digits(s + 8, 2);
        return date_finish(mday, date_month(s + 4), date_digits(s + 20, 4), hour, min, sec, out);
    }
    /* RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT": a full day name, then 24 fixed characters. */
    const char *comma = memchr(s, ',', len < 10 ? len : 10);
    if (!comma || len - (size_t)(comma - s) != 24)
        return -EINVAL;
    size_t dn = (size_t)(comma - s);
    int wday = -1;
    for (int i = 0; i < 7; i++)
        if (strlen(date_long_days[i]) == dn && memcmp(s, date_long_days[i], dn) == 0)
            wday = i;
    const char *p = comma;
    if (wday < 0 || p[1] != ' ' || p[4] != '-' || p[8] != '-' || p[11] != ' ' || p[20] != ' ' ||
        memcmp(p + 21, "GMT", 3) != 0 || date_clock(p + 12, &hour, &min, &sec) < 0)
        return -EINVAL;
    int yy = date_digits(p + 9, 2);
    if (yy < 0)
        return -EINVAL;
    /* RFC 9110 5.6.7: a two-digit year that would be more than 50 years in the future is the
     * most recent past year with those digits. */
    struct tm now;
    time_t tnow = time(NULL);
    int cur = gmtime_r(&tnow, &now) ? now.tm_year + 1900 : 2000;
    int year = cur - cur % 100 + yy;
    if (year > cur + 50)
        year -= 100;
    return date_finish(date_digits(p + 2, 2), date_month(p + 5), year, hour, min, sec, out);
}
