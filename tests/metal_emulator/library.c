/*
 * library.c: Metal Shading Language source to a loaded kernel library.
 * TEST HARNESS ONLY (see README.md).
 *
 * The source is compiled as C++ by clang++ against include/metal_stdlib,
 * with one METAL_EMU_KERNEL line appended per `kernel` function found in
 * it: the line names each parameter's [[attribute]] (a built-in id or an
 * argument-table index), and the templates in include/metal_emu_abi.h add
 * the parameter types and a thunk. Compiled libraries are kept in a cache
 * directory keyed by the whole input, as Metal keeps its shader cache.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "library.h"

#ifndef METAL_EMU_INCLUDE
#error "build with -DMETAL_EMU_INCLUDE=\"/path/to/tests/metal_emulator/include\""
#endif

#define MAX_ERR (256 * 1024)	/* compiler output kept */

struct emu_lib {
	void *dl;
	int threaded;
};

extern char **environ;

static char *
errf(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) == -1)
		s = NULL;
	va_end(ap);
	return s;
}

/* ---- finding kernels and their parameters ---- */

struct buf {
	char *p;
	size_t n, cap;
};

static int
put(struct buf *b, const char *s, size_t n)
{
	char *q;

	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->n + n + 1)
			cap *= 2;
		if ((q = realloc(b->p, cap)) == NULL)
			return -1;
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
	return 0;
}

static int
putf(struct buf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	return n < 0 || (size_t)n >= sizeof(tmp) ? -1 : put(b, tmp, (size_t)n);
}

static const struct {
	const char *attr;
	int builtin;
} builtins[] = {
	{ "threadgroup_position_in_grid", METAL_EMU_THREADGROUP_POSITION_IN_GRID },
	{ "thread_position_in_threadgroup", METAL_EMU_THREAD_POSITION_IN_THREADGROUP },
	{ "thread_position_in_grid", METAL_EMU_THREAD_POSITION_IN_GRID },
	{ "threads_per_threadgroup", METAL_EMU_THREADS_PER_THREADGROUP },
	{ "threadgroups_per_grid", METAL_EMU_THREADGROUPS_PER_GRID },
	{ "threads_per_grid", METAL_EMU_THREADS_PER_GRID },
	{ "thread_index_in_threadgroup", METAL_EMU_THREAD_INDEX_IN_THREADGROUP },
	{ "thread_index_in_simdgroup", METAL_EMU_THREAD_INDEX_IN_SIMDGROUP },
	{ "simdgroup_index_in_threadgroup", METAL_EMU_SIMDGROUP_INDEX_IN_THREADGROUP },
};

static int
is_ident(int c)
{
	return isalnum(c) || c == '_';
}

/* What copy_source puts for the address space `threadgroup` of a
 * parameter or a cast (metal_stdlib defines it as nothing). */
#define TG_MARK "metal_emu_tg"

/*
 * Whether the kernel's body, b..be, names the parameter whose text is
 * p..a (its name: the last identifier before any attribute): Apple's
 * compiler reports a parameter its function does not use as unused in
 * reflection (MTLBinding used, MTLArgument active NO). Here: the name
 * appears in the body as a whole identifier, a reading of the source that
 * a name used only in dead code or shadowed counts as used.
 */
static int
param_used(const char *p, const char *a, const char *b, const char *be)
{
	const char *n, *ne, *q;
	size_t len;

	for (ne = a; ne > p && !is_ident((unsigned char)ne[-1]); ne--)
		;
	for (n = ne; n > p && is_ident((unsigned char)n[-1]); n--)
		;
	if ((len = (size_t)(ne - n)) == 0 || b == NULL)
		return 1;
	for (q = b; q + len <= be; q++)
		if (memcmp(q, n, len) == 0 && (q == b ||
		    !is_ident((unsigned char)q[-1])) && (q + len == be ||
		    !is_ident((unsigned char)q[len])))
			return 1;
	return 0;
}

