/*
 * foundation.m: the Foundation and libdispatch subset runner.m uses, on the
 * GNU Objective-C runtime. TEST HARNESS ONLY (see README.md).
 *
 * Manual retain/release as on Apple platforms: every object carries its
 * reference count in a header in front of it. Autorelease pools are a
 * per-thread stack; @autoreleasepool compiles to NSAutoreleasePool's
 * alloc/init/drain under this runtime. Every allocation and deallocation is
 * counted per class, so tests can check that a session released everything
 * it made (emu_live_objects, printed at exit).
 */
#import "emu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct objhdr {
	_Atomic long refs;
	long pad;		/* keep the object 16-byte aligned */
};

/* ---- live-object counts ---- */

#define EMU_NCLASSES 64

static struct {
	Class cls;
	_Atomic long live;
} counts[EMU_NCLASSES];
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;

void
emu_count(Class cls, int delta)
{
	int i;

	for (i = 0; i < EMU_NCLASSES; i++)
		if (counts[i].cls == cls) {
			atomic_fetch_add(&counts[i].live, delta);
			return;
		}
	pthread_mutex_lock(&counts_lock);
	for (i = 0; i < EMU_NCLASSES; i++)
		if (counts[i].cls == cls || counts[i].cls == Nil) {
			counts[i].cls = cls;
			atomic_fetch_add(&counts[i].live, delta);
			break;
		}
	pthread_mutex_unlock(&counts_lock);
}

void
emu_live_objects(char *buf, size_t len)
{
	size_t n = 0;
	int i;

	buf[0] = '\0';
	for (i = 0; i < EMU_NCLASSES && counts[i].cls != Nil; i++) {
		long live = atomic_load(&counts[i].live);
		if (live != 0 && n < len)
			n += (size_t)snprintf(buf + n, len - n, "%s%s %ld",
			    n ? ", " : "", class_getName(counts[i].cls), live);
	}
}

void
emu_log(const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "metal emulator: %s\n", line);
}

__attribute__((destructor))
static void
emu_report_at_exit(void)
{
	char live[1024];

	emu_live_objects(live, sizeof(live));
	emu_log("live objects at exit: %s", live[0] ? live : "none");
}

/* ---- NSObject ---- */

@implementation NSObject

+ (instancetype)allocPlain
{
	size_t n = class_getInstanceSize(self);
	struct objhdr *h = calloc(1, sizeof(*h) + n);
	id obj;

	if (h == NULL)
		return nil;
	atomic_init(&h->refs, 1);
	obj = (id)(h + 1);
	object_setClass(obj, self);
	emu_count(self, 1);
	return obj;
}

+ (instancetype)alloc
{
	return [self allocPlain];
}

- (instancetype)init
{
	return self;
}

- (instancetype)retain
{
	atomic_fetch_add(&((struct objhdr *)self - 1)->refs, 1);
	return self;
}

- (oneway void)release
{
	long was = atomic_fetch_sub(&((struct objhdr *)self - 1)->refs, 1);

	if (was == 1)
		[self dealloc];
	else if (was <= 0) {
		/* What Apple's runtime reports as a crash in objc_release. */
		emu_log("over-release of a %s: release sent to an object "
		    "already deallocated", class_getName(emu_class(self)));
		abort();
	}
}

- (id)autorelease
{
	return emu_autorelease(self);
}

- (void)dealloc
{
	emu_count(emu_class(self), -1);
	free((struct objhdr *)self - 1);
}

@end

/* ---- autorelease pools ---- */

@interface NSAutoreleasePool : NSObject {
	NSAutoreleasePool *outer;
	id *objs;
	size_t n, cap;
}
- (void)add:(id)obj;
- (void)drain;
@end

static __thread NSAutoreleasePool *pool_top;

id
emu_autorelease(id obj)
{
	if (obj == nil)
		return nil;
	if (pool_top == nil) {
		/* Apple's runtime says the same and leaks the object. */
		emu_log("object %p of class %s autoreleased with no pool in "
		    "place - just leaking", (void *)obj,
		    class_getName(emu_class(obj)));
		return obj;
	}
	[pool_top add:obj];
	return obj;
}

@implementation NSAutoreleasePool

- (instancetype)init
{
	outer = pool_top;
	pool_top = self;
	return self;
}

- (void)add:(id)obj
{
	id *more;

	if (n == cap) {
		cap = cap ? cap * 2 : 16;
		if ((more = realloc(objs, cap * sizeof(*objs))) == NULL)
			abort();
		objs = more;
	}
	objs[n++] = obj;
}

- (void)drain
{
	size_t i;

	/* Pools drain innermost first. */
	if (pool_top != self)
		emu_log("autorelease pool drained out of order");
	for (i = 0; i < n; i++)
		[objs[i] release];
	free(objs);
	pool_top = outer;
	[self release];
}

