/*
 * log.c: timestamped log lines on stderr, one write per line so lines
 * from concurrent sessions never interleave.
 *
 * Levels, by log_verbose: notices are the few lines an operator reads as
 * sshd's: a client came, authenticated, left, the runner stopped; never
 * one per request. info (-v) adds a session's details and every failed
 * request, debug (-vv) every kernel. -q (-1) keeps only errors.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "metal_runner.h"

int log_verbose;

static void
log_line(const char *level, const char *fmt, va_list ap)
{
	char line[1024];
	struct tm tm;
	time_t now = time(NULL);
	int n;

	localtime_r(&now, &tm);
	n = (int)strftime(line, sizeof(line), "%H:%M:%S ", &tm);
	n += snprintf(line + n, sizeof(line) - (size_t)n, "%s", level);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, (size_t)n);
}

void
log_notice(const char *fmt, ...)
{
	va_list ap;

	if (log_verbose < 0)
		return;
	va_start(ap, fmt);
	log_line("", fmt, ap);
	va_end(ap);
}

void
log_info(const char *fmt, ...)
{
	va_list ap;

	if (log_verbose < 1)
		return;
	va_start(ap, fmt);
	log_line("", fmt, ap);
	va_end(ap);
}

void
log_warn(const char *fmt, ...)
{
	va_list ap;

	if (log_verbose < 0)
		return;
	va_start(ap, fmt);
	log_line("warning: ", fmt, ap);
	va_end(ap);
}

/* What stops the runner: always shown, and not to be mistaken for a
 * warning it carries on after. */
void
log_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_line("error: ", fmt, ap);
	va_end(ap);
}

void
log_debug(const char *fmt, ...)
{
	va_list ap;

	if (log_verbose < 2)
		return;
	va_start(ap, fmt);
	log_line("", fmt, ap);
	va_end(ap);
}
