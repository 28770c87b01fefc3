/*
 * htab.c: open-addressing hash table from client-chosen 32-bit handles to
 * objects. Handles are chosen by the client, so the table grows with the
 * number of live handles only, never with a handle's value.
 */
#include <stdlib.h>

#include "metal_runner.h"

#define EMPTY 0
#define LIVE 1
#define TOMB 2

/* vals[i] == NULL marks an empty slot; a tombstone points at the table. */
static uint32_t
hash(uint32_t k)
{
	k ^= k >> 16;
	k *= 0x7feb352d;
	k ^= k >> 15;
	k *= 0x846ca68b;
	k ^= k >> 16;
	return k;
}

static int
state(const struct htab *t, uint32_t i)
{
	if (t->vals[i] == NULL)
		return EMPTY;
	return t->vals[i] == (void *)t ? TOMB : LIVE;
}

/* The slot holding key, or -1. */
static int64_t
find(const struct htab *t, uint32_t key)
{
	uint32_t i, mask;

	if (t->cap == 0)
		return -1;
	mask = t->cap - 1;
	for (i = hash(key) & mask;; i = (i + 1) & mask) {
		int st = state(t, i);
		if (st == EMPTY)
			return -1;
		if (st == LIVE && t->keys[i] == key)
			return i;
	}
}

void *
htab_get(const struct htab *t, uint32_t key)
{
	int64_t i = find(t, key);

	return i < 0 ? NULL : t->vals[i];
}

static int
grow(struct htab *t)
{
	struct htab n = { 0 };
	uint32_t i;

	n.cap = t->cap ? t->cap * 2 : 16;
	if (t->count * 4 < t->cap)	/* mostly tombstones: rehash in place */
		n.cap = t->cap;
	n.keys = calloc(n.cap, sizeof(*n.keys));
	n.vals = calloc(n.cap, sizeof(*n.vals));
	if (n.keys == NULL || n.vals == NULL) {
		free(n.keys);
		free(n.vals);
		return -1;
	}
	for (i = 0; i < t->cap; i++)
		if (state(t, i) == LIVE)
			htab_put(&n, t->keys[i], t->vals[i]);
	free(t->keys);
	free(t->vals);
	*t = n;
	return 0;
}

int
htab_put(struct htab *t, uint32_t key, void *val)
{
	uint32_t i, mask;

	/* Keep at least a quarter of the slots empty so probes terminate. */
	if ((t->count + t->tombs + 1) * 4 > t->cap * 3 && grow(t) == -1)
		return -1;
	mask = t->cap - 1;
	for (i = hash(key) & mask; state(t, i) == LIVE; i = (i + 1) & mask)
		;
	if (state(t, i) == TOMB)
		t->tombs--;
	t->keys[i] = key;
	t->vals[i] = val;
	t->count++;
	return 0;
}

void *
htab_del(struct htab *t, uint32_t key)
{
	int64_t i = find(t, key);
	void *v;

	if (i < 0)
		return NULL;
	v = t->vals[i];
	t->vals[i] = (void *)t;
	t->count--;
	t->tombs++;
	return v;
}

void
htab_clear(struct htab *t, void (*fn)(void *, void *), void *arg)
{
	uint32_t i;

	for (i = 0; i < t->cap; i++)
		if (state(t, i) == LIVE && fn != NULL)
			fn(t->vals[i], arg);
	free(t->keys);
	free(t->vals);
	t->keys = NULL;
	t->vals = NULL;
	t->cap = t->count = t->tombs = 0;
}
