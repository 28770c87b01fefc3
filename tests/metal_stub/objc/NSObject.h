/*
 * tests/metal_stub/objc/NSObject.h: the NSObject protocol and root class,
 * only the methods daemon/runner.m sends. See tests/metal_stub/README.md.
 */
#ifndef METAL_STUB_NSOBJECT_H
#define METAL_STUB_NSOBJECT_H

#include <objc/objc.h>

@protocol NSObject
/* - (instancetype)retain;
 * https://developer.apple.com/documentation/objectivec/nsobject-c.protocol/retain */
- (instancetype)retain OBJC_ARC_UNAVAILABLE;
/* - (oneway void)release;
 * https://developer.apple.com/documentation/objectivec/nsobject-c.protocol/release */
- (oneway void)release OBJC_ARC_UNAVAILABLE;
@end

/* Class isa: the first instance variable, as <objc/NSObject.h> declares it;
 * subclasses' instance variables are laid out after it. */
__attribute__((objc_root_class))
@interface NSObject <NSObject> {
	Class isa;
}
/* + (instancetype)alloc;
 * https://developer.apple.com/documentation/objectivec/nsobject-swift.class/alloc */
+ (instancetype)alloc;
/* - (instancetype)init;
 * https://developer.apple.com/documentation/objectivec/nsobject-swift.class/init() */
- (instancetype)init;
@end

#endif
