/*
 * main.c: command-line arguments around mr_serve(), the token file and
 * its reload on SIGHUP, and DNS-SD advertising (advertise.h).
 *
 * On SIGHUP mr_serve() calls on_hup() from its accept loop, so the file is
 * read outside a signal handler; session processes ignore SIGHUP. A file
 * that cannot be read at SIGHUP leaves the token as it was.
 */
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "advertise.h"
#include "metal_runner.h"

struct listen_arg {
	const char *advertise;		/* --advertise, "" for the default name */
	const char *backend;
	int auth;
	int failed;
};

static void
usage(FILE *f)
{
	fprintf(f,
"usage: metal_runner [options]\n"
"Run tinygrad kernels sent by clients over TCP (see protocol.md).\n"
"\n"
"  -H, --host ADDR         address to bind (default 127.0.0.1)\n"
"  -p, --port N            TCP port (default 6667; 0 picks a free one)\n"
"  -b, --backend NAME      metal or cpu (default: metal on macOS, else cpu)\n"
"  -d, --device N          device index for the metal backend\n"
"  -v, --verbose           log each session's details and failed requests;\n"
"                          twice: every kernel and its time\n"
"  -q, --quiet             log only errors\n"
"      --isolation MODE    process, thread or spawn (default: process):\n"
"                          a process per session, forked (cpu) or, for\n"
"                          metal, spawned fresh (it cannot fork); spawn:\n"
"                          cpu spawned too; thread: one process, a thread\n"
"                          per session\n"
"      --token-file PATH   require clients to prove they know this secret\n"
"      --allow-unauthenticated\n"
"                          allow a non-loopback --host without a token\n"
"      --max-msg BYTES     largest frame (default 64M)\n"
"      --session-mem BYTES buffer memory per session (default: no limit)\n"
"      --total-mem BYTES   buffer memory of all sessions (default: device)\n"
"      --max-handles N     buffers, and programs, and graphs: each, per\n"
"                          session (default 65536)\n"
"      --max-sessions N    sessions at once (default 64)\n"
"      --max-startups N    connections in their handshake at once\n"
"                          (default: --max-sessions, at least 10)\n"
"      --handshake-timeout S\n"
"                          close a connection that has not finished its\n"
"                          handshake in S seconds (default 10; 0: never)\n"
"      --frame-timeout S   end a session stalled mid-frame (default 60)\n"
"      --resume-grace S    keep a session whose link dropped S seconds\n"
"                          for its client to resume (default 60; 0: off)\n"
"      --resume-log BYTES  replies a session keeps to send again on a\n"
"                          resume (default 4M, 64K..4G)\n"
"      --idle-timeout S    end a session idle this long (default: never)\n"
"      --kernel-timeout S  end a session whose CPU kernel runs longer\n"
"                          (process isolation; default: no limit)\n"
"      --user NAME         run session processes as this user (a runner\n"
"                          started as root; without it they run as root)\n"
"      --no-confine        do not restrict the system calls of session\n"
"                          processes (Linux: seccomp; for valgrind)\n"
"      --cache-dir DIR     keep written data marked for it by clients (and\n"
"                          what they then name by SHA-256) in DIR, shared\n"
"                          by all sessions (default: no cache)\n"
"      --cache-size BYTES  bound the cache on disk (default 4G); the least\n"
"                          recently used content goes first\n"
"      --advertise[=NAME]  announce the runner with DNS-SD as\n"
"                          _metal-runner._tcp (default name: the host's);\n"
"                          refused without --token-file beyond loopback\n"
"      --exit-with-stdin   stop (as on SIGTERM) when stdin reaches its end:\n"
"                          a program that starts the runner with a pipe as\n"
"                          its stdin ends it by ending, however it ends\n"
"  -h, --help              show this help\n"
"  -V, --version           show the version\n"
"\n"
"Sizes take a K, M or G suffix. Once it listens the runner prints\n"
"\"listening on HOST:PORT\" on stdout (with --port 0, the port chosen),\n"
"and nothing else there. Its log goes to stderr: a start-up line with\n"
"the backend and the address; by default one line when a client\n"
"connects (its address and session number), authenticates, and ends\n"
"(how, its time, requests and bytes), one when a peer runner connects,\n"
"one when a signal stops it; nothing per request. SIGINT and SIGTERM\n"
"end the sessions and exit 0. SIGHUP reads the token file again.\n");
}

