/*
 * backend.h: the interface every device backend implements.
 *
 * A backend is a table of functions chosen at start-up by name (--backend);
 * which backends exist is decided at build time (the CPU backend everywhere,
 * the Metal backend, runner.m, on macOS: MR_BACKEND_METAL). This header is plain C with opaque
 * handles: only a backend's own file knows its device types.
 *
 * Conventions: functions return 0 (or a non-NULL handle) on success and -1
 * (or NULL) on failure, after writing a one-line message of at most
 * BE_ERR_MAX bytes into err, which the session sends to the client as the
 * Rerror text. The session validates every handle, offset and length before
 * it calls a backend, so backends may trust their arguments.
 *
 * Threading: open() is called once, before any session. Every other call is
 * made by the thread serving one session, with that session's context; calls
 * for different sessions may run concurrently (thread isolation), so shared
 * state such as a compiled-pipeline cache needs its own lock.
 */
#ifndef METAL_RUNNER_BACKEND_H
#define METAL_RUNNER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#define BE_ERR_MAX 512

/* How sessions are isolated from each other, see isolate.c. */
enum be_isolation {
	BE_ISOLATE_PROCESS = 1,	/* one forked process per session */
	BE_ISOLATE_THREAD = 2,	/* one thread per session, one process */
	BE_ISOLATE_SPAWN = 3	/* one process per session, a fresh one
				 * (posix_spawn of the runner: isolate.c) */
};

struct be_info {
	uint16_t backend;	/* PROTO_BACKEND_* */
	uint16_t caps;		/* PROTO_CAP_* the backend supports */
	uint32_t ncores;	/* threads a CPU kernel may use (core_id range) */
	uint64_t memory;	/* bytes of device memory a client may use */
	uint64_t maxbuf;	/* largest single buffer */
	char name[64];		/* device name */
	char arch[16];		/* "x86_64", "arm64", or the GPU family "Apple9" */
	char cpu[32];		/* CPU backends: the -march/-mcpu to compile for;
				 * Metal: the macOS version, "14.5.0" */
	char features[128];	/* CPU backends: extra target features, "+a,-b";
				 * Metal: the newest language version, "3.1" */
};

struct be_session;	/* per-session backend state (command queue, threads) */
struct be_buffer;	/* device memory */
struct be_program;	/* a loaded, ready-to-launch kernel */

/* What a client sends to load a program (fields of Tload, checked). */
struct be_program_desc {
	uint16_t kind;		/* PROTO_PROG_* */
	uint16_t arch;		/* PROTO_ARCH_* for CPU images */
	uint16_t nbufs;		/* buffer arguments the kernel takes */
	uint16_t nvals;		/* integer arguments after the buffers */
	uint16_t corearg;	/* argument index of core_id, or PROTO_NO_CORE */
	uint32_t entry;		/* CPU images: entry point offset in data */
	const char *name;	/* kernel function name, NUL-terminated */
	const uint8_t *data;	/* the image, metallib or source */
	size_t datalen;
};

/*
 * Profiling (protocol.md, Tprofile): where a backend stores when the device
 * started and finished one piece of work, in ns of its clock(). The session
 * passes one only while its client profiles; NULL otherwise, and then a
 * backend times nothing it would not time anyway. A span is filled in by the
 * time sync() (or a waited launch) returns; work that failed on the device
 * may leave it 0, 0.
 */
struct be_span {
	uint64_t start;
	uint64_t end;
};

/* One launch with every handle already resolved by the session. */
struct be_launch {
	struct be_program *prog;
	uint16_t nbufs;
	uint16_t nvals;
	struct be_buffer **bufs;	/* nbufs buffers */
	const uint64_t *offsets;	/* nbufs byte offsets, each <= buffer size */
	const int64_t *vals;		/* nvals integer arguments */
	uint32_t global[3];
	uint32_t local[3];
	struct be_span *span;		/* profiling: this kernel's times, or NULL */
};

struct backend {
	const char *name;		/* "cpu", "metal" */
	enum be_isolation isolation;	/* default isolation for this backend */
	int no_fork;			/* device not fork-safe (Metal): process
					 * isolation spawns (isolate.c) */

