/*
 * tests/metal_stub/Metal/Metal.h: the Metal declarations daemon/runner.m
 * uses, for type-checking it on Linux. Not Apple's header: each declaration
 * is written from Apple's documented Objective-C signature (selector,
 * argument and return types), cited beside it, and cross-checked against
 * copies of the SDK's MTLDevice.h / MTLCommandBuffer.h / MTLBlitCommandEncoder.h
 * / MTLComputeCommandEncoder.h found in public repositories.
 * Anything runner.m sends that is not declared here fails the type check.
 * See tests/metal_stub/README.md.
 */
#ifndef METAL_STUB_METAL_H
#define METAL_STUB_METAL_H

#include <Foundation/Foundation.h>

NS_ASSUME_NONNULL_BEGIN

/* ---- MTLTypes.h ---- */

/* typedef struct { NSUInteger width, height, depth; } MTLSize;
 * https://developer.apple.com/documentation/metal/mtlsize */
typedef struct {
	NSUInteger width, height, depth;
} MTLSize;

/* MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth);
 * (MTL_INLINE in the SDK)
 * https://developer.apple.com/documentation/metal/mtlsizemake(_:_:_:) */
static inline MTLSize
MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth)
{
	MTLSize size = { width, height, depth };
	return size;
}

/* ---- MTLResource.h ---- */

/* MTLStorageModeShared = 0, MTLStorageModeManaged = 1 (macOS 10.11);
 * MTLResourceStorageModeShift = 4;
 * MTLResourceStorageModeShared = MTLStorageModeShared << MTLResourceStorageModeShift
 * MTLResourceStorageModeManaged = MTLStorageModeManaged << MTLResourceStorageModeShift
 * https://developer.apple.com/documentation/metal/mtlstoragemode
 * https://developer.apple.com/documentation/metal/mtlresourceoptions/storagemodeshared
 * https://developer.apple.com/documentation/metal/mtlresourceoptions/storagemodemanaged */
typedef NS_ENUM(NSUInteger, MTLStorageMode) {
	MTLStorageModeShared = 0,
	MTLStorageModeManaged = 1
};
#define MTLResourceStorageModeShift 4
typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
	MTLResourceStorageModeShared = MTLStorageModeShared << MTLResourceStorageModeShift,
	MTLResourceStorageModeManaged = MTLStorageModeManaged << MTLResourceStorageModeShift
};

/* https://developer.apple.com/documentation/metal/mtlresource */
@protocol MTLResource <NSObject>
@end

/* ---- MTLBuffer.h ---- */

@protocol MTLBuffer <MTLResource>
/* - (void *)contents;
 * "A pointer to the shared copy of the buffer data"
 * https://developer.apple.com/documentation/metal/mtlbuffer/contents() */
- (void *)contents NS_RETURNS_INNER_POINTER;
/* - (void)didModifyRange:(NSRange)range;  (macOS 10.11)
 * "Informs the GPU that the CPU has modified a section of the buffer"
 * (managed storage only)
 * https://developer.apple.com/documentation/metal/mtlbuffer/didmodifyrange(_:) */
- (void)didModifyRange:(NSRange)range;
@end

/* ---- MTLLibrary.h ---- */

/* https://developer.apple.com/documentation/metal/mtlfunction */
@protocol MTLFunction <NSObject>
@end

@protocol MTLLibrary <NSObject>
/* - (nullable id<MTLFunction>)newFunctionWithName:(NSString *)functionName;
 * "nil if the named function isn't found in the library"
 * https://developer.apple.com/documentation/metal/mtllibrary/makefunction(name:) */
- (nullable id <MTLFunction>)newFunctionWithName:(NSString *)functionName;
@end

/* typedef NS_ENUM(NSUInteger, MTLLanguageVersion); each value is
 * (major << 16) + minor in the SDK's MTLLibrary.h. Only the versions
 * runner.m names: tinygrad's MetalCompiler pins the same ones.
 * https://developer.apple.com/documentation/metal/mtllanguageversion */
typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
	MTLLanguageVersion2_0 = (2 << 16),
	MTLLanguageVersion3_0 = (3 << 16) + 0,
	MTLLanguageVersion3_1 = (3 << 16) + 1
};

