/*
 * mtl_programs.m: Tload on Metal: compiling source (at the language
 * version mtl_device.m picks for this macOS) or loading a metallib into a
 * compute pipeline, reflection (what the kernel binds, held against
 * Tload's counts and widths), and the pipeline cache every session of the
 * process shares, keyed by SHA-256; the probe open compiles with. runner.m's
 * header describes the backend as a whole.
 */

#include "mtl.h"

/* Compiled pipelines no program uses any more that the cache keeps, so a
 * new session compiles nothing again with thread isolation (a spawned
 * session's process starts with an empty cache: mtl.h). */
#define MTL_CACHE_IDLE 256

static struct mtl_pipe *mtl_cache;	/* under mtl_lock */
static uint64_t mtl_clock;		/* under mtl_lock */

/* ---- the pipeline cache ---- */

/*
 * Programs are found by the SHA-256 of their key (protocol.md): a collision,
 * which would hand one client another client's program, would take a break
 * of SHA-256, so the key bytes themselves need not be kept.
 */
static struct mtl_pipe *
mtl_cache_find(const uint8_t digest[32])
{
	struct mtl_pipe *p;

	for (p = mtl_cache; p != NULL; p = p->next)
		if (memcmp(p->digest, digest, 32) == 0)
			return p;
	return NULL;
}

static void
mtl_pipe_free(struct mtl_pipe *p)
{
	[p->pipe release];
	free(p);
}

/*
 * Drop the least recently used unreferenced pipelines beyond MTL_CACHE_IDLE.
 * A session may still have command buffers in flight that use one: they
 * hold their own reference to it (makeCommandBuffer() keeps "pipeline
 * states" alive until the command buffer completes).
 */
static void
mtl_cache_trim(void)
{
	struct mtl_pipe **pp, **oldest, *victim;
	size_t idle;

	for (;;) {
		idle = 0;
		oldest = NULL;
		for (pp = &mtl_cache; *pp != NULL; pp = &(*pp)->next) {
			if ((*pp)->refs != 0)
				continue;
			idle++;
			if (oldest == NULL || (*pp)->used < (*oldest)->used)
				oldest = pp;
		}
		if (idle <= MTL_CACHE_IDLE)
			return;
		victim = *oldest;
		*oldest = victim->next;
		mtl_pipe_free(victim);
	}
}

/* Every pipeline, at shutdown (mtl_close), after every session is closed. */
void
mtl_cache_clear(void)
{
	struct mtl_pipe *p;

	pthread_mutex_lock(&mtl_lock);
	while ((p = mtl_cache) != NULL) {
		mtl_cache = p->next;
		mtl_pipe_free(p);
	}
	pthread_mutex_unlock(&mtl_lock);
}

/* ---- bindings (reflection) ---- */

/* One buffer binding into b; -1 for an index past the argument table. */
static int
mtl_bind_add(struct mtl_binds *b, NSUInteger index, NSUInteger size,
    NSUInteger align, BOOL used, char *err)
{
	if (index >= MTL_MAX_ARGS) {
		mtl_seterr(err, "the kernel binds a buffer at index %lu; the "
		    "argument table has %d entries", (unsigned long)index,
		    MTL_MAX_ARGS);
		return -1;
	}
	b->mask |= 1u << index;
	if (used)
		b->used |= 1u << index;
	b->size[index] = size;
	/* An alignment of 0 would mean none; offsets are checked with %. */
	b->align[index] = align != 0 ? align : 1;
	return 0;
}

/*
 * -1 for a binding that is not a buffer, naming it: the runner binds
 * buffers only (setBuffer, setBytes), so a kernel that takes threadgroup
 * memory, a texture or a sampler as a parameter would run with it unbound
 * (the validation layer stops the process). tinygrad declares its
 * threadgroup memory inside the kernel, which is no binding. type is an
 * MTLBindingType or MTLArgumentType: the two enums share these values, by
 * number here since either name would need its own availability guard.
 */
