/* http_date.h: HTTP dates, in the one form cyserve sends and accepts: IMF-fixdate (RFC 9110
 * 5.6.7), "Sun, 06 Nov 1994 08:49:37 GMT". Error convention: 0 or -errno. Thread-safe: no state. */
#ifndef CYSERVE_HTTP_DATE_H
#define CYSERVE_HTTP_DATE_H

#include <stddef.h>
#include <time.h>

#define HTTP_DATE_LEN 29  /* the characters of an IMF-fixdate */
#define HTTP_DATE_SIZE 30 /* with the terminating NUL */

/* Write t as an IMF-fixdate into out (29 characters plus a NUL). Returns 29, or 0 if t cannot be
 * represented (a year outside 0..9999; out is then ""). Built by hand rather than with strftime,
 * whose %a and %b follow the process's LC_TIME. */
size_t http_date_format(time_t t, char out[HTTP_DATE_SIZE]);

/* Parse an IMF-fixdate into *out. Returns 0, or -EINVAL for anything else, including the obsolete
 * RFC 850 and asctime forms and dates that do not exist (31 Feb): RFC 9110 lets a recipient ignore
 * a date it cannot parse, and we only ever send this form, so conditional requests that echo our
 * Last-Modified back always use it. */
int http_date_parse(const char *s, size_t len, time_t *out);

#endif
