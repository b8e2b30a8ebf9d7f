/* http_date.h: HTTP dates. cyserve sends IMF-fixdate (RFC 9110 5.6.7), "Sun, 06 Nov 1994
 * 08:49:37 GMT", and reads all three forms. Error convention: 0 or -errno. Thread-safe: no state
 * (parsing reads the clock for RFC 850's two-digit years). */
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

/* Parse an HTTP date into *out: an IMF-fixdate, or one of the two obsolete forms RFC 9110 5.6.7
 * obliges a recipient to accept, RFC 850 ("Sunday, 06-Nov-94 08:49:37 GMT"; a two-digit year
 * more than 50 years ahead is taken from the past century) and asctime ("Sun Nov  6 08:49:37
 * 1994"). Returns 0, or -EINVAL for anything else and for dates that do not exist (31 Feb): the
 * caller then ignores the header, as RFC 9110 allows. */
int http_date_parse(const char *s, size_t len, time_t *out);

#endif
