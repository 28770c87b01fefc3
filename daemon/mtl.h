/*
 * mtl.h: what the Metal backend's files share, and no other file includes
 * (as ggml-metal's files share ggml-metal-device.h). backend.h is the
 * backend's face to the runner: plain C, opaque handles; only the files
 * below, and this header, mention id<MTL...>. From the top, each calling
 * only those below it:
 *
 *	runner.m	the backend table (be_metal), open and close,
 *			copies, launches and graphs: command encoding
 *	mtl_programs.m	Tload: compiling, reflection (what a kernel
 *			binds), the pipeline cache
 *	mtl_buffers.m	buffers: alloc, free, a Managed buffer's two copies
 *	mtl_queue.m	a session's command queue and command buffers:
 *			start, commit, wait, what a failed one means
 *	mtl_device.m	the device and this macOS (what Rhello says of
 *			them, the language version source is compiled at),
 *			error texts, the clock
 *
 * Manual retain/release throughout (runner.m's header says why and how).
 */
#ifndef MTL_H
#define MTL_H

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <dispatch/dispatch.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "metal_runner.h"
#include "protocol.h"

#if __has_feature(objc_arc)
#error "the Metal backend manages memory by hand: compile it with -fno-objc-arc"
#endif

/* Committed command buffers a session tracks: the queue allows at most 64
 * uncompleted ones (newCommandQueue), so more would only block anyway. */
#define MTL_INFLIGHT 64

/* Buffer argument table entries per kernel (Metal feature set tables; the
 * same 31 as tinygrad's setMaxKernelBufferBindCount_). Buffers and integer
 * arguments both take entries. */
#define MTL_MAX_ARGS 31

/*
 * The buffer bindings a kernel declares, from its pipeline's reflection:
 * tinygrad binds its buffers at 0 .. nbufs-1 and its integers (setBytes)
 * after them, so a Tload whose nbufs, nvals or value widths disagree would
 * bind wrong (Apple's validation layer stops the process on that; without
 * it a kernel reads short or past its data).
 */
struct mtl_binds {
	int known;			/* 0: Metal gave no reflection */
	uint32_t mask;			/* bit i: a buffer binding at index i */
	uint32_t used;			/* bit i: one the kernel uses (MTLBinding
					 * used, MTLArgument active): only those
					 * are held to Tload's count and widths */
	NSUInteger size[MTL_MAX_ARGS];	/* its bufferDataSize */
	NSUInteger align[MTL_MAX_ARGS];	/* its bufferAlignment */
};

/* A compiled pipeline, shared by every program loaded with the same key. */
struct mtl_pipe {
	struct mtl_pipe *next;
	uint8_t digest[32];		/* SHA-256 of kind[2] name NUL data */
	id <MTLComputePipelineState> pipe;	/* owned */
	NSUInteger maxthreads;		/* pipe.maxTotalThreadsPerThreadgroup */
	struct mtl_binds binds;		/* what its kernel binds */
	unsigned refs;			/* be_programs using it */
	uint64_t used;			/* when refs last dropped to 0 (LRU) */
};

struct be_program {
	struct mtl_pipe *pipe;		/* holds one of its refs */
	uint16_t nbufs;
	uint16_t nvals;
	uint32_t wide;			/* bit i: value i is 64-bit (Tload.entry) */
	/* Buffer i's offset must be a multiple of align[i] (backend.h). */
	uint32_t align[MTL_MAX_ARGS];
	char name[PROTO_MAX_NAME + 1];
	/* Owned, or nil: "kernel NAME", the label of the compute encoder of
	 * each launch of it alone, by which a failed command buffer's error
	 * names the kernel that faulted (mtl_faulted). */
	NSString *label;
};

struct be_buffer {
	id <MTLBuffer> buf;		/* owned */
	void *ptr;			/* [buf contents], fixed for its life */
	uint64_t size;			/* its length */
	uint64_t useq;			/* the session's last command buffer
					 * that uses it (its seq), 0: none */
	int gpuw;			/* managed storage: the GPU may have
					 * written it since the CPU's copy was
					 * last synchronized (mtl_host_read) */
};