/* typedef NS_ENUM(NSInteger, MTLMathMode)  (macOS 15; MTLLibrary.h:
 * Safe = 0, Relaxed = 1, Fast = 2). Only the value runner.m names.
 * https://developer.apple.com/documentation/metal/mtlmathmode
 * https://developer.apple.com/documentation/metal/mtlmathmode/safe */
typedef NS_ENUM(NSInteger, MTLMathMode) {
	MTLMathModeSafe = 0
} API_AVAILABLE(macos(15.0));

/* typedef NS_ENUM(NSInteger, MTLMathFloatingPointFunctions)  (macOS 15;
 * MTLLibrary.h: Fast = 0, Precise = 1). Only the value runner.m names.
 * https://developer.apple.com/documentation/metal/mtlmathfloatingpointfunctions
 * https://developer.apple.com/documentation/metal/mtlmathfloatingpointfunctions/precise */
typedef NS_ENUM(NSInteger, MTLMathFloatingPointFunctions) {
	MTLMathFloatingPointFunctionsPrecise = 1
} API_AVAILABLE(macos(15.0));

/* https://developer.apple.com/documentation/metal/mtlcompileoptions */
@interface MTLCompileOptions : NSObject
/* @property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
 * "The default is the most recent language version available."
 * https://developer.apple.com/documentation/metal/mtlcompileoptions/languageversion */
@property (readwrite, nonatomic) MTLLanguageVersion languageVersion;
/* @property(readwrite, nonatomic) BOOL fastMathEnabled;
 * Deprecated in macOS 15 in favour of mathMode (which macOS 14 SDKs lack);
 * declared deprecated here so the type check proves runner.m's use of it
 * stays warning-free under -Werror.
 * https://developer.apple.com/documentation/metal/mtlcompileoptions/fastmathenabled */
@property (readwrite, nonatomic) BOOL fastMathEnabled
    __attribute__((deprecated("Use mathMode instead")));
/* @property(readwrite, nonatomic) MTLMathMode mathMode;  (macOS 15)
 * "Sets the floating-point arithmetic optimizations. Default depends on
 * the language standard version." (MTLLibrary.h); fastMathEnabled NO
 * sets it to MTLMathModeSafe.
 * https://developer.apple.com/documentation/metal/mtlcompileoptions/mathmode */
@property (readwrite, nonatomic) MTLMathMode mathMode API_AVAILABLE(macos(15.0));
/* @property(readwrite, nonatomic) MTLMathFloatingPointFunctions
 *     mathFloatingPointFunctions;  (macOS 15)
 * "The FP32 math functions Metal uses"; the default is Fast.
 * https://developer.apple.com/documentation/metal/mtlcompileoptions/mathfloatingpointfunctions
 * https://developer.apple.com/documentation/metal/mtlmathfloatingpointfunctions/fast */
@property (readwrite, nonatomic) MTLMathFloatingPointFunctions
    mathFloatingPointFunctions API_AVAILABLE(macos(15.0));
@end

/* ---- MTLComputePipeline.h ---- */

@protocol MTLComputePipelineState <NSObject>
/* @property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
 * https://developer.apple.com/documentation/metal/mtlcomputepipelinestate/maxtotalthreadsperthreadgroup */
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@end

/* ---- MTLArgument.h (reflection) ---- */

/* typedef NS_ENUM(NSInteger, MTLBindingType): MTLBindingTypeBuffer = 0,
 * ThreadgroupMemory = 1, Texture = 2, Sampler = 3, ... (macOS 11;
 * MTLArgument.h)
 * https://developer.apple.com/documentation/metal/mtlbindingtype */
typedef NS_ENUM(NSInteger, MTLBindingType) {
	MTLBindingTypeBuffer = 0,
	MTLBindingTypeThreadgroupMemory = 1,
	MTLBindingTypeTexture = 2,
	MTLBindingTypeSampler = 3
} API_AVAILABLE(macos(11.0));

