/*
 * tests/metal_stub/objc/objc.h: the Objective-C base types daemon/runner.m
 * uses, for type-checking it on Linux (see tests/metal_stub/README.md).
 * Not Apple's header: each declaration is written from Apple's documented
 * signature, cited beside it. Nothing here is ever linked or run.
 */
#ifndef METAL_STUB_OBJC_H
#define METAL_STUB_OBJC_H

#include <stdbool.h>

/* id, Class, SEL: the runtime's object, class and selector types.
 * https://developer.apple.com/documentation/objectivec/id
 * https://developer.apple.com/documentation/objectivec/class
 * https://developer.apple.com/documentation/objectivec/sel */
typedef struct objc_class *Class;
typedef struct objc_object {
	Class isa;
} *id;
typedef struct objc_selector *SEL;

/* BOOL is bool on arm64 (Apple silicon) and signed char on x86_64, as in
 * <objc/objc.h> (OBJC_BOOL_IS_BOOL).
 * https://developer.apple.com/documentation/objectivec/bool */
#if defined(__arm64__) || defined(__aarch64__)
typedef bool BOOL;
#else
typedef signed char BOOL;
#endif
#define YES ((BOOL)1)
#define NO ((BOOL)0)

/* https://developer.apple.com/documentation/objectivec/nil */
#define nil ((id)0)

/* 64-bit Apple platforms: NSInteger is long, NSUInteger unsigned long.
 * https://developer.apple.com/documentation/objectivec/nsinteger
 * https://developer.apple.com/documentation/objectivec/nsuinteger */
typedef long NSInteger;
typedef unsigned long NSUInteger;

/* Memory-management annotations as <objc/NSObject.h> and
 * <Foundation/NSObjCRuntime.h> spell them. Under ARC the manual
 * retain/release methods are unavailable, exactly as on a Mac. */
#if __has_feature(objc_arc)
#define OBJC_ARC_UNAVAILABLE \
	__attribute__((unavailable("not available in automatic reference counting mode")))
#else
#define OBJC_ARC_UNAVAILABLE
#endif
#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))

#endif
