// Host memory copies run by the staging threads.
#pragma once

#include <cstddef>

namespace ge {

// memcpy with non-temporal (streaming) stores where the CPU has them (x86-64 with AVX2), else memcpy.
// For a staged D2H drain: its destination is user memory that is not read right away, so its lines
// need no read-for-ownership and the copy does not push the caches' contents out. The stores are
// fenced before it returns: a thread that then learns the copy is done sees the bytes.
void copy_streaming(void *dst, const void *src, size_t n);

}  // namespace ge