/* typedef NS_ENUM(NSUInteger, MTLArgumentType): MTLArgumentTypeBuffer = 0,
 * ThreadgroupMemory = 1, Texture = 2, Sampler = 3, ... (MTLArgument.h;
 * deprecated in macOS 13 for MTLBindingType)
 * https://developer.apple.com/documentation/metal/mtlargumenttype */
typedef NS_ENUM(NSUInteger, MTLArgumentType) {
	MTLArgumentTypeBuffer = 0,
	MTLArgumentTypeThreadgroupMemory = 1,
	MTLArgumentTypeTexture = 2,
	MTLArgumentTypeSampler = 3
};

/* https://developer.apple.com/documentation/metal/mtlbinding  (macOS 13) */
@protocol MTLBinding <NSObject>
/* @property(readonly) MTLBindingType type;
 * https://developer.apple.com/documentation/metal/mtlbinding/type */
@property (readonly) MTLBindingType type;
/* @property(readonly) NSUInteger index;
 * https://developer.apple.com/documentation/metal/mtlbinding/index */
@property (readonly) NSUInteger index;
/* @property(readonly, getter=isUsed) BOOL used;
 * "A Boolean value that indicates whether the shader function uses the
 * binding"
 * https://developer.apple.com/documentation/metal/mtlbinding/isused */
@property (readonly, getter=isUsed) BOOL used;
@end

/* A binding of type MTLBindingTypeBuffer conforms to this.
 * https://developer.apple.com/documentation/metal/mtlbufferbinding  (macOS 13) */
@protocol MTLBufferBinding <MTLBinding>
/* @property(readonly) NSUInteger bufferAlignment;
 * https://developer.apple.com/documentation/metal/mtlbufferbinding/bufferalignment */
@property (readonly) NSUInteger bufferAlignment;
/* @property(readonly) NSUInteger bufferDataSize;
 * https://developer.apple.com/documentation/metal/mtlbufferbinding/bufferdatasize */
@property (readonly) NSUInteger bufferDataSize;
@end

/* Deprecated in macOS 13 for MTLBinding; what systems before 13 give.
 * https://developer.apple.com/documentation/metal/mtlargument */
@interface MTLArgument : NSObject
/* @property(readonly) MTLArgumentType type;
 * https://developer.apple.com/documentation/metal/mtlargument/type */
@property (readonly) MTLArgumentType type;
/* @property(readonly) NSUInteger index;
 * https://developer.apple.com/documentation/metal/mtlargument/index */
@property (readonly) NSUInteger index;
/* @property(readonly, getter=isActive) BOOL active;
 * "A Boolean value that indicates whether this argument is active"
 * (the function uses it)
 * https://developer.apple.com/documentation/metal/mtlargument/isactive */
@property (readonly, getter=isActive) BOOL active;
/* @property(readonly) NSUInteger bufferAlignment;  (and bufferDataSize:
 * "If the argument is not a buffer, querying this property is a fatal
 * error.")
 * https://developer.apple.com/documentation/metal/mtlargument/bufferalignment */
@property (readonly) NSUInteger bufferAlignment;
/* @property(readonly) NSUInteger bufferDataSize;
 * https://developer.apple.com/documentation/metal/mtlargument/bufferdatasize */
@property (readonly) NSUInteger bufferDataSize;
@end

/* ---- MTLComputePipeline.h (reflection) ---- */

/* https://developer.apple.com/documentation/metal/mtlcomputepipelinereflection */
@interface MTLComputePipelineReflection : NSObject
/* @property(readonly) NSArray<id<MTLBinding>> *bindings;  (macOS 13)
 * https://developer.apple.com/documentation/metal/mtlcomputepipelinereflection/bindings */
@property (readonly) NSArray<id <MTLBinding>> *bindings API_AVAILABLE(macos(13.0));
/* @property(readonly) NSArray<MTLArgument *> *arguments;
 * deprecated in macOS 13 ("Use bindings instead"), declared deprecated so
 * the type check proves runner.m suppresses it only where it must.
 * https://developer.apple.com/documentation/metal/mtlcomputepipelinereflection/arguments */
@property (readonly) NSArray<MTLArgument *> *arguments
    __attribute__((deprecated("Use bindings instead")));
@end