static int
mtl_bind_other(NSInteger type, NSUInteger index, char *err)
{
	const char *what;

	switch (type) {
	case 1:		/* ...ThreadgroupMemory */
		what = "threadgroup memory";
		break;
	case 2:		/* ...Texture */
		what = "a texture";
		break;
	case 3:		/* ...Sampler */
		what = "a sampler";
		break;
	default:
		what = "an argument";
		break;
	}
	mtl_seterr(err, "the kernel takes %s (Metal binding type %ld) at index "
	    "%lu as a parameter; the runner binds buffers only", what,
	    (long)type, (unsigned long)index);
	return -1;
}

/*
 * The buffer bindings of a pipeline built with reflection into b, or -1
 * for a kernel with a binding the runner cannot fill. From macOS 13
 * reflection lists MTLBindings (MTLPipelineOptionBindingInfo); before, it
 * lists MTLArguments (MTLPipelineOptionArgumentInfo, since deprecated).
 * The built-in ids are in neither. An MTLArgument's buffer properties are
 * asked of buffers only: Apple makes them a fatal error on any other type.
 */
static int
mtl_binds_read(MTLComputePipelineReflection *refl, struct mtl_binds *b,
    char *err)
{
	NSUInteger i, n;

	memset(b, 0, sizeof(*b));
	if (refl == nil) {
		/* Unknown: mtl_binds_check lets it pass, as before. */
		log_warn("metal: Metal gave no reflection for a pipeline, so "
		    "its kernel's bindings and offsets are not checked");
		return 0;
	}
	b->known = 1;
	if (@available(macOS 13.0, *)) {
		/* mtl_os as well, so that the Metal emulator's
		 * METAL_EMU_MACOS=12.0 takes the older path; on a Mac the two
		 * agree. */
		if (mtl_os[0] >= 13) {
			NSArray<id <MTLBinding>> *all = [refl bindings];
			id <MTLBinding> x;

			for (i = 0, n = [all count]; i < n; i++) {
				x = [all objectAtIndex:i];
				if ([x type] != MTLBindingTypeBuffer)
					return mtl_bind_other([x type],
					    [x index], err);
				if (mtl_bind_add(b, [x index],
				    [(id <MTLBufferBinding>)x bufferDataSize],
				    [(id <MTLBufferBinding>)x bufferAlignment],
				    [x isUsed], err) == -1)
					return -1;
			}
			return 0;
		}
	}
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
	{
		NSArray<MTLArgument *> *all = [refl arguments];
		MTLArgument *a;

		for (i = 0, n = [all count]; i < n; i++) {
			a = [all objectAtIndex:i];
			if ([a type] != MTLArgumentTypeBuffer)
				return mtl_bind_other((NSInteger)[a type],
				    [a index], err);
			if (mtl_bind_add(b, [a index], [a bufferDataSize],
			    [a bufferAlignment], [a isActive], err) == -1)
				return -1;
		}
	}
#pragma clang diagnostic pop
	return 0;
}

/* Build fn's compute pipeline, and read what it binds into b. */
static id <MTLComputePipelineState>
mtl_pipeline(id <MTLFunction> fn, struct mtl_binds *b, char *err)
{
	MTLComputePipelineReflection *refl = nil;
	id <MTLComputePipelineState> pipe;
	MTLPipelineOption opt;
	NSError *e = nil;

	/* Ask for the buffer bindings with their sizes and alignments. */
	if (@available(macOS 13.0, *))
		opt = MTLPipelineOptionBindingInfo |
		    MTLPipelineOptionBufferTypeInfo;
	else {
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
		opt = MTLPipelineOptionArgumentInfo |
		    MTLPipelineOptionBufferTypeInfo;
#pragma clang diagnostic pop
	}
	/* Build the compute pipeline; refl is autoreleased. */
	pipe = [mtl_dev newComputePipelineStateWithFunction:fn options:opt
	    reflection:&refl error:&e];
	if (pipe == nil) {
		mtl_nserr(err, "Metal pipeline creation failed", e);
		return nil;
	}
	if (mtl_binds_read(refl, b, err) == -1) {
		[pipe release];
		return nil;
	}
	return pipe;
}

