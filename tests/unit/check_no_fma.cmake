# Fails if the PTX of the image preprocessing kernel (-DPTX=file) has a floating-point fused
# multiply-add (fma.rn.f32 / fma.rn.f64, or mad.f32). gpu/image_preprocess_math.h writes every
# float and double operation with the _rn intrinsics so that nvcc cannot fuse them: a fused
# multiply-add rounds once where the CPU path rounds twice, and the kernel's output would then
# differ from the CPU's in the last bit. Integer mad.lo is fine.
file(READ "${PTX}" ptx)
string(REGEX MATCHALL "(fma|mad)(\\.[a-z]+)*\\.f(16|32|64)" fused "${ptx}")
if(fused)
  list(REMOVE_DUPLICATES fused)
  message(FATAL_ERROR "${PTX}: fused floating-point multiply-add in the image kernel (${fused}); "
                      "use image_math::MulF/AddF (the _rn intrinsics) for every operation")
endif()
message(STATUS "${PTX}: no fused floating-point multiply-add")