/* A mistake on the command line: getopt (or the caller) has named it in one
 * line; the whole help would bury that line. */
static int
usage_error(void)
{
	fprintf(stderr, "usage: metal_runner [options]; see metal_runner --help\n");
	return 2;
}

static int
parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *s == '-')
		return -1;
	switch (*end) {
	case 'G': case 'g':
		shift = 30;
		break;
	case 'M': case 'm':
		shift = 20;
		break;
	case 'K': case 'k':
		shift = 10;
		break;
	}
	if (shift != 0)
		end++;
	if (*end != '\0' || v > (UINT64_MAX >> shift))
		return -1;
	v <<= shift;
	*out = v;
	return 0;
}

static int
parse_int(const char *s, int min, int max, int *out)
{
	uint64_t v;

	if (parse_size(s, &v) == -1 || v < (uint64_t)min || v > (uint64_t)max)
		return -1;
	*out = (int)v;
	return 0;
}

/* The whole file is the secret; a trailing newline from an editor is not.
 * NULL with a message in err if the file cannot be used. */
static uint8_t *
read_token(const char *path, size_t *len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *buf;
	size_t n;

	if (f == NULL) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fileno(f), &st) == -1) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		fclose(f);
		return NULL;
	}
	/* A secret that others may read is not this runner's alone: refused,
	 * as ssh refuses such a key, with the command that fixes it. Ours must
	 * be closed to group and others; another owner's (a service's token,
	 * root's and readable by the service's group) to others. */
	if (st.st_uid == getuid() && (st.st_mode & 077) != 0) {
		snprintf(err, errlen, "%s: the token file is open to group or "
		    "others (mode %04o), as a secret must not be: chmod 600 %s",
		    path, (unsigned)(st.st_mode & 07777), path);
		fclose(f);
		return NULL;
	}
	if ((st.st_mode & 007) != 0) {
		snprintf(err, errlen, "%s: the token file is open to others "
		    "(mode %04o), as a secret must not be: chmod o-rwx %s", path,
		    (unsigned)(st.st_mode & 07777), path);
		fclose(f);
		return NULL;
	}
	/* One byte more than allowed tells a long file from a full one. */
	buf = malloc(MR_TOKEN_MAX + 1);
	n = buf ? fread(buf, 1, MR_TOKEN_MAX + 1, f) : 0;
	fclose(f);
	if (n > MR_TOKEN_MAX) {
		snprintf(err, errlen, "%s: the token file is larger than %d "
		    "bytes", path, MR_TOKEN_MAX);
		free(buf);
		return NULL;
	}
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n == 0) {
		snprintf(err, errlen, "%s: the token file is empty", path);
		free(buf);
		return NULL;
	}
	*len = n;
	return buf;
}

/* SIGHUP (mr_serve calls this from its loop): read the token file again. */
static void
on_hup(void *arg)
{
	const char *path = arg;
	char err[512];
	uint8_t *token;
	size_t len;

	if (path == NULL) {
		fprintf(stderr, "metal_runner: SIGHUP: no --token-file, nothing "
		    "to reload\n");
		return;
	}
	if ((token = read_token(path, &len, err, sizeof(err))) == NULL) {
		fprintf(stderr, "metal_runner: SIGHUP: %s; keeping the previous "
		    "token\n", err);
		return;
	}
	if (mr_token_replace(token, len) == -1)
		fprintf(stderr, "metal_runner: SIGHUP: out of memory; keeping the "
		    "previous token\n");
	else
		fprintf(stderr, "metal_runner: SIGHUP: token reloaded from %s; "
		    "new sessions must use it\n", path);
	memset(token, 0, len);
	free(token);
}

/* The socket listens: advertise it if asked, then tell whoever started us. */
static void
on_listen(const char *host, int port, void *arg)
{
	struct listen_arg *la = arg;
	char err[256];

	if (la->advertise != NULL && adv_start(la->advertise, host, port,
	    la->backend, la->auth, err, sizeof(err)) == -1) {
		fprintf(stderr, "metal_runner: --advertise: %s\n", err);
		la->failed = 1;
		mr_stop();
		return;
	}
	printf("listening on %s:%d\n", host, port);
	fflush(stdout);
}