/*
 * Tload's nbufs, nvals and value widths against what the kernel binds:
 * buffer bindings at exactly 0 .. nbufs+nvals-1, each value's 4 or 8
 * bytes. Called at every load, also of a cached pipeline, as another
 * client may state other bindings for the same kernel. A binding the
 * kernel does not use (reflection's used / active NO) is no reason to
 * refuse: its width is not checked and, past Tload's count, it may stay
 * unbound, as nothing reads it (tinygrad builds its pipelines with no
 * reflection at all). Whether Apple's compiler lists such parameters, and
 * as unused, is what tests/mac_report.py logs from a Mac (not seen yet);
 * on the emulator a parameter its body does not name is unused. A missing
 * index below Tload's count is still refused: a used value after it would
 * be bound one place off.
 */
static int
mtl_binds_check(const struct mtl_binds *b, const struct be_program_desc *d,
    char *err)
{
	unsigned i, n = (unsigned)d->nbufs + d->nvals, k, want;

	if (!b->known)
		return 0;
	k = (unsigned)__builtin_popcount(b->mask);
	if (k != n && (k < n || (b->used & (n >= 32 ? 0 :
	    ~((1u << n) - 1))) != 0)) {
		mtl_seterr(err, "kernel %s binds %u buffers, Tload says %u "
		    "(%u buffers and %u values)", d->name, k, n,
		    (unsigned)d->nbufs, (unsigned)d->nvals);
		return -1;
	}
	for (i = 0; i < n; i++)
		if ((b->mask >> i & 1) == 0) {
			mtl_seterr(err, "kernel %s binds no buffer at index %u; "
			    "Tload's %u arguments go to indices 0 to %u",
			    d->name, i, n, n - 1);
			return -1;
		}
	for (i = 0; i < d->nvals; i++) {
		k = d->nbufs + i;
		want = d->entry >> i & 1 ? 8 : 4;
		if (b->size[k] != want && (b->used >> k & 1)) {
			mtl_seterr(err, "kernel %s: value %u (index %u) is %lu "
			    "bytes in the kernel, Tload says %u", d->name, i, k,
			    (unsigned long)b->size[k], want);
			return -1;
		}
	}
	return 0;
}

/*
 * At -v, what reflection gave for the first MTL_BINDS_LOG kernels this
 * process compiles, and for every later one with a binding its kernel does
 * not use: whether Apple's compiler lists unused parameters, and marks
 * them so, decides how strict mtl_binds_check may be, and only a Mac can
 * say (tests/mac_report.py puts these lines in its report).
 */
#define MTL_BINDS_LOG 8

static void
mtl_binds_log(const char *name, const struct mtl_binds *b)
{
	static atomic_uint logged;
	char line[MTL_MAX_ARGS * 48 + 1];
	size_t k = 0;
	unsigned i;

	if (strcmp(name, "mtl_probe") == 0 || (atomic_fetch_add(&logged, 1) >=
	    MTL_BINDS_LOG && (!b->known || b->used == b->mask)))
		return;
	if (!b->known) {
		log_info("metal: reflection of kernel %s: none", name);
		return;
	}
	line[0] = '\0';
	for (i = 0; i < MTL_MAX_ARGS && k < sizeof(line); i++)
		if (b->mask >> i & 1)
			k += (size_t)snprintf(line + k, sizeof(line) - k,
			    "%s[%u] %lu B align %lu %s", k ? ", " : "", i,
			    (unsigned long)b->size[i], (unsigned long)b->align[i],
			    b->used >> i & 1 ? "used" : "UNUSED");
	log_info("metal: reflection of kernel %s: %u buffer bindings: %s", name,
	    (unsigned)__builtin_popcount(b->mask), line[0] ? line : "none");
}

/* ---- compiling ---- */

/*
 * The options source is compiled with, owned by the caller, or nil with
 * err set.
 */
