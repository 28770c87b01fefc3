/*
 * tests/metal_stub/Foundation/Foundation.h: the Foundation declarations
 * daemon/runner.m uses, for type-checking it on Linux. Not Apple's header:
 * each declaration is written from Apple's documented signature, cited
 * beside it. See tests/metal_stub/README.md.
 */
#ifndef METAL_STUB_FOUNDATION_H
#define METAL_STUB_FOUNDATION_H

#include <stdint.h>
#include <objc/objc.h>
#include <objc/NSObject.h>
#include <dispatch/dispatch.h>

/* Enum and nullability macros as <Foundation/NSObjCRuntime.h> and
 * <CoreFoundation/CFAvailability.h> define them: an enum with a fixed
 * underlying type. */
#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")

/* Availability annotations. The stubs record the versions Apple documents
 * but the Linux type check cannot enforce them (see README.md), so they
 * expand to nothing. */
#define API_AVAILABLE(...)
#define API_DEPRECATED(...)

/* <Availability.h>, which Foundation.h brings in, defines __MAC_15_0 in the
 * macOS 15 SDK and later, and not before: runner.m tests it to use what
 * only those SDKs declare (mathMode). These stubs are of that era (as the
 * pinned metal-cpp, 367.4.2, is), so they define it, unless a real
 * <Availability.h> (the macOS cross build's) came first. */
#ifndef __MAC_15_0
#define __MAC_15_0 150000
#endif

/* typedef double CFTimeInterval; (CoreFoundation, which Foundation imports)
 * https://developer.apple.com/documentation/corefoundation/cftimeinterval */
typedef double CFTimeInterval;

NS_ASSUME_NONNULL_BEGIN

/* typedef NSUInteger NSStringEncoding; NSUTF8StringEncoding = 4
 * https://developer.apple.com/documentation/foundation/nsstringencoding
 * https://developer.apple.com/documentation/foundation/nsutf8stringencoding */
typedef NSUInteger NSStringEncoding;
enum {
	NSUTF8StringEncoding = 4
};

/* typedef struct _NSRange { NSUInteger location; NSUInteger length; } NSRange;
 * NSMakeRange is NS_INLINE (static inline) in NSRange.h.
 * https://developer.apple.com/documentation/foundation/nsrange
 * https://developer.apple.com/documentation/foundation/nsmakerange(_:_:) */
typedef struct _NSRange {
	NSUInteger location;
	NSUInteger length;
} NSRange;
static inline NSRange
NSMakeRange(NSUInteger loc, NSUInteger len)
{
	NSRange r = { loc, len };
	return r;
}

/* typedef struct { NSInteger majorVersion; NSInteger minorVersion;
 * NSInteger patchVersion; } NSOperatingSystemVersion;
 * https://developer.apple.com/documentation/foundation/operatingsystemversion */
typedef struct {
	NSInteger majorVersion;
	NSInteger minorVersion;
	NSInteger patchVersion;
} NSOperatingSystemVersion;

@interface NSProcessInfo : NSObject
/* @property(class, readonly, strong) NSProcessInfo *processInfo;
 * https://developer.apple.com/documentation/foundation/processinfo/processinfo */
+ (NSProcessInfo *)processInfo;
/* @property(readonly) NSOperatingSystemVersion operatingSystemVersion;  (macOS 10.10)
 * https://developer.apple.com/documentation/foundation/processinfo/operatingsystemversion */
@property (readonly) NSOperatingSystemVersion operatingSystemVersion;
@end

@interface NSString : NSObject
/* - (nullable instancetype)initWithBytes:(const void *)bytes
 *     length:(NSUInteger)len encoding:(NSStringEncoding)encoding;
 * "The return byte strings are allowed to be unterminated."
 * https://developer.apple.com/documentation/foundation/nsstring/init(bytes:length:encoding:) */
- (nullable instancetype)initWithBytes:(const void *)bytes
    length:(NSUInteger)len encoding:(NSStringEncoding)encoding;
/* @property(nullable, readonly) const char *UTF8String;
 * https://developer.apple.com/documentation/foundation/nsstring/utf8string */
@property (nullable, readonly) const char *UTF8String NS_RETURNS_INNER_POINTER;
@end

/* typedef NSString *NSErrorUserInfoKey;  (macOS 10.0; NS_TYPED_EXTENSIBLE_ENUM)
 * https://developer.apple.com/documentation/foundation/nserroruserinfokey */
typedef NSString *NSErrorUserInfoKey;

@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject
/* - (nullable ObjectType)objectForKey:(KeyType)aKey;
 * https://developer.apple.com/documentation/foundation/nsdictionary/object(forkey:) */
- (nullable ObjectType)objectForKey:(KeyType)aKey;
@end

@interface NSError : NSObject
/* @property(readonly, copy) NSDictionary<NSErrorUserInfoKey, id> *userInfo;
 * https://developer.apple.com/documentation/foundation/nserror/userinfo */
@property (readonly, copy) NSDictionary<NSErrorUserInfoKey, id> *userInfo;
/* @property(readonly, copy) NSString *localizedDescription;
 * https://developer.apple.com/documentation/foundation/nserror/localizeddescription */
@property (readonly, copy) NSString *localizedDescription;
/* @property(readonly) NSInteger code;
 * https://developer.apple.com/documentation/foundation/nserror/code */
@property (readonly) NSInteger code;
@end

@interface NSArray<__covariant ObjectType> : NSObject
/* @property(readonly) NSUInteger count;
 * https://developer.apple.com/documentation/foundation/nsarray/count */
@property (readonly) NSUInteger count;
/* - (ObjectType)objectAtIndex:(NSUInteger)index;
 * https://developer.apple.com/documentation/foundation/nsarray/object(at:) */
- (ObjectType)objectAtIndex:(NSUInteger)index;
@end

NS_ASSUME_NONNULL_END

#endif
