/*
 * tools/cli/textfile.h -- write a Prometheus text file for
 * node_exporter's textfile collector (docs/prometheus.md): into a
 * temporary file in the collector's directory, flushed to disk, then
 * renamed over the final name, so that a scrape reads the old text or the
 * new one, never half of one.  A tool's header: nothing here is part of
 * the library.
 */
#ifndef KS_TOOLS_TEXTFILE_H
#define KS_TOOLS_TEXTFILE_H

#include <stddef.h>

/* Write text[0, len) to DIR/name atomically (a temporary file
 * DIR/.name.PID.tmp, fsync, rename, fsync of DIR).  EX_OK, or an exit
 * code after a message on standard error (EX_CANTCREAT when the file
 * cannot be created or written, EX_NOINPUT when dir is not a directory);
 * the temporary file is removed on failure. */
int ks_cli_textfile_write(const char *dir, const char *name, const char *text, size_t len);

#endif /* KS_TOOLS_TEXTFILE_H */
