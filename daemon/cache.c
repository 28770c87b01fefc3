/*
 * cache.c: the content-addressed store behind --cache-dir (protocol.md,
 * Cache).
 *
 * One file per content, named by the SHA-256 of the content in hex, which
 * this code computes itself from the bytes it stores: a client never names
 * what it sends. A file is a 48-byte header, "MRCACHE1" len[8] sha256[32],
 * then the content. It is written to a temporary file in the same directory
 * and renamed into place, so a reader sees a whole file or none, and two
 * sessions (or two runners) storing the same content at once both succeed
 * with identical files. Nothing is fsync'd: a file cut short by a crash or
 * damaged on disk is caught when it is read, because every read hashes the
 * content again before anything of it is used, and such a file is removed
 * (only if the name still refers to the file that was read).
 *
 * A session keeps what Thave reported as held: it pins the file by holding
 * it open (struct cache_pins), so eviction by any process, which only
 * unlinks, cannot take it away before the session has used it. Pins are
 * open files, so a process's budget of them is its open-file limit, less
 * what it needs for sockets; the sessions that share one process (thread
 * isolation) share it fairly, see cache_pin().
 *
 * The directory is bounded by --cache-size: when the bytes this runner
 * (all its processes, through a shared count) believes are stored pass it, the oldest files by modification time (a
 * pin or a read touches its file) are removed under an flock on
 * DIR/.lock, which also serialises eviction between runners that share a
 * directory. Each runner counts only its own stores between scans, so two
 * runners sharing one directory can pass the bound until the next scan.
 *
 * A store is in two steps: the bytes into a temporary file as they arrive
 * (cache_put_write), then the hash of what the file holds and the rename
 * (cache_put_finish), which a store queue does off the session's path
 * (storeq.c).
 *
 * Who calls this: in a runner with process isolation, only the session's
 * cache helper process (cachelink.c) and its store queue's thread, never
 * the confined session; with thread isolation, the session threads and
 * the runner's store queue thread, under the locks below.
 */
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "proto.h"
#include "shm.h"

#ifdef __APPLE__
#define st_mtim st_mtimespec
#endif

#define HDR 48
#define MAGIC "MRCACHE1"
#define STALE_TMP 3600		/* s: a temporary file older is a leftover */

static struct {
	int dirfd;
	uint64_t limit;
	/* Bytes stored, as of the last scan plus those stored since, by any
	 * process of this runner: shared memory mapped before the first
	 * fork, so every session's helper adds to the same count. */
	_Atomic uint64_t *approx;
	int approxfd;		/* for spawned session processes */
	char dir[1024];
} C = { -1, 0, NULL, -1, "" };
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned tmp_counter;
/* A pin is an open file: this process's pins stay FD_RESERVE descriptors
 * short of its limit, so sessions (threads) always have some for their
 * sockets; past that Thave answers "not held" and the bytes are sent.
 * A pin is a promise to the session until it ends, never taken back, so
 * one session must not take them all: of maxpins shared by nsessions
 * sessions, each may always take share, and beyond its share borrow from
 * the rest (lendable), first come first served. With process isolation a
 * session's helper has a budget of its own (nsessions 1: share and lendable
 * are half of it each). */
#define FD_RESERVE 256
static _Atomic long npins;
static _Atomic long nlent;	/* pins held beyond their session's share */
static long maxpins, share, lendable;

struct pin {
	uint8_t hash[PROTO_HASH_SIZE];
	int fd;
	uint64_t len;
};

struct cache_pins {
	struct pin *p;
	size_t n, cap;
};

static void
hexname(const uint8_t hash[PROTO_HASH_SIZE], char out[2 * PROTO_HASH_SIZE + 1])
{
	static const char hx[] = "0123456789abcdef";
	int i;

	for (i = 0; i < PROTO_HASH_SIZE; i++) {
		out[2 * i] = hx[hash[i] >> 4];
		out[2 * i + 1] = hx[hash[i] & 15];
	}
	out[2 * PROTO_HASH_SIZE] = '\0';
}