	/* Open the device once; fill info. known: NULL, or what the runner's
	 * own open filled in (a spawned session process, isolate.c), from
	 * which a backend takes what it would otherwise find out at a cost
	 * (Metal: whether source compiles here, its start-up probe). */
	int (*open)(struct be_info *info, const char *device,
	    const struct be_info *known, char *err);
	/* Release the device at shutdown. */
	void (*close)(void);

	struct be_session *(*session_open)(char *err);
	/* Waits for the session's work, then frees its per-session state. */
	void (*session_close)(struct be_session *s);

	struct be_buffer *(*alloc)(struct be_session *s, uint64_t size, char *err);
	void (*free)(struct be_session *s, struct be_buffer *b);
	/* Host-visible memory of the buffer. The session reads from and writes
	 * to the socket straight into it, after sync() when work is in flight. */
	void *(*contents)(struct be_buffer *b);
	/* NULL, or: the host is about to read b's contents, or to write part
	 * of them, after sync() (Metal without unified memory: Managed
	 * storage keeps a CPU copy that the GPU's writes reach only when
	 * asked to, and a CPU write marked with host_wrote may carry more of
	 * that copy to the GPU than the range written: Apple's "Synchronizing
	 * a Managed Resource"). */
	int (*host_read)(struct be_session *s, struct be_buffer *b, char *err);
	/* NULL, or: the host wrote count bytes at off into b's contents
	 * (Managed storage: the GPU's copy takes them). */
	void (*host_wrote)(struct be_buffer *b, uint64_t off, uint64_t count);
	/* span: profiling, the copy's times, or NULL (see struct be_span). */
	int (*copy)(struct be_session *s, struct be_buffer *dst, uint64_t dstoff,
	    struct be_buffer *src, uint64_t srcoff, uint64_t count,
	    struct be_span *span, char *err);

	/* A message longer than err holds (a compiler's whole output) may
	 * come in *longerr instead, malloc'd; the caller frees it. */
	struct be_program *(*load)(struct be_session *s,
	    const struct be_program_desc *d, char *err, char **longerr);
	void (*unload)(struct be_session *s, struct be_program *p);
	/* NULL, or: the alignment each of p's nbufs buffer offsets must have
	 * (1: any), fixed when p was loaded and valid while it is; the
	 * session refuses a launch with an offset that is not a multiple
	 * (EINVAL) before the backend sees it. Metal: the data type's size
	 * of each device buffer, from the pipeline's reflection. The CPU
	 * backend cannot know the types in a machine-code image: NULL. */
	const uint32_t *(*align)(const struct be_program *p);

	/* Launch n kernels in order (n > 1 for a graph). With wait set, return
	 * only when they finished and store the device-measured time in *ns.
	 * A launch that fails returns only once none of its kernels still
	 * runs or will write a span; the session drops its profile records. */
	int (*launch)(struct be_session *s, const struct be_launch *l, size_t n,
	    int wait, uint64_t *ns, char *err);
	/* Wait for all work the session submitted; report a deferred device
	 * error (a kernel that failed after launch returned). */
	int (*sync)(struct be_session *s, char *err);
	/* NULL, or: the session has processed all the input that has arrived
	 * and is about to read (and maybe wait) for more, when it also sends
	 * its replies: start the work launched so far (Metal: commit the
	 * command buffer being encoded). */
	void (*idle)(struct be_session *s);
	/* Now, in ns of the clock spans are measured in (Rclock): CPU,
	 * CLOCK_MONOTONIC; Metal, the host time base of GPUStartTime. */
	uint64_t (*clock)(void);
	/* NULL, or: the device is gone for good (Metal: every later command
	 * buffer of the process would fail), a one-line reason, else NULL.
	 * Any thread may ask. The session that sees it set ends, telling its
	 * client why; the runner then ends every session and mr_serve()
	 * returns -1, so that a service manager restarts the process. Only
	 * for thread isolation: a session process's device is its own, and
	 * its loss ends that session only (isolate.c). */
	const char *(*lost)(void);
};

extern const struct backend be_cpu;
/* Set by the build where runner.m is compiled in: macOS, and the Metal
 * emulator build (metal_runner_emu) on Linux. */
#ifdef MR_BACKEND_METAL
extern const struct backend be_metal;
#endif

#endif