struct be_session {
	id <MTLCommandQueue> queue;	/* owned */
	/* Owned, or nil before macOS 11: an MTLCommandBufferDescriptor with
	 * MTLCommandBufferErrorOptionEncoderExecutionStatus, from which every
	 * command buffer is made, so that a failed one says which encoder
	 * faulted (mtl_faulted). Typed id: the class is macOS 11's. */
	id desc;
	id <MTLCommandBuffer> open;	/* owned; being encoded, not committed */
	size_t nopen;			/* commands encoded into open */
	uint64_t seq;			/* command buffers started, numbered
					 * from 1: open's number, if open */
	id <MTLCommandBuffer> flight[MTL_INFLIGHT];	/* owned; committed */
	uint64_t fseq[MTL_INFLIGHT];	/* their numbers, oldest first */
	size_t nflight;
	/* Profiling: where the GPU times of open and of each flight[i] go
	 * once it completes, or NULL. A profiled command buffer holds one
	 * launch or copy, the only way to time each with GPUStartTime. */
	struct be_span *ospan;
	struct be_span *fspan[MTL_INFLIGHT];
	char err[BE_ERR_MAX];		/* first failure of a committed buffer */
	/* Loads that compiled a pipeline, and loads the cache answered: the
	 * log shows that a second session of a model compiles nothing with
	 * thread isolation, and as much as the first in a spawned process. */
	unsigned compiled, reused;
};

/* ---- mtl_device.m: the device, this macOS, error texts, the clock ---- */

/* owned. Set by open; in the runner's own process (no known info: not a
 * spawned session) released again once open has learnt what Rhello says,
 * and set again, under mtl_lock, by the first session_open (thread
 * isolation): mtl_dev_get. Read-only while any session is open. */
extern id <MTLDevice> mtl_dev;
/* No unified memory (an Intel Mac's discrete GPU): buffers are Managed,
 * a CPU and a GPU copy (mtl_host_read, mtl_host_wrote). Read-only after
 * open. */
extern int mtl_managed;
/* The runner's macOS, major, minor, patch (mtl_os_read); read-only after
 * open. */
extern int mtl_os[3];
/* Guards taking mtl_dev again (mtl_dev_get), the pipeline cache
 * (mtl_programs.m) and the record of a lost GPU (mtl_queue.m). */
extern pthread_mutex_t mtl_lock;

void mtl_trim_utf8(char *s);
void mtl_seterr(char *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mtl_nserr(char *err, const char *what, NSError *e);
MTLLanguageVersion mtl_language(void);
int mtl_dev_open(struct be_info *info, const char *device, char *err);
int mtl_dev_get(char *err);
uint64_t mtl_now_ns(void);

/* ---- mtl_queue.m: a session's queue and command buffers ---- */

void mtl_cberr(char *err, const char *what0, id <MTLCommandBuffer> cb);
const char *mtl_lost(void);
void mtl_reap(struct be_session *s, int waitall);
void mtl_commit(struct be_session *s);
void mtl_drain(struct be_session *s);
id <MTLCommandBuffer> mtl_cmdbuf(struct be_session *s, char *err);
id <MTLBlitCommandEncoder> mtl_blit(struct be_session *s, char *err);
struct be_session *mtl_session_open(char *err);
void mtl_session_close(struct be_session *s);
void mtl_idle(struct be_session *s);
int mtl_sync(struct be_session *s, char *err);

/* ---- mtl_buffers.m: buffers ---- */

struct be_buffer *mtl_alloc(struct be_session *s, uint64_t size, char *err);
void mtl_free(struct be_session *s, struct be_buffer *b);
void *mtl_contents(struct be_buffer *b);
/* host_read within the caller's @autoreleasepool (runner.m, mtl_copy). */
int mtl_host_read_body(struct be_session *s, struct be_buffer *b, char *err);
int mtl_host_read(struct be_session *s, struct be_buffer *b, char *err);
void mtl_host_wrote(struct be_buffer *b, uint64_t off, uint64_t count);

/* ---- mtl_programs.m: Tload ---- */

int mtl_probe(char **why);
void mtl_cache_clear(void);
struct be_program *mtl_load(struct be_session *s,
    const struct be_program_desc *d, char *err, char **longerr);
void mtl_unload(struct be_session *s, struct be_program *prog);
const uint32_t *mtl_align(const struct be_program *prog);

#endif /* MTL_H */