/* typedef MTLComputePipelineReflection * __autoreleasing
 *     MTLAutoreleasedComputePipelineReflection;
 * https://developer.apple.com/documentation/metal/mtlautoreleasedcomputepipelinereflection */
typedef MTLComputePipelineReflection * __autoreleasing
    MTLAutoreleasedComputePipelineReflection;

/* typedef NS_OPTIONS(NSUInteger, MTLPipelineOption) (MTLDevice.h):
 * ArgumentInfo = 1 << 0 (deprecated in macOS 13 for BindingInfo, the same
 * bit), BindingInfo = 1 << 0, BufferTypeInfo = 1 << 1.
 * https://developer.apple.com/documentation/metal/mtlpipelineoption
 * https://developer.apple.com/documentation/metal/mtlpipelineoption/argumentinfo */
typedef NS_OPTIONS(NSUInteger, MTLPipelineOption) {
	MTLPipelineOptionArgumentInfo
	    __attribute__((deprecated("Use MTLPipelineOptionBindingInfo"))) = 1 << 0,
	MTLPipelineOptionBindingInfo = 1 << 0,
	MTLPipelineOptionBufferTypeInfo = 1 << 1
};

/* ---- MTLCommandEncoder.h, MTLComputeCommandEncoder.h, MTLBlitCommandEncoder.h ---- */

@protocol MTLCommandEncoder <NSObject>
/* @property(nullable, copy, atomic) NSString *label;
 * "A string that labels the command encoder"; the encoder's name in a
 * failed command buffer's MTLCommandBufferEncoderInfo.
 * https://developer.apple.com/documentation/metal/mtlcommandencoder/label */
@property (nullable, copy, atomic) NSString *label;
/* - (void)endEncoding;
 * https://developer.apple.com/documentation/metal/mtlcommandencoder/endencoding() */
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
/* - (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
 * https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/setcomputepipelinestate(_:) */
- (void)setComputePipelineState:(id <MTLComputePipelineState>)state;
/* - (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
 * https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/setbytes(_:length:index:) */
- (void)setBytes:(const void *)bytes length:(NSUInteger)length
    atIndex:(NSUInteger)index;
/* - (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
 * https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/setbuffer(_:offset:index:) */
- (void)setBuffer:(nullable id <MTLBuffer>)buffer offset:(NSUInteger)offset
    atIndex:(NSUInteger)index;
/* - (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid
 *     threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
 * https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/dispatchthreadgroups(_:threadsperthreadgroup:) */
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid
    threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLBlitCommandEncoder <MTLCommandEncoder>
/* - (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer sourceOffset:(NSUInteger)sourceOffset
 *     toBuffer:(id<MTLBuffer>)destinationBuffer destinationOffset:(NSUInteger)destinationOffset
 *     size:(NSUInteger)size;
 * "In macOS, sourceOffset needs to be a multiple of 4" (likewise
 * destinationOffset and size).
 * https://developer.apple.com/documentation/metal/mtlblitcommandencoder/copy(from:sourceoffset:to:destinationoffset:size:) */
- (void)copyFromBuffer:(id <MTLBuffer>)sourceBuffer
    sourceOffset:(NSUInteger)sourceOffset
    toBuffer:(id <MTLBuffer>)destinationBuffer
    destinationOffset:(NSUInteger)destinationOffset
    size:(NSUInteger)size;
/* - (void)synchronizeResource:(id<MTLResource>)resource;  (macOS 10.11)
 * "Encodes a command that synchronizes the CPU's copy of a managed
 * resource ... with its GPU copy"
 * https://developer.apple.com/documentation/metal/mtlblitcommandencoder/synchronize(resource:) */
- (void)synchronizeResource:(id <MTLResource>)resource;
@end

/* ---- MTLCommandBuffer.h ---- */

/* https://developer.apple.com/documentation/metal/mtlcommandbufferstatus */
typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
	MTLCommandBufferStatusNotEnqueued = 0,
	MTLCommandBufferStatusEnqueued = 1,
	MTLCommandBufferStatusCommitted = 2,
	MTLCommandBufferStatusScheduled = 3,
	MTLCommandBufferStatusCompleted = 4,
	MTLCommandBufferStatusError = 5
};