/*
 * Started with stdin, stdout or stderr closed (a service manager, a parent
 * that closed them): /dev/null in its place. Otherwise the first file the
 * runner opens takes that number, and its log lines or "listening on" go
 * into it (the session table's shared memory on Linux), and on macOS every
 * session is refused: posix_spawn's inherit action fails on a closed
 * descriptor (isolate.c). As daemon(3) does. 0, or -1 with errno.
 */
static int
stdio_open(void)
{
	int fd, nfd;

	/* Lowest first: open takes the lowest free number. */
	for (fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) == -1 && errno == EBADF &&
		    (nfd = open("/dev/null", O_RDWR)) != fd) {
			if (nfd != -1)
				close(nfd);
			return -1;
		}
	return 0;
}

/* The options, as getopt_long takes them. */
enum { O_ISO = 256, O_TOKEN, O_UNAUTH, O_MAXMSG, O_SMEM, O_TMEM,
    O_HANDLES, O_SESSIONS, O_FTIME, O_ITIME, O_KTIME, O_STARTUPS,
    O_HTIME, O_USER, O_NOCONFINE, O_ADVERTISE, O_CACHEDIR,
    O_CACHESIZE, O_RGRACE, O_RLOG, O_STDIN, O_SPAWNED, O_SROUTES,
    O_SPEER };
static const struct option opts[] = {
	{ "host", required_argument, NULL, 'H' },
	{ "port", required_argument, NULL, 'p' },
	{ "backend", required_argument, NULL, 'b' },
	{ "device", required_argument, NULL, 'd' },
	{ "verbose", no_argument, NULL, 'v' },
	{ "quiet", no_argument, NULL, 'q' },
	{ "isolation", required_argument, NULL, O_ISO },
	{ "token-file", required_argument, NULL, O_TOKEN },
	{ "allow-unauthenticated", no_argument, NULL, O_UNAUTH },
	{ "max-msg", required_argument, NULL, O_MAXMSG },
	{ "session-mem", required_argument, NULL, O_SMEM },
	{ "total-mem", required_argument, NULL, O_TMEM },
	{ "max-handles", required_argument, NULL, O_HANDLES },
	{ "max-sessions", required_argument, NULL, O_SESSIONS },
	{ "max-startups", required_argument, NULL, O_STARTUPS },
	{ "handshake-timeout", required_argument, NULL, O_HTIME },
	{ "resume-grace", required_argument, NULL, O_RGRACE },
	{ "resume-log", required_argument, NULL, O_RLOG },
	{ "frame-timeout", required_argument, NULL, O_FTIME },
	{ "idle-timeout", required_argument, NULL, O_ITIME },
	{ "kernel-timeout", required_argument, NULL, O_KTIME },
	{ "user", required_argument, NULL, O_USER },
	{ "no-confine", no_argument, NULL, O_NOCONFINE },
	{ "advertise", optional_argument, NULL, O_ADVERTISE },
	{ "cache-dir", required_argument, NULL, O_CACHEDIR },
	{ "cache-size", required_argument, NULL, O_CACHESIZE },
	{ "exit-with-stdin", no_argument, NULL, O_STDIN },
	/* Internal: a session process the runner spawned (isolate.c). */
	{ "session-spawn", required_argument, NULL, O_SPAWNED },
	{ "session-routes", required_argument, NULL, O_SROUTES },
	{ "session-peer", required_argument, NULL, O_SPEER },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 }
};

/* What the command line says. */
struct args {
	struct mr_config cfg;
	struct listen_arg la;
	const char *token_path;
	/* --session-spawn, --session-routes, --session-peer: isolate.c */
	const char *spawned, *sroutes, *speer;
	int unauth;
};

/* A limit or a size (c, its value in optarg) into a: 0, -1 a bad value, or
 * 1 if c is not one of them. */
