/*
 * config.h: the runner's stop flags beyond mr_stop() and mr_stopping()
 * (config.c, with the backends, the defaults and mr_isolation, which
 * metal_runner.h declares). Private to the daemon.
 */
#ifndef CONFIG_H
#define CONFIG_H

#define STOP_STDIN	(-1)	/* --exit-with-stdin: stdin closed */

/* The runner's SIGINT and SIGTERM handler. */
void mr_stop_signal(int sig);
/* Stop, saying why (a signal, or STOP_STDIN); what stopped it, 0 if
 * mr_stop() did or nothing has. */
void mr_stop_for(int why);
int mr_stop_why(void);
/* While set a second SIGINT or SIGTERM ends the program at once. */
void mr_stop_waiting(int on);
/* After a serve: a stop ends the next one only if it comes later. */
void mr_stop_reset(void);

#endif
