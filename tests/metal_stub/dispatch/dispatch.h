/*
 * tests/metal_stub/dispatch/dispatch.h: the libdispatch declarations
 * daemon/runner.m uses, in their Objective-C form (OS_OBJECT_USE_OBJC:
 * dispatch objects are NSObjects, as when building Objective-C on macOS).
 * See tests/metal_stub/README.md.
 */
#ifndef METAL_STUB_DISPATCH_H
#define METAL_STUB_DISPATCH_H

#include <stddef.h>
#include <objc/NSObject.h>

#pragma clang assume_nonnull begin

/* dispatch_object_t and its subclasses, as OS_OBJECT_DECL_CLASS and
 * OS_OBJECT_DECL_SUBCLASS expand them in Objective-C.
 * https://developer.apple.com/documentation/dispatch/dispatch_object_t */
@protocol OS_dispatch_object <NSObject>
@end
typedef NSObject<OS_dispatch_object> *dispatch_object_t;

/* https://developer.apple.com/documentation/dispatch/dispatch_queue_t */
@protocol OS_dispatch_queue <OS_dispatch_object>
@end
typedef NSObject<OS_dispatch_queue> *dispatch_queue_t;

/* https://developer.apple.com/documentation/dispatch/dispatch_data_t */
@protocol OS_dispatch_data <OS_dispatch_object>
@end
typedef NSObject<OS_dispatch_data> *dispatch_data_t;

/* https://developer.apple.com/documentation/dispatch/dispatch_block_t */
typedef void (^dispatch_block_t)(void);

/* "Specify DISPATCH_DATA_DESTRUCTOR_DEFAULT to use the default destructor":
 * the bytes are copied into storage the system manages. Defined as NULL in
 * libdispatch's <dispatch/data.h>.
 * https://developer.apple.com/documentation/dispatch/dispatch_data_destructor_default */
#define DISPATCH_DATA_DESTRUCTOR_DEFAULT NULL

/* extern dispatch_data_t dispatch_data_create(const void *buffer, size_t size,
 *     dispatch_queue_t queue, dispatch_block_t destructor);
 * queue and destructor are nullable in the SDK header.
 * https://developer.apple.com/documentation/dispatch/dispatch_data_create */
extern dispatch_data_t dispatch_data_create(const void *buffer, size_t size,
    dispatch_queue_t _Nullable queue, dispatch_block_t _Nullable destructor)
    NS_RETURNS_RETAINED;

/* extern void dispatch_release(dispatch_object_t object) OBJC_ARC_UNAVAILABLE;
 * (without ARC the SDK makes this a macro that sends -release; the argument
 * type is the same; under ARC it is an error to call it, as here)
 * https://developer.apple.com/documentation/dispatch/dispatch_release */
extern void dispatch_release(dispatch_object_t object) OBJC_ARC_UNAVAILABLE;

#pragma clang assume_nonnull end

#endif