/* One parameter's text, p..e: its METAL_EMU_KERNEL entry. Without an
 * attribute a buffer takes the next buffer index, threadgroup memory the
 * next threadgroup index, as Metal assigns them. b..be: the kernel's body,
 * or NULL (param_used). */
static char *
param_entry(const char *p, const char *e, int *next_index, int *next_tg,
    const char *b, const char *be, struct buf *out)
{
	const char *a, *ae;
	char attr[64];
	size_t i, n;
	int idx, tg, used;

	while (p < e && isspace((unsigned char)*p))
		p++;
	tg = (size_t)(e - p) > strlen(TG_MARK) &&
	    strncmp(p, TG_MARK, strlen(TG_MARK)) == 0;
	for (a = p; a + 1 < e && !(a[0] == '[' && a[1] == '['); a++)
		;
	used = param_used(p, a + 1 >= e ? e : a, b, be);
	if (a + 1 >= e && tg)
		return putf(out, ", {%d, 0, %d, 0, 0, %d}",
		    METAL_EMU_PARAM_THREADGROUP, (*next_tg)++, used) ?
		    errf("out of memory") : NULL;
	if (a + 1 >= e)
		return putf(out, ", {0, 0, %d, 0, 0, %d}", (*next_index)++,
		    used) ? errf("out of memory") : NULL;
	for (ae = a + 2; ae + 1 < e && !(ae[0] == ']' && ae[1] == ']'); ae++)
		;
	a += 2;
	while (a < ae && isspace((unsigned char)*a))
		a++;
	n = (size_t)(ae - a);
	while (n > 0 && isspace((unsigned char)a[n - 1]))
		n--;
	if (n >= sizeof(attr))
		n = sizeof(attr) - 1;
	memcpy(attr, a, n);
	attr[n] = '\0';
	if (tg && strncmp(attr, "threadgroup(", 12) != 0)
		return errf("program_source: error: a threadgroup parameter "
		    "with the attribute [[%s]]", attr);
	for (i = 0; i < sizeof(builtins) / sizeof(builtins[0]); i++)
		if (strcmp(attr, builtins[i].attr) == 0)
			return putf(out, ", {0, %d, -1, 0, 0, 1}",
			    builtins[i].builtin) ? errf("out of memory") : NULL;
	if (sscanf(attr, "buffer(%d)", &idx) == 1 && idx >= 0 && idx < 31)
		return putf(out, ", {0, 0, %d, 0, 0, %d}", idx, used) ?
		    errf("out of memory") : NULL;
	/* Reflected, never run (queue.m): a runner must refuse it. */
	if (sscanf(attr, "threadgroup(%d)", &idx) == 1 && idx >= 0 &&
	    idx < 31)
		return putf(out, ", {%d, 0, %d, 0, 0, %d}",
		    METAL_EMU_PARAM_THREADGROUP, idx, used) ?
		    errf("out of memory") : NULL;
	return errf("program_source: error: the Metal emulator does not "
	    "support the kernel parameter attribute [[%s]]", attr);
}

/*
 * Append a METAL_EMU_KERNEL line for every "kernel void NAME(...)" in
 * src. Returns NULL, or an error text the caller frees.
 */