static MTLCompileOptions *
mtl_options(char *err)
{
	MTLCompileOptions *opt;

	opt = [[MTLCompileOptions alloc] init];
	if (opt == nil) {
		fprintf(stderr, "%s: MTLCompileOptions init failed\n", __func__);
		mtl_seterr(err, "out of memory");
		return nil;
	}
	/*
	 * The language version tinygrad pins for this macOS
	 * (mtl_language). It comes first: mathMode's default "depends
	 * on the language standard version" (MTLLibrary.h), so the
	 * math settings follow it.
	 */
	opt.languageVersion = mtl_language();
	/*
	 * IEEE-safe math, as tinygrad compiles (-fno-fast-math) unless
	 * METAL_FAST_MATH is set; Metal's own default is fast math.
	 * From macOS 15 that is two settings, both set here rather than
	 * left to the deprecated fastMathEnabled's mapping: mathMode
	 * Safe, and the precise FP32 functions (the header's default
	 * is Fast). SDKs before 15 (no __MAC_15_0) declare neither, and
	 * systems before 15 know only fastMathEnabled.
	 */
#ifdef __MAC_15_0
	if (@available(macOS 15.0, *)) {
		/* No unsafe floating-point optimizations. */
		opt.mathMode = MTLMathModeSafe;
		/* The precise FP32 math functions. */
		opt.mathFloatingPointFunctions =
		    MTLMathFloatingPointFunctionsPrecise;
	} else
#endif
	{
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
		opt.fastMathEnabled = NO;
#pragma clang diagnostic pop
	}
	return opt;
}

/*
 * Compile d into a pipeline the caller owns, or nil with err set; for a
 * compile error *longerr gets the compiler's whole text, which does not
 * fit err (the client wants it verbatim, as tinygrad shows it locally).
 * What the kernel binds goes into binds.
 */
static id <MTLComputePipelineState>
mtl_compile(const struct be_program_desc *d, struct mtl_binds *binds,
    char *err, char **longerr)
{
	dispatch_data_t data = nil;
	NSString *src = nil, *name = nil;
	MTLCompileOptions *opt = nil;
	id <MTLLibrary> lib = nil;
	id <MTLFunction> fn = nil;
	id <MTLComputePipelineState> pipe = nil;
	/* One NSError per call: a library that compiles with warnings comes
	 * with an error too (MTLLibraryErrorCompileWarning), which must never
	 * stand for a later call's failure. */
	NSError *e = nil;
	const char *text;

	if (d->kind == PROTO_PROG_METALLIB) {
		/* Wrap the metallib; the default destructor copies the bytes. */
		data = dispatch_data_create(d->data, d->datalen, NULL,
		    DISPATCH_DATA_DESTRUCTOR_DEFAULT);
		if (data == nil) {
			fprintf(stderr, "%s: dispatch_data_create failed\n",
			    __func__);
			mtl_seterr(err, "out of memory for a %zu-byte metallib",
			    d->datalen);
			goto fail;
		}
		/* Load the precompiled library. */
		lib = [mtl_dev newLibraryWithData:data error:&e];
		if (lib == nil) {
			mtl_nserr(err, "metallib rejected", e);
			goto fail;
		}
	} else {
		/* The source is not NUL-terminated: take exactly datalen bytes. */
		src = [[NSString alloc] initWithBytes:d->data
		    length:d->datalen encoding:NSUTF8StringEncoding];
		if (src == nil) {
			mtl_seterr(err, "Metal source is not valid UTF-8");
			goto fail;
		}
		if ((opt = mtl_options(err)) == nil)
			goto fail;
		/* Compile the source. */
		lib = [mtl_dev newLibraryWithSource:src options:opt error:&e];
		if (lib == nil) {
			mtl_nserr(err, "Metal compile failed", e);
			if (e != nil && (text = [[e localizedDescription]
			    UTF8String]) != NULL && (*longerr = malloc(
			    strlen(text) + 32)) != NULL)
				snprintf(*longerr, strlen(text) + 32,
				    "Metal compile failed: %s", text);
			goto fail;
		}
	}

	/* Find the kernel. */
	name = [[NSString alloc] initWithBytes:d->name length:strlen(d->name)
	    encoding:NSUTF8StringEncoding];
	if (name == nil) {
		mtl_seterr(err, "kernel name is not valid UTF-8");
		goto fail;
	}
	fn = [lib newFunctionWithName:name];
	if (fn == nil) {
		mtl_seterr(err, "the program has no kernel named %s", d->name);
		goto fail;
	}

	if ((pipe = mtl_pipeline(fn, binds, err)) != nil)
		mtl_binds_log(d->name, binds);

fail:
	[fn release];
	[lib release];
	[name release];
	[opt release];
	[src release];
	if (data != nil)
		dispatch_release(data);
	return pipe;
}