/* typedef NS_ENUM(NSUInteger, MTLCommandBufferError): the code of a failed
 * command buffer's error (domain MTLCommandBufferErrorDomain). Only the
 * values runner.m names: those after which, as Apple documents them, the
 * process gets no more GPU work done. Values from the SDK's
 * MTLCommandBuffer.h (AccessRevoked = 4, the old Blacklisted;
 * NotPermitted = 7; DeviceRemoved = 11).
 * accessRevoked: "the system has revoked the Metal device's access because
 * it's responsible for too many timeouts or hangs"; notPermitted: "a
 * process doesn't have access to a GPU device"; deviceRemoved (macOS):
 * "physically removed the GPU device".
 * https://developer.apple.com/documentation/metal/mtlcommandbuffererror-swift.struct/code
 * https://developer.apple.com/documentation/metal/mtlcommandbuffererror-swift.struct/accessrevoked
 * https://developer.apple.com/documentation/metal/mtlcommandbuffererror-swift.struct/notpermitted
 * https://developer.apple.com/documentation/metal/mtlcommandbuffererror-swift.struct/code/deviceremoved */
typedef NS_ENUM(NSUInteger, MTLCommandBufferError) {
	MTLCommandBufferErrorAccessRevoked = 4,
	MTLCommandBufferErrorNotPermitted = 7,
	MTLCommandBufferErrorDeviceRemoved = 11
};

/* typedef NS_ENUM(NSInteger, MTLCommandEncoderErrorState): Unknown = 0,
 * Completed = 1, Affected = 2, Pending = 3, Faulted = 4  (macOS 11;
 * MTLCommandBuffer.h). Only the value runner.m names.
 * https://developer.apple.com/documentation/metal/mtlcommandencodererrorstate
 * https://developer.apple.com/documentation/metal/mtlcommandencodererrorstate/faulted */
typedef NS_ENUM(NSInteger, MTLCommandEncoderErrorState) {
	MTLCommandEncoderErrorStateFaulted = 4
} API_AVAILABLE(macos(11.0));

/* typedef NS_OPTIONS(NSUInteger, MTLCommandBufferErrorOption): None = 0,
 * EncoderExecutionStatus = 1 << 0  (macOS 11; MTLCommandBuffer.h). Only the
 * value runner.m names.
 * https://developer.apple.com/documentation/metal/mtlcommandbuffererroroption
 * https://developer.apple.com/documentation/metal/mtlcommandbuffererroroption/encoderexecutionstatus */
typedef NS_OPTIONS(NSUInteger, MTLCommandBufferErrorOption) {
	MTLCommandBufferErrorOptionEncoderExecutionStatus = 1 << 0
} API_AVAILABLE(macos(11.0));

/* @interface MTLCommandBufferDescriptor : NSObject <NSCopying>  (macOS 11)
 * https://developer.apple.com/documentation/metal/mtlcommandbufferdescriptor */
API_AVAILABLE(macos(11.0))
@interface MTLCommandBufferDescriptor : NSObject
/* @property(readwrite, nonatomic) MTLCommandBufferErrorOption errorOptions;
 * https://developer.apple.com/documentation/metal/mtlcommandbufferdescriptor/erroroptions */
@property (readwrite, nonatomic) MTLCommandBufferErrorOption errorOptions;
@end

/* @protocol MTLCommandBufferEncoderInfo <NSObject>  (macOS 11): one encoder
 * of a failed command buffer created with EncoderExecutionStatus.
 * https://developer.apple.com/documentation/metal/mtlcommandbufferencoderinfo */
API_AVAILABLE(macos(11.0))
@protocol MTLCommandBufferEncoderInfo <NSObject>
/* @property(readonly, nonatomic) NSString *label;
 * https://developer.apple.com/documentation/metal/mtlcommandbufferencoderinfo/label */
@property (readonly, nonatomic) NSString *label;
/* @property(readonly, nonatomic) MTLCommandEncoderErrorState errorState;
 * https://developer.apple.com/documentation/metal/mtlcommandbufferencoderinfo/errorstate */
@property (readonly, nonatomic) MTLCommandEncoderErrorState errorState;
@end