static int
is_hexname(const char *s)
{
	int i;

	for (i = 0; i < 2 * PROTO_HASH_SIZE; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return s[i] == '\0';
}

static void
put_u64(uint8_t *p, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static int
pread_all(int fd, void *buf, size_t n, off_t off)
{
	uint8_t *p = buf;
	ssize_t r;

	while (n > 0) {
		if ((r = pread(fd, p, n, off)) <= 0) {
			if (r == -1 && errno == EINTR)
				continue;
			if (r == 0)
				errno = EIO;	/* shorter than its header says */
			return -1;
		}
		p += r;
		n -= (size_t)r;
		off += r;
	}
	return 0;
}

static int
write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	ssize_t r;

	while (n > 0) {
		if ((r = write(fd, p, n)) == -1) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Remove the cache file name, but only if it is still the file fd reads:
 * another process may have stored a good copy under it meanwhile. */
static void
drop(int fd, const char *name, const char *why)
{
	struct stat a, b;

	if (fstat(fd, &a) == 0 && fstatat(C.dirfd, name, &b,
	    AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
	    a.st_ino == b.st_ino && unlinkat(C.dirfd, name, 0) == 0)
		log_warn("cache: %s/%s %s; removed it", C.dir, name, why);
	else
		log_warn("cache: %s/%s %s; not served", C.dir, name, why);
}

struct entry {
	char name[2 * PROTO_HASH_SIZE + 1];
	uint64_t size;
	struct timespec mtime;
};

static int
older(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;

	if (x->mtime.tv_sec != y->mtime.tv_sec)
		return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
	if (x->mtime.tv_nsec != y->mtime.tv_nsec)
		return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * Count what the directory holds and remove the least recently used files
 * until it is within the limit; remove leftover temporary files. Under the
 * lock of this process and the flock of every process.
 */
static void
evict(void)
{
	struct entry *e = NULL, *ne;
	struct dirent *d;
	struct stat st;
	DIR *dir = NULL;
	size_t n = 0, cap = 0, i;
	uint64_t total = 0;
	time_t now = time(NULL);
	int lockfd, dfd;

	if ((lockfd = openat(C.dirfd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC,
	    0600)) == -1 || flock(lockfd, LOCK_EX) == -1) {
		log_warn("cache: cannot lock %s/.lock: %s", C.dir,
		    strerror(errno));
		goto done;
	}
	if ((dfd = openat(C.dirfd, ".", O_RDONLY | O_DIRECTORY |
	    O_CLOEXEC)) == -1 || (dir = fdopendir(dfd)) == NULL) {
		log_warn("cache: cannot list %s: %s", C.dir, strerror(errno));
		goto done;
	}
	while ((d = readdir(dir)) != NULL) {
		if (fstatat(C.dirfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) ==
		    -1 || !S_ISREG(st.st_mode))
			continue;
		if (strncmp(d->d_name, ".tmp.", 5) == 0 &&
		    now - st.st_mtime > STALE_TMP) {
			unlinkat(C.dirfd, d->d_name, 0);
			continue;
		}
		if (!is_hexname(d->d_name))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 256;
			if ((ne = realloc(e, cap * sizeof(*e))) == NULL)
				goto done;
			e = ne;
		}
		memcpy(e[n].name, d->d_name, sizeof(e[n].name));
		e[n].size = (uint64_t)st.st_size;
		e[n].mtime = st.st_mtim;
		total += e[n].size;
		n++;
	}
	if (n > 0)
		qsort(e, n, sizeof(*e), older);
	for (i = 0; i < n && total > C.limit; i++)
		if (unlinkat(C.dirfd, e[i].name, 0) == 0) {
			total -= e[i].size;
			log_debug("cache: evicted %s (%" PRIu64 " bytes)",
			    e[i].name, e[i].size);
		}
	atomic_store(C.approx, total);
done:
	if (dir != NULL)
		closedir(dir);
	if (lockfd != -1)
		close(lockfd);	/* and the flock with it */
	free(e);
}

static void pins_init(uint32_t);

int
cache_open(const char *dir, uint64_t limit, uint32_t nsessions, char *err)
{
	char probe[64];
	int fd;

	if (mkdir(dir, 0700) == -1 && errno != EEXIST) {
		snprintf(err, PROTO_ERRLEN, "cannot create %s: %s", dir,
		    strerror(errno));
		return -1;
	}
	if ((C.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot open %s: %s", dir,
		    strerror(errno));
		return -1;
	}
	/* Find out now, not at the first client's first write. */
	snprintf(probe, sizeof(probe), ".tmp.probe.%ld", (long)getpid());
	if ((fd = openat(C.dirfd, probe, O_WRONLY | O_CREAT | O_TRUNC |
	    O_CLOEXEC, 0600)) == -1 || write_all(fd, MAGIC, 8) == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot write in %s: %s", dir,
		    strerror(errno));
		if (fd != -1) {
			close(fd);
			unlinkat(C.dirfd, probe, 0);
		}
		close(C.dirfd);
		C.dirfd = -1;
		return -1;
	}
	close(fd);
	unlinkat(C.dirfd, probe, 0);
	if ((C.approxfd = shm_anon(sizeof(*C.approx))) == -1 ||
	    (C.approx = shm_map(C.approxfd, sizeof(*C.approx))) == NULL) {
		snprintf(err, PROTO_ERRLEN, "shared memory: %s",
		    strerror(errno));
		if (C.approxfd != -1)
			close(C.approxfd);
		C.approxfd = -1;
		close(C.dirfd);
		C.dirfd = -1;
		return -1;
	}
	pins_init(nsessions);
	snprintf(C.dir, sizeof(C.dir), "%s", dir);
	C.limit = limit;
	pthread_mutex_lock(&cache_lock);
	evict();
	pthread_mutex_unlock(&cache_lock);
	log_info("cache: %s, %" PRIu64 " of %" PRIu64 " bytes used; SHA-256 "
	    "on %s", dir, (uint64_t)atomic_load(C.approx), limit, sha256_impl());
	if (nsessions == 1)
		log_info("cache: a session pins at most %ld contents (open "
		    "files)", maxpins);
	else
		log_info("cache: %u sessions share %ld pins (open files): %ld "
		    "each, and %ld lent to those that want more", nsessions,
		    maxpins, share, lendable);
	return 0;
}

int
cache_approx_fd(void)
{
	return C.approx != NULL ? C.approxfd : -1;
}

/* A spawned session process (isolate.c): the runner's store, already opened
 * and scanned by the runner, and its byte count (approxfd, closed here). */
int
cache_attach(const char *dir, uint64_t limit, int approxfd, char *err)
{
	if ((C.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot open %s: %s", dir,
		    strerror(errno));
		close(approxfd);
		return -1;
	}
	if ((C.approx = shm_map(approxfd, sizeof(*C.approx))) == NULL) {
		snprintf(err, PROTO_ERRLEN, "shared memory: %s",
		    strerror(errno));
		close(approxfd);
		close(C.dirfd);
		C.dirfd = -1;
		return -1;
	}
	close(approxfd);
	pins_init(1);
	snprintf(C.dir, sizeof(C.dir), "%s", dir);
	C.limit = limit;
	return 0;
}

/* Pins are open files: of what the hard limit allows, each of nsessions
 * sessions of this process gets a share. */
static void
pins_init(uint32_t nsessions)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		if (rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
#ifdef __APPLE__
			/* macOS refuses an unlimited rlim_cur here (setrlimit(2):
			 * use min(OPEN_MAX, rlim_max)); its default of 256 would
			 * leave no pins beyond FD_RESERVE, and Rhave answering 0
			 * for everything. Not verified on a Mac. */
			if (rl.rlim_cur > OPEN_MAX)
				rl.rlim_cur = OPEN_MAX;
#endif
			setrlimit(RLIMIT_NOFILE, &rl);
			getrlimit(RLIMIT_NOFILE, &rl);
		}
		maxpins = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1 << 20 ?
		    1 << 20 : (long)rl.rlim_cur - FD_RESERVE;
	}
	if (maxpins < 0)
		maxpins = 0;
	if (nsessions == 0)
		nsessions = 1;
	share = maxpins / (2 * (long)nsessions);
	lendable = maxpins - (long)nsessions * share;
}

int
cache_enabled(void)
{
	return C.dirfd != -1;
}

struct cache_pins *
cache_pins_new(void)
{
	return calloc(1, sizeof(struct cache_pins));
}

void
cache_pins_free(struct cache_pins *ps)
{
	size_t i;

	if (ps == NULL)
		return;
	for (i = 0; i < ps->n; i++)
		close(ps->p[i].fd);
	atomic_fetch_sub(&npins, (long)ps->n);
	if ((long)ps->n > share)
		atomic_fetch_sub(&nlent, (long)ps->n - share);
	free(ps->p);
	free(ps);
}

static struct pin *
find_pin(struct cache_pins *ps, const uint8_t hash[PROTO_HASH_SIZE])
{
	size_t i;

	for (i = 0; i < ps->n; i++)
		if (memcmp(ps->p[i].hash, hash, PROTO_HASH_SIZE) == 0)
			return &ps->p[i];
	return NULL;
}

static void
unpin(struct cache_pins *ps, struct pin *p)
{
	atomic_fetch_sub(&npins, 1);
	if ((long)ps->n > share)
		atomic_fetch_sub(&nlent, 1);
	close(p->fd);
	*p = ps->p[--ps->n];
}

int
cache_pin(struct cache_pins *ps, const uint8_t hash[PROTO_HASH_SIZE])
{
	char name[2 * PROTO_HASH_SIZE + 1];
	uint8_t hdr[HDR];
	struct stat st;
	struct pin *np;
	int fd, lent;

	if (C.dirfd == -1)
		return 0;
	if (find_pin(ps, hash) != NULL)
		return 1;
	if (ps->n >= PROTO_CACHE_PINS)
		return 0;	/* the client sends the data instead */
	/* Within its share a session takes a pin whatever the others hold;
	 * beyond it, only while there are pins to lend. */
	if ((lent = (long)ps->n >= share) &&
	    atomic_fetch_add(&nlent, 1) >= lendable) {
		atomic_fetch_sub(&nlent, 1);
		return 0;
	}
	if (atomic_fetch_add(&npins, 1) >= maxpins)
		goto fail;
	hexname(hash, name);
	if ((fd = openat(C.dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) ==
	    -1) {
		if (errno != ENOENT)
			log_warn("cache: cannot open %s/%s: %s", C.dir, name,
			    strerror(errno));
		goto fail;
	}
	/* The header must agree with the name and the file's length: a
	 * file cut short is caught here, a damaged one when it is read. */
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode) ||
	    st.st_size < HDR || pread_all(fd, hdr, HDR, 0) == -1 ||
	    memcmp(hdr, MAGIC, 8) != 0 ||
	    get_u64(hdr + 8) != (uint64_t)st.st_size - HDR ||
	    memcmp(hdr + 16, hash, PROTO_HASH_SIZE) != 0) {
		drop(fd, name, "has a bad header or length (truncated?)");
		close(fd);
		goto fail;
	}
	/* Empty content is never held (protocol.md, Cache): this runner
	 * stores none, and a file of it from elsewhere is not served. */
	if (st.st_size == HDR) {
		close(fd);
		goto fail;
	}
	if (ps->n == ps->cap) {
		size_t cap = ps->cap ? 2 * ps->cap : 64;
		if ((np = realloc(ps->p, cap * sizeof(*np))) == NULL) {
			close(fd);
			goto fail;
		}
		ps->p = np;
		ps->cap = cap;
	}
	futimens(fd, NULL);	/* recently used: evicted last */
	memcpy(ps->p[ps->n].hash, hash, PROTO_HASH_SIZE);
	ps->p[ps->n].fd = fd;
	ps->p[ps->n].len = get_u64(hdr + 8);
	ps->n++;
	return 1;
fail:
	atomic_fetch_sub(&npins, 1);
	if (lent)
		atomic_fetch_sub(&nlent, 1);
	return 0;
}

