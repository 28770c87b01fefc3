/*
 * mtl_device.m: the Metal backend's device and this macOS, at the bottom
 * of the backend's files (mtl.h): which device --device names, opening it
 * and what Rhello says of it (name, memory, GPU family, the macOS version,
 * the newest language version a metallib may use), taking it again after
 * the runner's process let go of it; the language version source is
 * compiled at; the error texts every file of the backend writes; the
 * profile clock. runner.m's header describes the backend as a whole.
 */

#include "mtl.h"

#ifdef __APPLE__
#include <mach/mach_time.h>
#endif

/* What each is: mtl.h. */
id <MTLDevice> mtl_dev;
int mtl_managed;
int mtl_os[3];
pthread_mutex_t mtl_lock = PTHREAD_MUTEX_INITIALIZER;
/* The device supports MTLGPUFamilyMetal4 (macOS 26: Apple silicon; no
 * Intel Mac's GPU has it), without which MSL 4.0 is not offered or used
 * (mtl_language, mtl_newest). Read-only after open. */
static int mtl_metal4;
/* The device open was asked for (--device), to take it again. */
static char mtl_devspec[16];
#ifdef __APPLE__
static mach_timebase_info_data_t mtl_timebase;	/* read-only after open */
#endif

/* ---- error texts ---- */

/* Cut a message that vsnprintf truncated back to whole UTF-8 characters. */
void
mtl_trim_utf8(char *s)
{
	size_t i = strlen(s), cont = 0, need;
	unsigned char c;

	while (i > 0 && cont < 3 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) {
		i--;
		cont++;
	}
	if (i == 0)
		return;
	c = (unsigned char)s[i - 1];
	need = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
	if (c >= 0xc0 && cont < need)
		s[i - 1] = '\0';
}

void
mtl_seterr(char *err, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(err, BE_ERR_MAX, fmt, ap);
	va_end(ap);
	if (n >= BE_ERR_MAX)
		mtl_trim_utf8(err);
}

/*
 * An NSError's localizedDescription into err, never swallowed. For compile
 * errors that is the compiler's own multi-line text, which the client wants
 * verbatim (the one exception to backend.h's one-line messages).
 */
void
mtl_nserr(char *err, const char *what, NSError *e)
{
	const char *text = NULL;

	if (e != nil)
		text = [[e localizedDescription] UTF8String];
	mtl_seterr(err, "%s: %s", what,
	    text != NULL ? text : "(Metal gave no description)");
}

/* ---- the macOS and Metal language versions ---- */

/* MTLLanguageVersion's values: (major << 16) + minor (MTLLibrary.h),
 * spelled as numbers, as SDKs lack the names of versions newer than
 * themselves and each name is available only from its macOS. */
#define MTL_LANG(major, minor) ((MTLLanguageVersion)((major) << 16 | (minor)))

/*
 * This Mac's macOS version into mtl_os. macOS 26 tells a program built
 * with an SDK older than its own that it is 16 (as Big Sur said 10.16):
 * that is 26 here, the version Metal's compiler has. Rhello reports it
 * (protocol.md: Metal runners' cpu), so that a client sends a metallib
 * only to a runner whose macOS is at least its own.
 */
static void
mtl_os_read(void)
{
	NSOperatingSystemVersion v;

	/* What macOS this is (macOS 10.10). */
	v = [[NSProcessInfo processInfo] operatingSystemVersion];
	mtl_os[0] = (int)v.majorVersion;
	mtl_os[1] = (int)v.minorVersion;
	mtl_os[2] = (int)v.patchVersion;
	if (mtl_os[0] == 16)
		mtl_os[0] = 26;
	else if (mtl_os[0] == 10 && mtl_os[1] == 16) {
		mtl_os[0] = 11;
		mtl_os[1] = 0;
	}
}

/*
 * The language version source is compiled at: the one tinygrad's
 * MetalCompiler pins for this macOS (ops_metal.py: metal4.0 from 26, 3.1
 * from 14, 3.0 on 13, else 2.0), not the newest the system has, so that a
 * kernel means here what it means to tinygrad on the same Mac. Taken from
 * mtl_os, not @available, so that it is the version Rhello reports (and
 * the Metal emulator's METAL_EMU_MACOS can stand for an older Mac). MSL
 * 4.0 is Metal 4's language: only for a device of the Metal 4 family
 * (mtl_metal4). tinygrad pins 4.0 from the macOS alone, which on an Intel
 * Mac with macOS 26 asks for what its GPU lacks; there the runner takes
 * 3.1, tinygrad's version for macOS 14 and 15. What Apple's compiler
 * answers to 4.0 on such a GPU has not been seen (no Mac here).
 */
MTLLanguageVersion
mtl_language(void)
{
	if (mtl_os[0] >= 26 && mtl_metal4)
		return MTL_LANG(4, 0);
	if (mtl_os[0] >= 14)
		return MTL_LANG(3, 1);
	if (mtl_os[0] == 13)
		return MTL_LANG(3, 0);
	return MTL_LANG(2, 0);
}