static char *
describe_kernels(const char *src, struct buf *out, int *nkernels)
{
	const char *p = src, *q, *name, *params, *end, *b, *be;
	size_t namelen;
	int depth, next_index, next_tg;
	char *err;

	*nkernels = 0;
	while ((p = strstr(p, "kernel")) != NULL) {
		q = p + 6;
		if ((p > src && is_ident((unsigned char)p[-1])) ||
		    is_ident((unsigned char)*q)) {
			p = q;
			continue;
		}
		while (isspace((unsigned char)*q))
			q++;
		if (strncmp(q, "void", 4) != 0 || is_ident((unsigned char)q[4])) {
			p = q;
			continue;
		}
		for (q += 4; isspace((unsigned char)*q); q++)
			;
		for (name = q; is_ident((unsigned char)*q); q++)
			;
		namelen = (size_t)(q - name);
		while (isspace((unsigned char)*q))
			q++;
		if (namelen == 0 || *q != '(') {
			p = q;
			continue;
		}
		if (putf(out, "\nMETAL_EMU_KERNEL(%.*s", (int)namelen, name))
			return errf("out of memory");
		/* The body, b..be, after the parameter list's ')': the
		 * braces that follow it, matched (param_used). */
		for (b = q + 1, depth = 1; *b != '\0' && depth > 0; b++)
			depth += *b == '(' ? 1 : *b == ')' ? -1 : 0;
		while (*b != '\0' && *b != '{' && *b != ';')
			b++;
		for (be = b, depth = 0; *b == '{' && *be != '\0'; be++)
			if ((depth += *be == '{' ? 1 : *be == '}' ? -1 : 0) == 0)
				break;
		if (*b != '{' || *be != '}')
			b = be = NULL;
		/* Split the parameter list at commas outside brackets. */
		params = ++q;
		next_index = next_tg = 0;
		for (depth = 0; *q != '\0'; q++) {
			if (*q == '(' || *q == '[' || *q == '<')
				depth++;
			else if ((*q == ')' || *q == ']' || *q == '>') &&
			    depth > 0)
				depth--;
			else if (*q == ')' || (*q == ',' && depth == 0)) {
				for (end = q; end > params &&
				    isspace((unsigned char)end[-1]); end--)
					;
				if (end > params && (err = param_entry(params,
				    end, &next_index, &next_tg, b, be, out)) !=
				    NULL)
					return err;
				params = q + 1;
				if (*q == ')')
					break;
			}
		}
		if (*q != ')')
			return errf("program_source: error: unterminated "
			    "parameter list of kernel %.*s", (int)namelen,
			    name);
		if (put(out, ")", 1))
			return errf("out of memory");
		(*nkernels)++;
		p = q;
	}
	return NULL;
}

/*
 * Copy src to out, with TG_MARK (nothing, to the compiler) for the address
 * space `threadgroup` where it qualifies a pointer type in a cast,
 * "(threadgroup float4 *)", or a parameter, "(threadgroup float *t" or
 * after a comma: the header makes `threadgroup` a storage class (static: a
 * threadgroup's memory is shared by its threads), which C++ allows in
 * declarations only; the mark tells param_entry the parameter's kind. (In
 * an attribute it becomes [[static(0)]], which C++ ignores.)
 */
static int
copy_source(struct buf *out, const char *src, size_t len)
{
	const char *p = src, *end = src + len, *q;

	while (p < end) {
		if (*p == '(' || *p == ',') {
			for (q = p + 1; q < end && isspace((unsigned char)*q); q++)
				;
			if ((size_t)(end - q) > 11 &&
			    strncmp(q, "threadgroup", 11) == 0 &&
			    !is_ident((unsigned char)q[11])) {
				if (put(out, p, 1) == -1 ||
				    put(out, TG_MARK, strlen(TG_MARK)) == -1)
					return -1;
				p = q + 11;
				continue;
			}
		}
		for (q = p + 1; q < end && *q != '(' && *q != ','; q++)
			;
		if (put(out, p, (size_t)(q - p)) == -1)
			return -1;
		p = q;
	}
	return 0;
}

/*
 * The Metal Shading Language has no double ("Metal does not support the
 * double, long long, unsigned long long, and long double data types": the
 * MSL specification, Scalar Data Types), so Apple's compiler rejects a
 * source that uses it; clang would compile it as C++. Returns the error, or
 * NULL. Comments and literals are skipped.
 */
