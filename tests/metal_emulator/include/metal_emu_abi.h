/*
 * metal_emu_abi.h: what a kernel compiled by the Metal emulator shares with
 * the emulator that runs it. TEST HARNESS ONLY: see ../README.md.
 *
 * The emulator compiles Metal Shading Language as C++ (clang++, against
 * <metal_stdlib> in this folder) into a shared object, and appends to the
 * source one descriptor per kernel function (metal_emu_kernel_NAME) that the
 * templates below fill in: the kernel's parameters, and a thunk that calls
 * the kernel for one thread from an argument table and the thread's ids.
 *
 * Threadgroup-wide work (threadgroup_barrier, simdgroup functions) goes
 * through metal_emu_rt, a table the emulator sets after dlopen: every thread
 * of a threadgroup that uses them runs as a fiber of its own (exec.c).
 */
#ifndef METAL_EMU_ABI_H
#define METAL_EMU_ABI_H

#include <stddef.h>
#include <stdint.h>

#define METAL_EMU_SIMD_WIDTH 32	/* threadExecutionWidth of Apple GPUs */
#define METAL_EMU_MAX_PARAMS 64

#ifdef __cplusplus
extern "C" {
#endif

/* Calls from kernel code into the emulator. */
struct metal_emu_rt {
	/* threadgroup_barrier(): returns when every thread of the calling
	 * thread's threadgroup has called it. */
	void (*barrier)(void);
	/* A simdgroup collective: each of the METAL_EMU_SIMD_WIDTH lanes of
	 * the caller's simdgroup passes n bytes; on return all[lane * n ...]
	 * holds lane's bytes, for every lane. Every lane must call it, as
	 * Metal requires of simdgroup functions. Lanes past the end of a
	 * partial simdgroup read as zero. */
	void (*simd_exchange)(const void *mine, void *all, size_t n);
	/* thread_index_in_simdgroup of the calling thread. */
	unsigned (*simd_lane)(void);
};

/* Built-in inputs a kernel parameter can ask for ([[attribute]]). */
enum metal_emu_builtin {
	METAL_EMU_ARG = 0,			/* a bound buffer or setBytes */
	METAL_EMU_THREADGROUP_POSITION_IN_GRID,	/* gid in tinygrad */
	METAL_EMU_THREAD_POSITION_IN_THREADGROUP,	/* lid in tinygrad */
	METAL_EMU_THREAD_POSITION_IN_GRID,
	METAL_EMU_THREADS_PER_THREADGROUP,
	METAL_EMU_THREADGROUPS_PER_GRID,
	METAL_EMU_THREADS_PER_GRID,
	METAL_EMU_THREAD_INDEX_IN_THREADGROUP,	/* scalar */
	METAL_EMU_THREAD_INDEX_IN_SIMDGROUP,	/* scalar */
	METAL_EMU_SIMDGROUP_INDEX_IN_THREADGROUP,	/* scalar */
	METAL_EMU_NBUILTINS
};

/* One thread's built-in values, each as x, y, z (scalars use x). */
struct metal_emu_ids {
	uint32_t v[METAL_EMU_NBUILTINS][3];
};

enum metal_emu_param_kind {
	METAL_EMU_PARAM_POINTER = 1,	/* device T *: setBuffer */
	METAL_EMU_PARAM_REFERENCE,	/* constant T &: setBytes or setBuffer */
	METAL_EMU_PARAM_BUILTIN,
	/* threadgroup T * [[threadgroup(n)]]: setThreadgroupMemoryLength,
	 * which the emulator does not implement (reflection only) */
	METAL_EMU_PARAM_THREADGROUP
};

struct metal_emu_param {
	int kind;		/* metal_emu_param_kind */
	int builtin;		/* metal_emu_builtin, for BUILTIN */
	int index;		/* argument table index ([[buffer(n)]]), the
				 * threadgroup table's for THREADGROUP, else -1 */
	size_t size;		/* sizeof the pointee / referee; 0 for void */
	size_t align;		/* its alignof (reflection's bufferAlignment) */
	int used;		/* the kernel's body names it: reflection's
				 * MTLBinding used, MTLArgument active */
};

struct metal_emu_kernel {
	const char *name;
	unsigned nparams;
	const struct metal_emu_param *params;
	/* Run the kernel for one thread: args[i] is the address bound at
	 * argument table index i (buffer contents + offset, or setBytes
	 * data). */
	void (*thunk)(void *const *args, const struct metal_emu_ids *ids);
};

#ifdef __cplusplus
}

#include <type_traits>
#include <utility>