static int
limit_option(struct args *a, int c)
{
	uint64_t v;
	int n;

	switch (c) {
	case O_MAXMSG:
		if (parse_size(optarg, &v) == -1 || v < 65536 ||
		    v > 0x7fffffff)
			return -1;
		a->cfg.maxmsg = (uint32_t)v;
		return 0;
	case O_SMEM:
		if (parse_size(optarg, &a->cfg.session_mem) == -1)
			return -1;
		return 0;
	case O_TMEM:
		if (parse_size(optarg, &a->cfg.total_mem) == -1)
			return -1;
		return 0;
	case O_HANDLES:
		if (parse_int(optarg, 1, 1 << 30, &n) == -1)
			return -1;
		a->cfg.max_handles = (uint32_t)n;
		return 0;
	case O_SESSIONS:
		if (parse_int(optarg, 1, 4096, &n) == -1)
			return -1;
		a->cfg.max_sessions = (uint32_t)n;
		return 0;
	case O_STARTUPS:
		if (parse_int(optarg, 1, 4096, &n) == -1)
			return -1;
		a->cfg.max_startups = (uint32_t)n;
		return 0;
	case O_RGRACE:
		if (parse_int(optarg, 0, 86400, &a->cfg.resume_grace) == -1)
			return -1;
		return 0;
	case O_RLOG:
		if (parse_size(optarg, &a->cfg.resume_log) == -1 ||
		    a->cfg.resume_log < 65536 || a->cfg.resume_log > (1ULL << 32))
			return -1;
		return 0;
	case O_HTIME:
		if (parse_int(optarg, 0, 86400,
		    &a->cfg.handshake_timeout) == -1)
			return -1;
		return 0;
	case O_FTIME:
		if (parse_int(optarg, 1, 86400, &a->cfg.frame_timeout) == -1)
			return -1;
		return 0;
	case O_ITIME:
		if (parse_int(optarg, 0, 1 << 30, &a->cfg.idle_timeout) == -1)
			return -1;
		return 0;
	case O_KTIME:
		if (parse_int(optarg, 0, 1 << 30, &a->cfg.kernel_timeout) == -1)
			return -1;
		return 0;
	case O_CACHESIZE:
		if (parse_size(optarg, &a->cfg.cache_size) == -1 ||
		    a->cfg.cache_size < 65536)
			return -1;
		return 0;
	}
	return 1;
}

/* Option c (its value in optarg) into a: 0, -1 a bad value, or 1 + the
 * status the program ends with at once. */
static int
option(struct args *a, int c)
{
	int rc;

	if ((rc = limit_option(a, c)) != 1)
		return rc;
	switch (c) {
	case 'H':
		a->cfg.host = optarg;
		break;
	case 'p':
		if (parse_int(optarg, 0, 65535, &a->cfg.port) == -1)
			return -1;
		break;
	case 'b':
		a->cfg.backend = optarg;
		if (mr_find_backend(optarg) == NULL) {
			fprintf(stderr, "metal_runner: no backend %s in "
			    "this build (try cpu%s)\n", optarg,
#ifdef MR_BACKEND_METAL
			    " or metal"
#else
			    "; metal needs macOS"
#endif
			    );
			return 1 + 2;
		}
		break;
	case 'd':
		a->cfg.device = optarg;
		break;
	case 'v':
		a->cfg.verbose = a->cfg.verbose < 0 ? 1 : a->cfg.verbose + 1;
		break;
	case 'q':
		a->cfg.verbose = -1;
		break;
	case O_ISO:
		if (strcmp(optarg, "process") == 0)
			a->cfg.isolation = BE_ISOLATE_PROCESS;
		else if (strcmp(optarg, "thread") == 0)
			a->cfg.isolation = BE_ISOLATE_THREAD;
		else if (strcmp(optarg, "spawn") == 0)
			a->cfg.isolation = BE_ISOLATE_SPAWN;
		else
			return -1;
		break;
	case O_TOKEN:
		a->token_path = optarg;
		break;
	case O_UNAUTH:
		a->unauth = 1;
		break;
	case O_USER:
		a->cfg.user = optarg;
		break;
	case O_NOCONFINE:
		a->cfg.no_confine = 1;
		break;
	case O_ADVERTISE:
		a->la.advertise = optarg != NULL ? optarg : "";
		break;
	case O_CACHEDIR:
		a->cfg.cache_dir = optarg;
		break;
	case O_STDIN:
		a->cfg.watch_stdin = 1;
		break;
	case O_SPAWNED:
		a->spawned = optarg;
		break;
	case O_SROUTES:
		a->sroutes = optarg;
		break;
	case O_SPEER:
		a->speer = optarg;
		break;
	case 'h':
		usage(stdout);
		return 1 + 0;
	case 'V':
		printf("metal_runner %s (protocol version 1)\n",
		    MR_VERSION);
		return 1 + 0;
	default:
		return 1 + usage_error();
	}
	return 0;
}