static char *
unsupported_type(const char *p, const char *end)
{
	int line = 1;

	while (p < end) {
		if (*p == '\n')
			line++;
		if (p + 1 < end && p[0] == '/' && p[1] == '/') {
			while (p < end && *p != '\n')
				p++;
			continue;
		}
		if (p + 1 < end && p[0] == '/' && p[1] == '*') {
			for (p += 2; p + 1 < end && !(p[0] == '*' && p[1] == '/');
			    p++)
				line += *p == '\n';
			p += 2;
			continue;
		}
		if (*p == '"' || *p == '\'') {
			char q = *p++;
			while (p < end && *p != q && *p != '\n')
				p += *p == '\\' ? 2 : 1;
			p++;
			continue;
		}
		if (is_ident((unsigned char)*p)) {
			const char *w = p;
			while (p < end && is_ident((unsigned char)*p))
				p++;
			if (p - w == 6 && strncmp(w, "double", 6) == 0)
				return errf("program_source:%d: error: 'double' is "
				    "not supported in Metal (the Metal "
				    "emulator rejects it, as the Metal Shading "
				    "Language has no double)", line);
			continue;
		}
		p++;
	}
	return NULL;
}

/* ---- compiling ---- */

static uint64_t
fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *s = p;

	while (n-- > 0)
		h = (h ^ *s++) * 0x100000001b3ULL;
	return h;
}

static char *
read_file(const char *path, size_t *len)
{
	struct buf b = { NULL, 0, 0 };
	char tmp[65536];
	ssize_t r;
	int fd;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1)
		return NULL;
	while ((r = read(fd, tmp, sizeof(tmp))) > 0)
		if (put(&b, tmp, (size_t)r) == -1)
			break;
	close(fd);
	if (r != 0) {
		free(b.p);
		return NULL;
	}
	if (b.p == NULL)
		b.p = strdup("");
	*len = b.n;
	return b.p;
}

static const char *
compiler(void)
{
	const char *cxx = getenv("METAL_EMU_CXX");

	return cxx != NULL && *cxx != '\0' ? cxx : "clang++-16";
}