@end

/* ---- NSString, NSError, NSArray: class clusters over private classes,
 * since the stub interfaces declare no instance variables ---- */

@interface EmuString : NSString {
@public
	char *utf8;
}
@end

@implementation EmuString
- (const char *)UTF8String
{
	return utf8;
}
- (void)dealloc
{
	free(utf8);
	[super dealloc];
}
@end

static int
valid_utf8(const uint8_t *s, size_t n)
{
	size_t i = 0, k, need;
	uint32_t c;

	while (i < n) {
		c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		need = c >= 0xf0 && c < 0xf5 ? 3 : c >= 0xe0 ? 2 :
		    c >= 0xc2 && c < 0xe0 ? 1 : 0;
		if (need == 0 || c >= 0xf5 || i + need >= n + (need ? 0 : 1) ||
		    n - i <= need)
			return 0;
		c &= 0x3f >> need;
		for (k = 1; k <= need; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return 0;
			c = c << 6 | (s[i + k] & 0x3f);
		}
		/* overlong forms, surrogates, past U+10FFFF */
		if ((need == 2 && c < 0x800) || (need == 3 && c < 0x10000) ||
		    (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
			return 0;
		i += need + 1;
	}
	return 1;
}

@implementation NSString

+ (instancetype)alloc
{
	if (self == objc_getClass("NSString"))
		return (id)[EmuString allocPlain];
	return [self allocPlain];
}

- (nullable instancetype)initWithBytes:(const void *)bytes
    length:(NSUInteger)len encoding:(NSStringEncoding)encoding
{
	EmuString *s = (EmuString *)self;

	/* NSString returns nil, releasing the receiver, for bytes that are
	 * not in the encoding. */
	if (encoding != NSUTF8StringEncoding || !valid_utf8(bytes, len) ||
	    memchr(bytes, '\0', len) != NULL ||
	    (s->utf8 = malloc(len + 1)) == NULL) {
		[self release];
		return nil;
	}
	memcpy(s->utf8, bytes, len);
	s->utf8[len] = '\0';
	return self;
}

- (const char *)UTF8String
{
	return "";
}

@end

/* A new string, owned by the caller. */
static EmuString *
emu_vstring(const char *fmt, va_list ap)
{
	EmuString *s = (EmuString *)[EmuString allocPlain];

	if (vasprintf(&s->utf8, fmt, ap) == -1)
		abort();
	return s;
}

NSString *
emu_string(const char *fmt, ...)
{
	EmuString *s;
	va_list ap;

	va_start(ap, fmt);
	s = emu_vstring(fmt, ap);
	va_end(ap);
	return [s autorelease];
}

/*
 * NSDictionary: the one a failed command buffer's error has for userInfo
 * (MTLCommandBufferEncoderInfoErrorKey, queue.m). Keys are found by
 * identity, where Apple's compares them with isEqual: the only keys here
 * are constants, which the caller passes as themselves.
 */
@interface EmuDictionary : NSDictionary {
@public
	id key, value;	/* value retained; key a constant, or nil: empty */
}
@end

@implementation EmuDictionary
- (nullable id)objectForKey:(id)k
{
	return k != nil && k == key ? value : nil;
}
- (void)dealloc
{
	[value release];
	[super dealloc];
}
@end

@implementation NSDictionary
- (nullable id)objectForKey:(id)k
{
	(void)k;
	return nil;
}
@end

NSDictionary *
emu_dictionary(id key, id value)
{
	EmuDictionary *d = (EmuDictionary *)[EmuDictionary allocPlain];

	d->key = key;
	d->value = [value retain];
	return d;
}

@interface EmuError : NSError {
@public
	long code;
	NSString *desc;
	NSDictionary *info;	/* retained */
}
@end

@implementation EmuError
- (NSString *)localizedDescription
{
	return desc;
}
- (NSInteger)code
{
	return code;
}
/* Never nil, as Apple's: empty when the error carries nothing more. */
- (NSDictionary *)userInfo
{
	if (info == nil)
		info = emu_dictionary(nil, nil);
	return info;
}
- (void)dealloc
{
	[desc release];
	[info release];
	[super dealloc];
}
@end

@implementation NSError
- (NSString *)localizedDescription
{
	return emu_string("%s", "");
}
- (NSInteger)code
{
	return 0;
}
- (NSDictionary *)userInfo
{
	return emu_autorelease(emu_dictionary(nil, nil));
}
@end

static NSError *
emu_verror(long code, NSDictionary *info, const char *fmt, va_list ap)
{
	EmuError *e = (EmuError *)[EmuError allocPlain];

	e->desc = emu_vstring(fmt, ap);
	e->code = code;
	e->info = [info retain];
	return [e autorelease];
}

NSError *
emu_error_info(long code, NSDictionary *info, const char *fmt, ...)
{
	NSError *e;
	va_list ap;

	va_start(ap, fmt);
	e = emu_verror(code, info, fmt, ap);
	va_end(ap);
	return e;
}

NSError *
emu_error(long code, const char *fmt, ...)
{
	NSError *e;
	va_list ap;

	va_start(ap, fmt);
	e = emu_verror(code, nil, fmt, ap);
	va_end(ap);
	return e;
}

/*
 * NSProcessInfo: only the macOS version. METAL_EMU_MACOS=MAJOR.MINOR[.PATCH]
 * is the one it reports (26.0 if unset or not a version), which also
 * decides the newest Metal language version the emulated compiler
 * accepts (device.m), as on a Mac of that version.
 */
void
emu_macos(int v[3])
{
	const char *e = getenv("METAL_EMU_MACOS");

	v[0] = 26;
	v[1] = v[2] = 0;
	if (e != NULL && sscanf(e, "%d.%d.%d", &v[0], &v[1], &v[2]) < 2) {
		v[0] = 26;
		v[1] = v[2] = 0;
	}
}

static NSProcessInfo *emu_processinfo;

/* The process's one NSProcessInfo, which lives as long as the process:
 * left out of the live-object counts, which must end at none. */
static void
emu_processinfo_make(void)
{
	emu_processinfo = (NSProcessInfo *)[NSProcessInfo allocPlain];
	emu_count(emu_class(emu_processinfo), -1);
}

@implementation NSProcessInfo
+ (NSProcessInfo *)processInfo
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, emu_processinfo_make);
	return emu_processinfo;
}
- (NSOperatingSystemVersion)operatingSystemVersion
{
	NSOperatingSystemVersion r;
	int v[3];

	emu_macos(v);
	r.majorVersion = v[0];
	r.minorVersion = v[1];
	r.patchVersion = v[2];
	return r;
}
@end