int
main(int argc, char **argv)
{
	struct args a;
	char err[512];
	int c, li, rc;
	uint8_t *token = NULL;

	if (stdio_open() == -1) {
		fprintf(stderr, "metal_runner: cannot open /dev/null in place of "
		    "a closed stdin, stdout or stderr: %s\n", strerror(errno));
		return 1;
	}
	memset(&a, 0, sizeof(a));
	mr_config_defaults(&a.cfg);
	a.sroutes = "-";
	a.speer = "?";
	a.cfg.on_listen = on_listen;
	a.cfg.on_listen_arg = &a.la;
	while ((li = -1, c = getopt_long(argc, argv, "H:p:b:d:vqhV", opts,
	    &li)) != -1)
		if ((rc = option(&a, c)) == -1)
			goto bad;
		else if (rc > 0)
			return rc - 1;
	if (optind < argc) {
		fprintf(stderr, "metal_runner: unexpected argument %s\n",
		    argv[optind]);
		return usage_error();
	}
	/* A session process is handed the token in force instead (the file
	 * may have changed, or gone, since the runner read it). */
	if (a.token_path != NULL && a.spawned == NULL &&
	    (token = read_token(a.token_path, &a.cfg.tokenlen,
	    err, sizeof(err))) == NULL) {
		log_error("%s", err);
		return 1;
	}
	a.cfg.token = token;
	/* A session process: the same configuration, one connection. */
	if (a.spawned != NULL)
		mr_spawned_session(&a.cfg, a.spawned, a.sroutes, a.speer);
	if (a.la.advertise != NULL) {
		/* An advertisement invites strangers: only with a token, unless
		 * only this machine can connect. */
		if (a.cfg.token == NULL && !net_is_loopback(a.cfg.host)) {
			fprintf(stderr, "metal_runner: refusing to --advertise a "
			    "runner on %s without --token-file: anyone on the "
			    "network who finds it could run any code on this "
			    "machine\n", a.cfg.host);
			return 1;
		}
		if (!adv_available) {
			fprintf(stderr, "metal_runner: --advertise: %s\n",
			    adv_missing);
			return 1;
		}
		a.la.backend = mr_find_backend(a.cfg.backend)->name;
		a.la.auth = a.cfg.token != NULL;
	}
	if (a.cfg.token == NULL && !net_is_loopback(a.cfg.host)) {
		if (!a.unauth) {
			fprintf(stderr, "metal_runner: refusing to listen on %s "
			    "without --token-file: anyone who can connect could "
			    "run any code on this machine. Pass "
			    "--allow-unauthenticated to accept that.\n",
			    a.cfg.host);
			return 1;
		}
		fprintf(stderr, "metal_runner: WARNING: listening on %s with no "
		    "authentication; anyone who can reach this port can run "
		    "code here\n", a.cfg.host);
	}
	a.cfg.on_hup = on_hup;
	a.cfg.on_hup_arg = (void *)a.token_path;
	a.cfg.argv = argv;
	a.cfg.argc = argc;
	rc = mr_serve(&a.cfg) == 0 && !a.la.failed ? 0 : 1;
	free(token);
	return rc;
bad:
	/* Name the option as the user wrote it: argv[optind - 1] is its
	 * value when that came as an argument of its own. */
	if (li >= 0)
		fprintf(stderr, "metal_runner: bad value for --%s: %s\n",
		    opts[li].name, optarg);
	else
		fprintf(stderr, "metal_runner: bad value for -%c: %s\n", c,
		    optarg);
	return usage_error();
}