static void
cache_dir(char *dir, size_t len)
{
	const char *e = getenv("METAL_EMU_CACHE"), *home = getenv("HOME");

	if (e != NULL && *e != '\0')
		snprintf(dir, len, "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) != NULL && *e != '\0')
		snprintf(dir, len, "%s/metal_emulator", e);
	else if (home != NULL && *home != '\0')
		snprintf(dir, len, "%s/.cache/metal_emulator", home);
	else
		snprintf(dir, len, "/tmp/metal_emulator-%u",
		    (unsigned)getuid());
}

/* mkdir -p: a fresh account may have no ~/.cache yet. */
static void
mkdirs(char *dir)
{
	char *p;

	for (p = dir + 1; *p != '\0'; p++)
		if (*p == '/') {
			*p = '\0';
			mkdir(dir, 0700);
			*p = '/';
		}
	mkdir(dir, 0700);
}

/* Everything the output depends on besides the source: the compiler, the
 * flags and the headers. */
static uint64_t
toolchain_hash(void)
{
	static const char *hdrs[] = { "metal_stdlib", "metal_emu_abi.h" };
	uint64_t h = 0xcbf29ce484222325ULL;
	char path[4096];
	size_t i, n;
	char *text;

	h = fnv1a(h, compiler(), strlen(compiler()));
	for (i = 0; i < sizeof(hdrs) / sizeof(hdrs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", METAL_EMU_INCLUDE,
		    hdrs[i]);
		if ((text = read_file(path, &n)) != NULL) {
			h = fnv1a(h, text, n);
			free(text);
		}
	}
	return h;
}

/* Run the compiler; NULL, or its messages with the temporary file's path
 * replaced by "program_source", as Metal names the source in its errors. */
static char *
run_compiler(const char *srcpath, const char *outpath, unsigned version,
    int mathmode)
{
	const char *fast = mathmode == EMU_MATH_SAFE ? "-fno-fast-math" :
	    "-ffast-math";
	char vdef[64], *out, *p, *msg;
	/* Relaxed math: fast math that honours infinities and NaNs.
	 * -fwrapv: GPU integers wrap, tinygrad's index arithmetic may rely
	 * on it; -fno-strict-aliasing: kernels cast buffer pointers between
	 * types; no excess precision: half rounds after every operation, as
	 * on Metal. */
	const char *argv[] = { compiler(), "-x", "c++", "-std=c++17", "-O2",
	    "-fPIC", "-shared", fast, mathmode == EMU_MATH_RELAXED ?
	    "-fno-finite-math-only" : fast, "-fwrapv", "-fno-strict-aliasing",
	    "-Xclang", "-ffloat16-excess-precision=none", "-w",
	    "-fno-caret-diagnostics",
	    "-I", METAL_EMU_INCLUDE, vdef, "-o", outpath, srcpath, NULL };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t sa;
	sigset_t def;
	struct buf b = { NULL, 0, 0 };
	char tmp[4096];
	int pfd[2], status = -1;
	ssize_t r;
	pid_t pid;

	snprintf(vdef, sizeof(vdef), "-D__METAL_VERSION__=%u", version);
	if (pipe2(pfd, O_CLOEXEC) == -1)
		return errf("cannot run the compiler: pipe: %s",
		    strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	/* The compiler waits for its own children (cc1, the linker): it
	 * gets SIGCHLD's default, whatever this process has (a runner's
	 * session with a cache helper ignores SIGCHLD, which an exec keeps,
	 * and clang then lost its children's status and made no library). */
	posix_spawnattr_init(&sa);
	sigemptyset(&def);
	sigaddset(&def, SIGCHLD);
	posix_spawnattr_setsigdefault(&sa, &def);
	posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETSIGDEF);
	errno = posix_spawnp(&pid, argv[0], &fa, &sa, (char *const *)argv,
	    environ);
	posix_spawnattr_destroy(&sa);
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	if (errno != 0) {
		close(pfd[0]);
		return errf("the Metal emulator cannot run its compiler %s: "
		    "%s (set METAL_EMU_CXX, or install clang-16)", argv[0],
		    strerror(errno));
	}
	while ((r = read(pfd[0], tmp, sizeof(tmp))) > 0 || (r == -1 &&
	    errno == EINTR))
		if (r > 0 && b.n < MAX_ERR)
			put(&b, tmp, (size_t)r);
	close(pfd[0]);
	while (waitpid(pid, &status, 0) == -1) {
		if (errno == EINTR)
			continue;
		/* SIGCHLD ignored here: the kernel reaped it, its status is
		 * gone. It has ended (its output closed): it succeeded if it
		 * said nothing (-w) and made the library. */
		status = b.n == 0 && access(outpath, R_OK) == 0 ? 0 : -1;
		break;
	}
	if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		free(b.p);
		return NULL;
	}
	if (b.p == NULL)
		return errf("the compiler %s failed (status %d) and said "
		    "nothing", argv[0], status);
	/* Name the source as Metal does. */
	if ((msg = malloc(b.n + 1)) == NULL)
		return b.p;
	out = msg;
	for (p = b.p; *p != '\0';) {
		if (strncmp(p, srcpath, strlen(srcpath)) == 0) {
			memcpy(out, "program_source", 14);
			out += 14;
			p += strlen(srcpath);
		} else
			*out++ = *p++;
	}
	*out = '\0';
	free(b.p);
	return msg;
}

static pthread_mutex_t compile_lock = PTHREAD_MUTEX_INITIALIZER;