/*
 * Compile a one-line kernel from source (with the standard header, as
 * tinygrad's kernels have it), as ggml-metal compiles its library
 * when it opens the device. Source goes through Apple's compiler service
 * (MTLCompilerService, over XPC), which processes that launchd starts as
 * daemons have been reported unable to reach ("Unable to reach
 * MTLCompilerService ... Connection init failed"): such a runner would
 * advertise source, answer the handshake and fail every kernel. Metallibs do
 * not need the service. Not seen on a Mac by this project: the Metal
 * emulator's METAL_EMU_NO_COMPILER=1 stands in for it. Returns 0, or -1 with
 * the whole error text in *why (malloc'd; the caller frees it).
 */
int
mtl_probe(char **why)
{
	static const char src[] = "#include <metal_stdlib>\n"
	    "kernel void mtl_probe(device int *out) { out[0] = 1; }\n";
	struct be_program_desc d;
	struct mtl_binds binds;
	id <MTLComputePipelineState> pipe;
	char err[BE_ERR_MAX];

	memset(&d, 0, sizeof(d));
	d.kind = PROTO_PROG_METAL_SOURCE;
	d.name = "mtl_probe";
	d.data = (const uint8_t *)src;
	d.datalen = sizeof(src) - 1;
	*why = NULL;
	/* The same compile, options and pipeline as a client's source. */
	pipe = mtl_compile(&d, &binds, err, why);
	if (pipe != nil) {
		[pipe release];
		return 0;
	}
	if (*why == NULL)
		*why = strdup(err);
	return -1;
}

/* ---- programs ---- */

/* Drop a program's reference to its pipeline. */
static void
mtl_unref(struct mtl_pipe *p)
{
	@autoreleasepool {
		pthread_mutex_lock(&mtl_lock);
		if (--p->refs == 0)
			p->used = ++mtl_clock;
		mtl_cache_trim();
		pthread_mutex_unlock(&mtl_lock);
	}
}

/*
 * Check d's bindings against the pipeline's and take each buffer's
 * alignment: Apple, setBuffer:offset:atIndex:, "for buffers binding to an
 * argument using the device address space, align the offset to the data
 * type's size". Unknown bindings (no reflection) ask for none.
 */
static int
mtl_prog_binds(struct be_program *prog, const struct be_program_desc *d,
    char *err)
{
	const struct mtl_binds *b = &prog->pipe->binds;
	uint16_t i;

	if (mtl_binds_check(b, d, err) == -1)
		return -1;
	/* An unused buffer's offset is no concern of its kernel's. */
	for (i = 0; i < d->nbufs; i++)
		prog->align[i] = b->known && (b->used >> i & 1) ?
		    (uint32_t)b->align[i] : 1;
	return 0;
}

