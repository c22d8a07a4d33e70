/*
 * migrate/errbuf.c -- the formatter of the library's messages (errbuf.h).
 */
#include <stdarg.h>
#include <stdio.h>

#include "errbuf.h"

/* See errbuf.h. */
ks_err ks_errbuf_fail(char *errbuf, size_t errbuf_len, ks_err err, const char *fmt, ...)
{
    if (errbuf != NULL && errbuf_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(errbuf, errbuf_len, fmt, ap);
        va_end(ap);
        if (n < 0)
            errbuf[0] = '\0';
    }
    return err;
}