struct emu_lib *
emu_lib_compile(const char *src, size_t len, unsigned version, int mathmode,
    char **err)
{
	struct buf full = { NULL, 0, 0 }, tail = { NULL, 0, 0 };
	char dir[3500], so[4096], cpp[4096], tmpso[4096], tmpcpp[4096];
	const struct metal_emu_rt **rt;
	struct emu_lib *l = NULL;
	char *cached = NULL;
	size_t cachedlen = 0;
	uint64_t key;
	int nk, fd;

	*err = NULL;
	if (put(&full, "#line 1 \"program_source\"\n", 25) == -1 ||
	    copy_source(&full, src, len) == -1) {
		*err = errf("out of memory");
		goto fail;
	}
	/* The source is program text: a NUL inside it ends it, as for
	 * NSString's UTF8String. */
	full.n = strlen(full.p);
	if ((*err = unsupported_type(full.p, full.p + full.n)) != NULL)
		goto fail;
	if ((*err = describe_kernels(full.p, &tail, &nk)) != NULL)
		goto fail;
	if ((tail.n > 0 && put(&full, tail.p, tail.n) == -1) ||
	    put(&full, "\n", 1) == -1) {
		*err = errf("out of memory");
		goto fail;
	}

	key = fnv1a(toolchain_hash(), full.p, full.n);
	key = fnv1a(key, &version, sizeof(version));
	key = fnv1a(key, &mathmode, sizeof(mathmode));
	cache_dir(dir, sizeof(dir));
	mkdirs(dir);
	snprintf(so, sizeof(so), "%s/%016llx.so", dir, (unsigned long long)key);
	snprintf(cpp, sizeof(cpp), "%s/%016llx.cpp", dir,
	    (unsigned long long)key);

	pthread_mutex_lock(&compile_lock);
	/* A cached library is used only if its source is this source. */
	if ((cached = read_file(cpp, &cachedlen)) == NULL ||
	    cachedlen != full.n || memcmp(cached, full.p, full.n) != 0 ||
	    access(so, R_OK) != 0) {
		snprintf(tmpcpp, sizeof(tmpcpp), "%s/tmp%d.%lu.cpp", dir,
		    (int)getpid(), (unsigned long)pthread_self());
		snprintf(tmpso, sizeof(tmpso), "%s/tmp%d.%lu.so", dir,
		    (int)getpid(), (unsigned long)pthread_self());
		if ((fd = open(tmpcpp, O_WRONLY | O_CREAT | O_TRUNC |
		    O_CLOEXEC, 0600)) == -1 || write(fd, full.p, full.n) !=
		    (ssize_t)full.n) {
			*err = errf("the Metal emulator cannot write %s: %s",
			    tmpcpp, strerror(errno));
			if (fd != -1)
				close(fd);
			pthread_mutex_unlock(&compile_lock);
			goto fail;
		}
		close(fd);
		*err = run_compiler(tmpcpp, tmpso, version, mathmode);
		if (*err == NULL && (rename(tmpso, so) == -1 ||
		    rename(tmpcpp, cpp) == -1))
			*err = errf("the Metal emulator cannot fill its cache "
			    "%s: %s", dir, strerror(errno));
		unlink(tmpcpp);
		unlink(tmpso);
		if (*err != NULL) {
			pthread_mutex_unlock(&compile_lock);
			goto fail;
		}
	}
	pthread_mutex_unlock(&compile_lock);

	if ((l = calloc(1, sizeof(*l))) == NULL) {
		*err = errf("out of memory");
		goto fail;
	}
	if ((l->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL)) == NULL) {
		*err = errf("the Metal emulator cannot load %s: %s", so,
		    dlerror());
		goto fail;
	}
	if ((rt = dlsym(l->dl, "metal_emu_rt")) == NULL) {
		*err = errf("%s has no metal_emu_rt: not compiled against "
		    "the emulator's metal_stdlib", so);
		goto fail;
	}
	*rt = &emu_rt;
	/* Kernels that synchronize threads need a thread per GPU thread. */
	l->threaded = strstr(full.p, "threadgroup_barrier") != NULL ||
	    strstr(full.p, "simd") != NULL;
	free(cached);
	free(full.p);
	free(tail.p);
	return l;

fail:
	if (*err == NULL)
		*err = errf("out of memory");
	if (l != NULL && l->dl != NULL)
		dlclose(l->dl);
	free(l);
	free(cached);
	free(full.p);
	free(tail.p);
	return NULL;
}

const struct metal_emu_kernel *
emu_lib_kernel(struct emu_lib *l, const char *name)
{
	char sym[512];

	if (snprintf(sym, sizeof(sym), "metal_emu_kernel_%s", name) >=
	    (int)sizeof(sym))
		return NULL;
	return dlsym(l->dl, sym);
}

int
emu_lib_threaded(const struct emu_lib *l)
{
	return l->threaded;
}

void
emu_lib_free(struct emu_lib *l)
{
	if (l == NULL)
		return;
	dlclose(l->dl);
	free(l);
}