static struct be_program *
mtl_load_body(const struct be_program_desc *d, char *err, char **longerr,
    unsigned *compiled)
{
	struct be_program *prog = NULL;
	struct mtl_pipe *p, *q, *fresh = NULL;
	id <MTLComputePipelineState> pipe;
	uint8_t *key, digest[32];
	size_t namelen, keylen;

	if (d->kind != PROTO_PROG_METALLIB &&
	    d->kind != PROTO_PROG_METAL_SOURCE) {
		mtl_seterr(err, "backend metal does not accept CPU images");
		return NULL;
	}
	if (d->nvals < 32 && d->entry >> d->nvals != 0) {
		mtl_seterr(err, "%s: the value widths (entry 0x%x) name values "
		    "past its %u", d->name, (unsigned)d->entry,
		    (unsigned)d->nvals);
		return NULL;
	}
	if ((unsigned)d->nbufs + d->nvals > MTL_MAX_ARGS) {
		mtl_seterr(err, "%s takes %u arguments; a Metal kernel can "
		    "bind at most %d (buffers and integers together)", d->name,
		    (unsigned)d->nbufs + d->nvals, MTL_MAX_ARGS);
		return NULL;
	}

	if ((prog = calloc(1, sizeof(*prog))) == NULL ||
	    (fresh = calloc(1, sizeof(*fresh))) == NULL) {
		mtl_seterr(err, "out of memory");
		goto fail;
	}
	/* kind[2] name NUL data: the name holds no NUL, so the key is unique. */
	namelen = strlen(d->name);
	keylen = 2 + namelen + 1 + d->datalen;
	if ((key = malloc(keylen)) == NULL) {
		mtl_seterr(err, "out of memory");
		goto fail;
	}
	key[0] = (uint8_t)(d->kind & 0xff);
	key[1] = (uint8_t)(d->kind >> 8);
	memcpy(key + 2, d->name, namelen + 1);
	memcpy(key + 2 + namelen + 1, d->data, d->datalen);
	sha256(key, keylen, digest);
	free(key);

	pthread_mutex_lock(&mtl_lock);
	if ((p = mtl_cache_find(digest)) != NULL)
		p->refs++;
	pthread_mutex_unlock(&mtl_lock);

	if (p == NULL) {
		/* Compile outside the lock; other sessions keep running. */
		if ((pipe = mtl_compile(d, &fresh->binds, err, longerr)) == nil)
			goto fail;
		(*compiled)++;
		fresh->maxthreads = [pipe maxTotalThreadsPerThreadgroup];
		pthread_mutex_lock(&mtl_lock);
		if ((q = mtl_cache_find(digest)) != NULL) {
			/* Another session compiled it meanwhile: use theirs. */
			q->refs++;
			pthread_mutex_unlock(&mtl_lock);
			[pipe release];
			p = q;
		} else {
			memcpy(fresh->digest, digest, sizeof(digest));
			fresh->pipe = pipe;
			fresh->refs = 1;
			fresh->next = mtl_cache;
			mtl_cache = fresh;
			pthread_mutex_unlock(&mtl_lock);
			p = fresh;
			fresh = NULL;
		}
	}

	free(fresh);
	fresh = NULL;
	prog->pipe = p;
	if (mtl_prog_binds(prog, d, err) == -1) {
		mtl_unref(p);
		goto fail;
	}
	prog->nbufs = d->nbufs;
	prog->nvals = d->nvals;
	prog->wide = d->entry;
	snprintf(prog->name, sizeof(prog->name), "%s", d->name);
	/* Its encoders' label; a name that is not UTF-8 leaves none. */
	if ((key = malloc(namelen + 8)) != NULL) {
		snprintf((char *)key, namelen + 8, "kernel %s", d->name);
		prog->label = [[NSString alloc] initWithBytes:key
		    length:namelen + 7 encoding:NSUTF8StringEncoding];
		free(key);
	}
	return prog;

fail:
	free(fresh);
	free(prog);
	return NULL;
}

struct be_program *
mtl_load(struct be_session *s, const struct be_program_desc *d, char *err,
    char **longerr)
{
	struct be_program *prog;

	@autoreleasepool {
		unsigned compiled = 0;

		prog = mtl_load_body(d, err, longerr, &compiled);
		if (prog != NULL && compiled)
			s->compiled++;
		else if (prog != NULL)
			s->reused++;
	}
	return prog;
}

void
mtl_unload(struct be_session *s, struct be_program *prog)
{
	(void)s;
	mtl_unref(prog->pipe);
	[prog->label release];
	free(prog);
}

/* backend.h, align: fixed at load, so a launch checks with one % each. */
const uint32_t *
mtl_align(const struct be_program *prog)
{
	return prog->align;
}
