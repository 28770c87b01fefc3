/*
 * storeq.c: stores to the cache finished off the session's path.
 *
 * Storing a content costs more than receiving it: on the 2-vCPU VM of
 * docs/cache.md the SHA-256 alone runs at 1.4 GB/s, and the file at about
 * 2 GB/s, against a link's 1 GB/s. Done inline, every Twrite with FCACHE
 * held the session, and so the client, to their sum. So a store is split
 * (cache.c): the bytes go into their temporary file as they arrive, and
 * the hash, computed over what the file then holds, and the rename that
 * names the file, come later, here, by a thread of their own, while the
 * session reads its next request. What waits is in files (the system's
 * page cache), not in this process's memory; the wait is bounded
 * (STOREQ_MAX bytes; past it storeq_put finishes stores itself), so a
 * client that writes faster than the hash keeps up costs at most that
 * much unnamed content.
 *
 * Used by the cache helper (cachelink.c, process isolation) and by the
 * sessions that reach the store themselves (thread isolation: one queue
 * for the runner process). Without a thread (pthread_create failed) each
 * store is finished at once.
 */
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cache.h"

struct item {
	struct item *next;
	struct cache_put *pp;
	uint64_t len;
};

struct storeq {
	pthread_mutex_t lock;
	pthread_cond_t more;		/* to the thread: an item, or the end */
	pthread_cond_t less;		/* to callers: room, or all stored */
	struct item *head, *tail;
	uint64_t queued;		/* bytes waiting or being finished */
	int ending;
	int threaded;
	pthread_t thread;
};

/* The next item, under the lock; NULL if none. */
static struct item *
take(struct storeq *q)
{
	struct item *it;

	if ((it = q->head) != NULL && (q->head = it->next) == NULL)
		q->tail = NULL;
	return it;
}

/* Finish it, without the lock held, and count it done. */
static void
finish(struct storeq *q, struct item *it)
{
	pthread_mutex_unlock(&q->lock);
	cache_put_finish(it->pp);
	pthread_mutex_lock(&q->lock);
	q->queued -= it->len;
	free(it);
	pthread_cond_broadcast(&q->less);
}

static void *
finish_loop(void *arg)
{
	struct storeq *q = arg;
	struct item *it;

#ifdef __linux__
	/* Behind the session and the client on a busy CPU: a nice value is
	 * per thread on Linux (on the 2-vCPU VM a first upload ran at 0.50x
	 * the upload without the cache with it, 0.40x without: d639bfe). It
	 * does not fall far behind: past the bound, at a Thave and at the
	 * end, the callers finish what waits themselves. */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
#endif
	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (q->head == NULL && !q->ending)
			pthread_cond_wait(&q->more, &q->lock);
		if ((it = take(q)) == NULL)
			break;
		finish(q, it);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

struct storeq *
storeq_new(void)
{
	struct storeq *q;

	if ((q = calloc(1, sizeof(*q))) == NULL)
		return NULL;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->more, NULL);
	pthread_cond_init(&q->less, NULL);
	q->threaded = pthread_create(&q->thread, NULL, finish_loop, q) == 0;
	return q;
}

void
storeq_put(struct storeq *q, struct cache_put *pp, uint64_t len)
{
	struct item *it;

	if (q == NULL || !q->threaded ||
	    (it = malloc(sizeof(*it))) == NULL) {
		cache_put_finish(pp);
		return;
	}
	it->next = NULL;
	it->pp = pp;
	it->len = len;
	pthread_mutex_lock(&q->lock);
	/* Past the bound the caller finishes what waits itself, at its own
	 * priority; a content larger than the bound goes alone. */
	while (q->queued > 0 && q->queued + len > STOREQ_MAX) {
		struct item *w;

		if ((w = take(q)) != NULL)
			finish(q, w);
		else
			pthread_cond_wait(&q->less, &q->lock);
	}
	if (q->tail != NULL)
		q->tail->next = it;
	else
		q->head = it;
	q->tail = it;
	q->queued += len;
	pthread_cond_signal(&q->more);
	pthread_mutex_unlock(&q->lock);
}

/* The caller finishes what waits itself, beside the thread, which the
 * system may run last (its nice value, above). */
void
storeq_drain(struct storeq *q)
{
	struct item *it;

	if (q == NULL)
		return;
	pthread_mutex_lock(&q->lock);
	while ((it = take(q)) != NULL)
		finish(q, it);
	while (q->queued > 0)
		pthread_cond_wait(&q->less, &q->lock);
	pthread_mutex_unlock(&q->lock);
}

void
storeq_free(struct storeq *q)
{
	if (q == NULL)
		return;
	storeq_drain(q);
	if (q->threaded) {
		pthread_mutex_lock(&q->lock);
		q->ending = 1;
		pthread_cond_signal(&q->more);
		pthread_mutex_unlock(&q->lock);
		pthread_join(q->thread, NULL);
	}
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->more);
	pthread_cond_destroy(&q->less);
	free(q);
}