int
cache_get(struct cache_pins *ps, const uint8_t hash[PROTO_HASH_SIZE],
    uint64_t len, uint8_t **out, char *err)
{
	char name[2 * PROTO_HASH_SIZE + 1];
	uint8_t got[PROTO_HASH_SIZE], *buf;
	struct pin *p;

	*out = NULL;
	hexname(hash, name);
	if ((p = find_pin(ps, hash)) == NULL) {
		snprintf(err, PROTO_ERRLEN, "the runner holds no content "
		    "%.16s... for this session (Thave did not report it held)",
		    name);
		return CACHE_NOTHELD;
	}
	if (p->len != len) {
		snprintf(err, PROTO_ERRLEN, "content %.16s... is %" PRIu64
		    " bytes, not %" PRIu64, name, p->len, len);
		return CACHE_BADLEN;
	}
	if ((buf = malloc(len ? len : 1)) == NULL) {
		snprintf(err, PROTO_ERRLEN, "out of host memory");
		return CACHE_BAD;
	}
	if (pread_all(p->fd, buf, len, HDR) == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot read cached content "
		    "%.16s...: %s; dropped", name, strerror(errno));
		goto bad;
	}
	/* Never serve what does not hash to its name. */
	sha256(buf, len, got);
	if (memcmp(got, hash, PROTO_HASH_SIZE) != 0) {
		snprintf(err, PROTO_ERRLEN, "cached content %.16s... is "
		    "corrupt (its SHA-256 does not match); dropped", name);
		goto bad;
	}
	futimens(p->fd, NULL);
	*out = buf;
	return 0;