@interface EmuArray : NSArray {
@public
	id *items;
	NSUInteger n;
}
@end

@implementation EmuArray
- (NSUInteger)count
{
	return n;
}
- (id)objectAtIndex:(NSUInteger)i
{
	if (i >= n) {
		/* NSRangeException on Apple platforms. */
		emu_log("-[NSArray objectAtIndex:]: index %lu beyond bounds "
		    "[0 .. %lu]", (unsigned long)i, (unsigned long)n - 1);
		abort();
	}
	return items[i];
}
- (void)dealloc
{
	NSUInteger i;

	for (i = 0; i < n; i++)
		[items[i] release];
	free(items);
	[super dealloc];
}
@end

@implementation NSArray
- (NSUInteger)count
{
	return 0;
}
- (id)objectAtIndex:(NSUInteger)i
{
	(void)i;
	abort();
}
@end

/* A retained array holding one retained reference to each object. */
NSArray *emu_array(id *objs, NSUInteger n);
NSArray *
emu_array(id *objs, NSUInteger n)
{
	EmuArray *a = (EmuArray *)[EmuArray allocPlain];
	NSUInteger i;

	if ((a->items = calloc(n ? n : 1, sizeof(id))) == NULL)
		abort();
	for (i = 0; i < n; i++)
		a->items[i] = [objs[i] retain];
	a->n = n;
	return a;
}

/* ---- dispatch_data ---- */

@interface EmuDispatchData : NSObject <OS_dispatch_data> {
@public
	void *bytes;
	size_t size;
}
@end

@implementation EmuDispatchData
- (void)dealloc
{
	free(bytes);
	[super dealloc];
}
@end

/* The bytes of data, which dispatch_data_create made. */
void
emu_dispatch_bytes(dispatch_data_t data, const uint8_t **p, size_t *n)
{
	EmuDispatchData *d = (EmuDispatchData *)data;

	*p = d->bytes;
	*n = d->size;
}

dispatch_data_t
dispatch_data_create(const void *buffer, size_t size, dispatch_queue_t queue,
    dispatch_block_t destructor)
{
	EmuDispatchData *d;

	/* Only DISPATCH_DATA_DESTRUCTOR_DEFAULT (copy the bytes) is
	 * emulated: that is the one runner.m uses. */
	if (queue != nil || destructor != NULL) {
		emu_log("dispatch_data_create: only the default destructor is "
		    "emulated");
		abort();
	}
	d = (EmuDispatchData *)[EmuDispatchData allocPlain];
	if ((d->bytes = malloc(size ? size : 1)) == NULL)
		abort();	/* libdispatch, too, treats this as fatal */
	memcpy(d->bytes, buffer, size);
	d->size = size;
	return (dispatch_data_t)d;
}

void
dispatch_release(dispatch_object_t object)
{
	[object release];
}