namespace metal_emu {

template <typename P>
constexpr int param_kind()
{
	return std::is_pointer<P>::value ? METAL_EMU_PARAM_POINTER :
	    std::is_reference<P>::value ? METAL_EMU_PARAM_REFERENCE :
	    METAL_EMU_PARAM_BUILTIN;
}

/* What a pointer or reference parameter points to (void: a char, so
 * that its size reads 0 below and its alignment 1). */
template <typename P>
using pointee = typename std::remove_cv<typename std::remove_pointer<
    typename std::remove_reference<P>::type>::type>::type;
template <typename T>
using sized = typename std::conditional<std::is_void<T>::value, char,
    T>::type;

template <typename P>
constexpr size_t param_size()
{
	return std::is_void<pointee<P>>::value ? 0 : sizeof(sized<pointee<P>>);
}

template <typename P>
constexpr size_t param_align()
{
	return alignof(sized<pointee<P>>);
}

/* A built-in value converted to the parameter's type: uint3, ushort2,
 * uint, ... (vector types are clang ext_vector_types). */

template <typename P>
static inline P builtin_value(const uint32_t *v)
{
	typedef typename std::remove_cv<P>::type T;
	if constexpr (std::is_arithmetic<T>::value) {
		return (T)v[0];
	} else {
		T out = {};
		constexpr int n = sizeof(T) / sizeof(out[0]);
		for (int i = 0; i < n && i < 3; i++)
			out[i] = v[i];
		return out;
	}
}

template <typename P>
static inline P fetch(const struct metal_emu_param &p, void *const *args,
    const struct metal_emu_ids *ids)
{
	if constexpr (std::is_pointer<P>::value)
		/* queue.m dispatches no kernel with threadgroup memory */
		return p.kind == METAL_EMU_PARAM_THREADGROUP ? nullptr :
		    (P)args[p.index];
	else if constexpr (std::is_reference<P>::value)
		return *(typename std::remove_reference<P>::type *)args[p.index];
	else
		return builtin_value<P>(ids->v[p.builtin]);
}

template <typename F> struct kernel_traits;

template <typename... P>
struct kernel_traits<void(P...)> {
	static constexpr unsigned nparams = sizeof...(P);

	template <void (*K)(P...), const struct metal_emu_param *PS,
	    size_t... I>
	static void call(void *const *args, const struct metal_emu_ids *ids,
	    std::index_sequence<I...>)
	{
		K(fetch<P>(PS[I], args, ids)...);
	}

	template <void (*K)(P...), const struct metal_emu_param *PS>
	static void thunk(void *const *args, const struct metal_emu_ids *ids)
	{
		call<K, PS>(args, ids, std::index_sequence_for<P...>{});
	}

	/* Fill kind, size and alignment from the types; builtin and index come from the
	 * emulator's reading of the attributes, as does THREADGROUP (a pointer by its
	 * type), which is kept. */
	static void describe(struct metal_emu_param *ps)
	{
		const int kinds[] = { param_kind<P>()..., 0 };
		const size_t sizes[] = { param_size<P>()..., 0 };
		const size_t aligns[] = { param_align<P>()..., 0 };
		for (unsigned i = 0; i < nparams; i++) {
			if (ps[i].kind != METAL_EMU_PARAM_THREADGROUP)
				ps[i].kind = kinds[i];
			ps[i].size = sizes[i];
			ps[i].align = aligns[i];
		}
	}
};

} /* namespace metal_emu */

/*
 * The descriptor the emulator appends for each kernel NAME it finds, with
 * the builtin/index of each parameter read from the source:
 *   METAL_EMU_KERNEL(NAME, {kind, builtin, index, 0}, ...)
 * (kind 0, from the type, but for a [[threadgroup(n)]] parameter)
 */
#define METAL_EMU_KERNEL(NAME, ...)					\
	static struct metal_emu_param metal_emu_params_##NAME[] = { __VA_ARGS__ }; \
	static const bool metal_emu_described_##NAME =			\
	    (metal_emu::kernel_traits<decltype(NAME)>::describe(	\
	    metal_emu_params_##NAME), true);				\
	extern "C" const struct metal_emu_kernel metal_emu_kernel_##NAME = { \
		#NAME,							\
		metal_emu::kernel_traits<decltype(NAME)>::nparams,	\
		metal_emu_params_##NAME,				\
		metal_emu::kernel_traits<decltype(NAME)>::template	\
		    thunk<NAME, metal_emu_params_##NAME>,		\
	};

/* Set by the emulator right after dlopen. */
extern "C" {
__attribute__((visibility("default")))
const struct metal_emu_rt *metal_emu_rt = nullptr;
}

#endif /* __cplusplus */

#endif