/*
 * Rhello.features of a Metal runner: the newest language version this
 * macOS compiles, which a metallib may use ("MAJOR.MINOR"). Apple's
 * MTLLanguageVersion table: 4.0 macOS 26, 3.2 15, 3.1 14, 3.0 13, 2.4 12,
 * 2.3 11, 2.2 10.15; 4.0 only on a device of the Metal 4 family, else
 * 3.2 (macOS 26 on an Intel Mac).
 * https://developer.apple.com/documentation/metal/mtllanguageversion
 */
static void
mtl_newest(char *out, size_t len)
{
	static const struct {
		int macos;
		unsigned major, minor;
	} tab[] = {
		{ 26, 4, 0 }, { 15, 3, 2 }, { 14, 3, 1 }, { 13, 3, 0 },
		{ 12, 2, 4 }, { 11, 2, 3 },
	};
	size_t i;

	for (i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		if (mtl_os[0] >= tab[i].macos && (tab[i].major < 4 ||
		    mtl_metal4)) {
			snprintf(out, len, "%u.%u", tab[i].major, tab[i].minor);
			return;
		}
	snprintf(out, len, "2.2");
}

/* ---- the device ---- */

/* Rhello.arch: the newest Apple GPU family the device supports ("Apple10"
 * ... "Apple1"), else "Mac2". */
static const char *
mtl_family(id <MTLDevice> dev)
{
	static const struct {
		MTLGPUFamily family;
		const char *name;
	} older[] = {
		{ MTLGPUFamilyApple6, "Apple6" },
		{ MTLGPUFamilyApple5, "Apple5" },
		{ MTLGPUFamilyApple4, "Apple4" },
		{ MTLGPUFamilyApple3, "Apple3" },
		{ MTLGPUFamilyApple2, "Apple2" },
		{ MTLGPUFamilyApple1, "Apple1" },
	};
	size_t i;

	/* Newest first: a GPU supports every older Apple family too. The
	 * families newer than supportsFamily: itself (macOS 10.15) are asked
	 * about only on systems whose SDK era knows them. */
	/* MTLGPUFamilyApple10 = 1010 (the macOS 26 SDK's MTLDevice.h; M5),
	 * spelled as its value: SDKs before 26, and the pinned metal-cpp,
	 * lack its name.
	 * https://developer.apple.com/documentation/metal/mtlgpufamily/apple10 */
	if (@available(macOS 26.0, *)) {
		if ([dev supportsFamily:(MTLGPUFamily)1010])
			return "Apple10";
	}
	if (@available(macOS 14.0, *)) {
		if ([dev supportsFamily:MTLGPUFamilyApple9])
			return "Apple9";
	}
	if (@available(macOS 13.0, *)) {
		if ([dev supportsFamily:MTLGPUFamilyApple8])
			return "Apple8";
	}
	if (@available(macOS 11.0, *)) {
		if ([dev supportsFamily:MTLGPUFamilyApple7])
			return "Apple7";
	}
	for (i = 0; i < sizeof(older) / sizeof(older[0]); i++)
		if ([dev supportsFamily:older[i].family])
			return older[i].name;
	return "Mac2";
}

/*
 * Without a system default device: of the devices Metal lists, the first
 * that is not low-power, else the first. A dual-GPU Intel Mac lists its
 * integrated GPU (low-power) before the discrete one, which the system
 * would have chosen. Retained for the caller, or nil.
 */
static id <MTLDevice>
mtl_pick(NSArray<id <MTLDevice>> *all)
{
	NSUInteger i, n = [all count];

	for (i = 0; i < n; i++)
		if (![all objectAtIndex:i].lowPower)
			return [[all objectAtIndex:i] retain];
	return n > 0 ? [[all objectAtIndex:0] retain] : nil;
}

/* The device named by device (NULL or "": the system's default, else a
 * number), retained for the caller, or nil with err set. */
static id <MTLDevice>
mtl_device(const char *device, char *err)
{
	NSArray<id <MTLDevice>> *all = nil;
	id <MTLDevice> dev = nil;
	unsigned long idx = 0;
	const char *p;

	if (device == NULL || *device == '\0') {
		/* Take the system's default GPU. */
		dev = MTLCreateSystemDefaultDevice();
		if (dev == nil) {
			/* A command-line tool gets no default device unless it
			 * links CoreGraphics: choose among those listed. */
			all = MTLCopyAllDevices();
			dev = mtl_pick(all);
		}
		if (dev == nil)
			mtl_seterr(err, "no Metal device found");
	} else {
		/* A decimal index into the devices Metal lists. */
		for (p = device; *p != '\0'; p++) {
			if (*p < '0' || *p > '9' || p - device >= 9) {
				mtl_seterr(err, "Metal device \"%s\" is not a "
				    "device number (0, 1, ...)", device);
				return nil;
			}
			idx = idx * 10 + (unsigned long)(*p - '0');
		}
		all = MTLCopyAllDevices();
		if (idx >= [all count])
			mtl_seterr(err, "Metal device %lu does not exist: this "
			    "Mac has %lu, numbered from 0", idx,
			    (unsigned long)[all count]);
		else
			dev = [[all objectAtIndex:idx] retain];
	}
	[all release];
	return dev;
}

/*
 * The device, taken again if open released it (the runner's own process,
 * thread isolation: its first session). The runner's process releases it
 * after open because with process isolation, the default, it never uses
 * it: each session's spawned process opens its own. Kept, the device
 * object keeps the GPU in use by the runner for as long as it serves, and
 * on a dual-GPU Intel MacBook that keeps the discrete GPU powered (the
 * system powers it while a process holds it: Apple, "GPU selection in
 * macOS"). With thread isolation the first session takes it again and it
 * is kept from then on, with the pipeline cache that belongs to it. The
 * same choice (--device) is made as at open, as a spawned session makes
 * it; a Mac whose GPUs changed in between may give another (the session
 * then uses that one).
 */
int
mtl_dev_get(char *err)
{
	int r = 0;

	pthread_mutex_lock(&mtl_lock);
	if (mtl_dev == nil && (mtl_dev = mtl_device(mtl_devspec, err)) == nil)
		r = -1;
	pthread_mutex_unlock(&mtl_lock);
	return r;
}

/*
 * Open the device named by device (mtl_device) into mtl_dev, and what
 * Rhello says of it and of this macOS into info; 0, or -1 with err set and
 * no device held. runner.m's mtl_open adds whether source compiles here.
 */
int
mtl_dev_open(struct be_info *info, const char *device, char *err)
{
	const char *name;

	if (device != NULL && strlen(device) >= sizeof(mtl_devspec)) {
		mtl_seterr(err, "Metal device \"%s\" is not a device number "
		    "(0, 1, ...)", device);
		goto fail;
	}
	snprintf(mtl_devspec, sizeof(mtl_devspec), "%s",
	    device != NULL ? device : "");
	if ((mtl_dev = mtl_device(device, err)) == nil)
		goto fail;

#ifdef __APPLE__
	/* Ticks to ns, for the profile clock (mtl_now_ns). */
	if (mach_timebase_info(&mtl_timebase) != 0 || mtl_timebase.denom == 0) {
		mtl_seterr(err, "mach_timebase_info failed");
		goto fail;
	}
#endif
	memset(info, 0, sizeof(*info));
	info->backend = PROTO_BACKEND_METAL;
	info->caps = PROTO_CAP_METALLIB | PROTO_CAP_METAL_SOURCE;
	/* Without unified memory buffers are Managed (mtl_alloc_body). */
	mtl_managed = ![mtl_dev hasUnifiedMemory];
	if (!mtl_managed)
		info->caps |= PROTO_CAP_UNIFIED;
	info->ncores = 1;
	info->memory = [mtl_dev recommendedMaxWorkingSetSize];
	info->maxbuf = [mtl_dev maxBufferLength];
	name = [[mtl_dev name] UTF8String];
	snprintf(info->name, sizeof(info->name), "%s",
	    name != NULL ? name : "Metal device");
	snprintf(info->arch, sizeof(info->arch), "%s", mtl_family(mtl_dev));
	/* Rhello: the macOS and the newest language version it compiles. */
	mtl_os_read();
	/* Whether the device has Metal 4 (MSL 4.0): MTLGPUFamilyMetal4 =
	 * 5002 (the macOS 26 SDK's MTLDevice.h), spelled as its value, as
	 * SDKs before 26 and the pinned metal-cpp lack its name.
	 * https://developer.apple.com/documentation/metal/mtlgpufamily/metal4 */
	mtl_metal4 = 0;
	if (@available(macOS 26.0, *)) {
		if (mtl_os[0] >= 26 &&
		    [mtl_dev supportsFamily:(MTLGPUFamily)5002])
			mtl_metal4 = 1;
	}
	snprintf(info->cpu, sizeof(info->cpu), "%d.%d.%d", mtl_os[0],
	    mtl_os[1], mtl_os[2]);
	mtl_newest(info->features, sizeof(info->features));
	return 0;

fail:
	[mtl_dev release];
	mtl_dev = nil;
	return -1;
}

/* ---- the clock ---- */

/*
 * The clock of GPUStartTime and GPUEndTime, in ns: host time, the
 * mach_absolute_time base (CACurrentMediaTime is it in seconds). Ticks
 * times numer / denom cannot overflow for centuries of uptime (numer 125
 * at 24 MHz on Apple silicon). The emulator build (tests/metal_emulator,
 * Linux) has no mach time: it stamps command buffers with CLOCK_MONOTONIC.
 */
uint64_t
mtl_now_ns(void)
{
#ifdef __APPLE__
	return mach_absolute_time() * mtl_timebase.numer / mtl_timebase.denom;
#else
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}