/* MTL_EXTERN NSErrorUserInfoKey const MTLCommandBufferEncoderInfoErrorKey;
 * (macOS 11): in a failed command buffer's error's userInfo, "an array of
 * MTLCommandBufferEncoderInfo" objects.
 * https://developer.apple.com/documentation/metal/mtlcommandbufferencoderinfoerrorkey */
API_AVAILABLE(macos(11.0))
extern NSErrorUserInfoKey const MTLCommandBufferEncoderInfoErrorKey;

@protocol MTLCommandBuffer <NSObject>
/* @property(readonly) CFTimeInterval GPUStartTime;  (macOS 10.15)
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/gpustarttime */
@property (readonly) CFTimeInterval GPUStartTime;
/* @property(readonly) CFTimeInterval GPUEndTime;  (macOS 10.15)
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/gpuendtime */
@property (readonly) CFTimeInterval GPUEndTime;
/* - (void)commit;
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/commit() */
- (void)commit;
/* - (void)waitUntilCompleted;
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/waituntilcompleted() */
- (void)waitUntilCompleted;
/* @property(readonly) MTLCommandBufferStatus status;
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/status */
@property (readonly) MTLCommandBufferStatus status;
/* @property(nullable, readonly) NSError *error;
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/error */
@property (nullable, readonly) NSError *error;
/* - (nullable id<MTLBlitCommandEncoder>)blitCommandEncoder;
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/makeblitcommandencoder() */
- (nullable id <MTLBlitCommandEncoder>)blitCommandEncoder;
/* - (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder;
 * "dispatches its compute commands serially" (MTLDispatchTypeSerial)
 * https://developer.apple.com/documentation/metal/mtlcommandbuffer/makecomputecommandencoder() */
- (nullable id <MTLComputeCommandEncoder>)computeCommandEncoder;
@end

/* ---- MTLCommandQueue.h ---- */

@protocol MTLCommandQueue <NSObject>
/* - (nullable id<MTLCommandBuffer>)commandBuffer;
 * Autoreleased; "maintain[s] strong references to the resources you encode
 * into it, including buffers, textures, samplers, and pipeline states."
 * https://developer.apple.com/documentation/metal/mtlcommandqueue/makecommandbuffer() */
- (nullable id <MTLCommandBuffer>)commandBuffer;
/* - (nullable id<MTLCommandBuffer>)commandBufferWithDescriptor:
 *     (MTLCommandBufferDescriptor *)descriptor;  (macOS 11)
 * https://developer.apple.com/documentation/metal/mtlcommandqueue/makecommandbuffer(descriptor:) */
- (nullable id <MTLCommandBuffer>)commandBufferWithDescriptor:
    (MTLCommandBufferDescriptor *)descriptor API_AVAILABLE(macos(11.0));
@end

/* ---- MTLDevice.h ---- */

/* https://developer.apple.com/documentation/metal/mtlgpufamily
 * (values from the SDK's MTLDevice.h: Apple1 = 1001 ... Apple9 = 1009,
 * Mac2 = 2002) */
typedef NS_ENUM(NSInteger, MTLGPUFamily) {
	MTLGPUFamilyApple1 = 1001,
	MTLGPUFamilyApple2 = 1002,
	MTLGPUFamilyApple3 = 1003,
	MTLGPUFamilyApple4 = 1004,
	MTLGPUFamilyApple5 = 1005,
	MTLGPUFamilyApple6 = 1006,
	MTLGPUFamilyApple7 = 1007,
	MTLGPUFamilyApple8 = 1008,
	MTLGPUFamilyApple9 = 1009,
	MTLGPUFamilyMac2 = 2002
};

@protocol MTLDevice <NSObject>
/* @property(nonnull, readonly) NSString *name;
 * https://developer.apple.com/documentation/metal/mtldevice/name */
@property (nonnull, readonly) NSString *name;
/* @property(readonly, getter=isLowPower) BOOL lowPower;  (macOS 10.11)
 * "A Boolean value that indicates whether a GPU device is a low-power
 * device" (on a Mac with an integrated and a discrete GPU, the integrated)
 * https://developer.apple.com/documentation/metal/mtldevice/islowpower */