bad:
	drop(p->fd, name, "failed verification");
	unpin(ps, p);
	free(buf);
	return CACHE_BAD;
}

struct cache_put {
	int fd;
	char tmp[64];
	uint64_t len, got;
	int failed;
};

/* A store that cannot finish gives its disk space back at once, before it
 * says so: on a full disk the space is what the next store needs. */
static void
put_drop(struct cache_put *pp)
{
	if (pp->fd != -1) {
		close(pp->fd);
		unlinkat(C.dirfd, pp->tmp, 0);
		pp->fd = -1;
	}
	pp->failed = 1;
}

struct cache_put *
cache_put_begin(uint64_t len)
{
	static const uint8_t zero[HDR];
	struct cache_put *pp;

	if (C.dirfd == -1 || len == 0)	/* empty content is never kept */
		return NULL;
	if (len + HDR > C.limit) {
		log_info("cache: not storing %" PRIu64 " bytes: more than "
		    "--cache-size %" PRIu64, len, C.limit);
		return NULL;
	}
	if ((pp = calloc(1, sizeof(*pp))) == NULL)
		return NULL;
	pthread_mutex_lock(&cache_lock);
	snprintf(pp->tmp, sizeof(pp->tmp), ".tmp.%ld.%u", (long)getpid(),
	    tmp_counter++);
	pthread_mutex_unlock(&cache_lock);
	pp->len = len;
	/* The header is written last, once the hash is known; read and
	 * write: cache_put_finish hashes what the file holds. */
	if ((pp->fd = openat(C.dirfd, pp->tmp, O_RDWR | O_CREAT | O_EXCL |
	    O_CLOEXEC, 0600)) == -1 || write_all(pp->fd, zero, HDR) == -1) {
		int e = errno;

		put_drop(pp);
		log_warn("cache: cannot store in %s: %s; going on without "
		    "caching this", C.dir, strerror(e));
	}
	return pp;
}

void
cache_put_write(struct cache_put *pp, const void *p, size_t n)
{
	pp->got += n;
	if (!pp->failed && write_all(pp->fd, p, n) == -1) {
		int e = errno;

		put_drop(pp);
		log_warn("cache: cannot store %" PRIu64 " bytes in %s: %s; "
		    "going on without caching them", pp->len, C.dir,
		    strerror(e));
	}
}

/* The header, then the name: the file is whole before anyone can see it.
 * Frees pp. */
static int
put_name(struct cache_put *pp, const uint8_t hash[PROTO_HASH_SIZE])
{
	char name[2 * PROTO_HASH_SIZE + 1];
	uint8_t hdr[HDR];
	int rc = -1, e = 0;

	if (pp->got != pp->len)
		pp->failed = 1;
	if (!pp->failed) {
		memcpy(hdr, MAGIC, 8);
		put_u64(hdr + 8, pp->len);
		memcpy(hdr + 16, hash, PROTO_HASH_SIZE);
		hexname(hash, name);
		if (pwrite(pp->fd, hdr, HDR, 0) != HDR ||
		    renameat(C.dirfd, pp->tmp, C.dirfd, name) == -1)
			e = errno;
		else
			rc = 0;
	}
	if (rc == -1)
		put_drop(pp);
	else
		close(pp->fd);
	if (e != 0)
		log_warn("cache: cannot store %s in %s: %s", name, C.dir,
		    strerror(e));
	if (rc == 0 && atomic_fetch_add(C.approx, pp->len + HDR) + pp->len +
	    HDR > C.limit) {
		pthread_mutex_lock(&cache_lock);
		evict();
		pthread_mutex_unlock(&cache_lock);
	}
	free(pp);
	return rc;
}