@property (readonly, getter=isLowPower) BOOL lowPower;
/* @property(readonly) BOOL hasUnifiedMemory;  (macOS 10.15)
 * https://developer.apple.com/documentation/metal/mtldevice/hasunifiedmemory */
@property (readonly) BOOL hasUnifiedMemory;
/* @property(readonly) uint64_t recommendedMaxWorkingSetSize;  (macOS 10.12)
 * https://developer.apple.com/documentation/metal/mtldevice/recommendedmaxworkingsetsize */
@property (readonly) uint64_t recommendedMaxWorkingSetSize;
/* @property(readonly) NSUInteger maxBufferLength;  (macOS 10.14)
 * https://developer.apple.com/documentation/metal/mtldevice/maxbufferlength */
@property (readonly) NSUInteger maxBufferLength;
/* - (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;  (macOS 10.15)
 * https://developer.apple.com/documentation/metal/mtldevice/supportsfamily(_:) */
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
/* - (nullable id<MTLCommandQueue>)newCommandQueue;
 * "allow up to 64 uncompleted command buffers at time"
 * https://developer.apple.com/documentation/metal/mtldevice/makecommandqueue() */
- (nullable id <MTLCommandQueue>)newCommandQueue;
/* - (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length
 *     options:(MTLResourceOptions)options;
 * https://developer.apple.com/documentation/metal/mtldevice/makebuffer(length:options:) */
- (nullable id <MTLBuffer>)newBufferWithLength:(NSUInteger)length
    options:(MTLResourceOptions)options;
/* - (nullable id<MTLLibrary>)newLibraryWithData:(dispatch_data_t)data
 *     error:(__autoreleasing NSError **)error;
 * https://developer.apple.com/documentation/metal/mtldevice/makelibrary(data:) */
- (nullable id <MTLLibrary>)newLibraryWithData:(dispatch_data_t)data
    error:(__autoreleasing NSError * _Nullable * _Nullable)error;
/* - (nullable id<MTLLibrary>)newLibraryWithSource:(NSString *)source
 *     options:(nullable MTLCompileOptions *)options
 *     error:(__autoreleasing NSError **)error;
 * https://developer.apple.com/documentation/metal/mtldevice/makelibrary(source:options:) */
- (nullable id <MTLLibrary>)newLibraryWithSource:(NSString *)source
    options:(nullable MTLCompileOptions *)options
    error:(__autoreleasing NSError * _Nullable * _Nullable)error;
/* - (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:
 *     (id<MTLFunction>)computeFunction options:(MTLPipelineOption)options
 *     reflection:(MTLAutoreleasedComputePipelineReflection * __nullable)reflection
 *     error:(__autoreleasing NSError **)error;  (macOS 10.11)
 * "Synchronously creates a compute pipeline state and reflection with a
 * function instance."
 * https://developer.apple.com/documentation/metal/mtldevice/makecomputepipelinestate(function:options:reflection:) */
- (nullable id <MTLComputePipelineState>)newComputePipelineStateWithFunction:
    (id <MTLFunction>)computeFunction options:(MTLPipelineOption)options
    reflection:(MTLAutoreleasedComputePipelineReflection _Nullable * _Nullable)reflection
    error:(__autoreleasing NSError * _Nullable * _Nullable)error;
@end

/* id<MTLDevice> MTLCreateSystemDefaultDevice(void);  nullable, returns retained.
 * "In macOS, in order for the system to provide a default Metal device
 * object, you need to link to the CoreGraphics framework."
 * https://developer.apple.com/documentation/metal/mtlcreatesystemdefaultdevice() */
extern id <MTLDevice> _Nullable MTLCreateSystemDefaultDevice(void)
    NS_RETURNS_RETAINED;

/* NSArray<id<MTLDevice>> *MTLCopyAllDevices(void);  macOS only, returns retained.
 * https://developer.apple.com/documentation/metal/mtlcopyalldevices() */
extern NSArray<id <MTLDevice>> *MTLCopyAllDevices(void) NS_RETURNS_RETAINED;

NS_ASSUME_NONNULL_END

#endif