/* The SHA-256 of what the file holds, read back: mapped where the system
 * can (the pages are in memory: no copy), else in pieces. (The pieces'
 * buffer is allocated here: thread-local storage would cost every thread
 * of the runner its size, each session's among them.) */
#define HASH_PIECE (1 << 16)
static int
hash_file(int fd, uint64_t len, uint8_t hash[PROTO_HASH_SIZE])
{
	struct sha256_ctx c;
	uint64_t off, k;
	uint8_t *buf;
	void *m;

	if (len <= SIZE_MAX - HDR && (m = mmap(NULL, (size_t)(HDR + len),
	    PROT_READ, MAP_SHARED, fd, 0)) != MAP_FAILED) {
		sha256((const uint8_t *)m + HDR, (size_t)len, hash);
		munmap(m, (size_t)(HDR + len));
		return 0;
	}
	if ((buf = malloc(HASH_PIECE)) == NULL)
		return -1;
	sha256_init(&c);
	for (off = 0; off < len; off += k) {
		k = len - off < HASH_PIECE ? len - off : HASH_PIECE;
		if (pread_all(fd, buf, (size_t)k, (off_t)(HDR + off)) == -1) {
			free(buf);
			return -1;
		}
		sha256_update(&c, buf, (size_t)k);
	}
	sha256_final(&c, hash);
	free(buf);
	return 0;
}

int
cache_put_finish(struct cache_put *pp)
{
	uint8_t hash[PROTO_HASH_SIZE];

	if (!pp->failed && pp->got == pp->len &&
	    hash_file(pp->fd, pp->len, hash) == -1) {
		log_warn("cache: cannot read back %" PRIu64 " bytes stored in "
		    "%s: %s; not caching them", pp->len, C.dir,
		    strerror(errno));
		pp->failed = 1;
	}
	return put_name(pp, hash);
}
